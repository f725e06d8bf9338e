"""``main_ppo`` with ``strategy=fsdp2`` on two CPU ranks (gloo): actor, reference and critic sharded with FSDP2,
a sharded checkpoint, and a resume from it that continues exactly as the uninterrupted run did."""

import pytest
import torch
from safetensors.torch import load_file

from tests.special_e2e.test_main_ppo import comparable, run_main, train_records

pytestmark = pytest.mark.slow

FSDP2 = [
    "actor_rollout_ref.actor.strategy=fsdp2",
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # 4 prompts x n=2 = 8 samples, 4 per rank
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.adv_estimator=gae",  # a critic on FSDP2 too
    "actor_rollout_ref.actor.use_kl_loss=true",  # and the frozen reference
    # scales at which fp16 updates apply from the first step, so that the checkpoint carries real state
    "actor_rollout_ref.actor.optim.initial_loss_scale=1024",
    "critic.optim.initial_loss_scale=1024",
    "trainer.test_freq=-1",
    "trainer.save_freq=2",
    "trainer.total_training_steps=3",
]


def test_fsdp2_run_saves_shards_and_resumes_exactly(tmp_path):
    straight, straight_dir = run_main(tmp_path, *FSDP2, name="straight")
    assert straight.returncode == 0, straight.stderr[-4000:]
    records = train_records(straight_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["actor/update_failed"] == 0.0 and r["critic/update_failed"] == 0.0 for r in records)
    assert records[0]["actor/kl_loss"] == 0.0  # the reference starts as the actor
    step2 = straight_dir / "global_step_2"
    for role in ("actor", "critic"):
        shards = sorted(p.name for p in (step2 / role / "sharded").iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"], role  # each rank wrote its own
    assert (step2 / "actor" / "huggingface" / "config.json").is_file()

    resumed, resumed_dir = run_main(
        tmp_path,
        *FSDP2,
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={step2}",
        name="resumed",
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    # a fresh directory that holds only step 3's row: the run started from step 2's checkpoint
    assert [r["step"] for r in train_records(resumed_dir)] == [3]
    # step 3 after the resume is step 3 of the uninterrupted run: scores, losses, counters, loss scales, weights
    assert [comparable(r) for r in train_records(resumed_dir)] == [comparable(records[-1])]
    for role in ("actor", "critic"):
        want = load_file(straight_dir / "global_step_3" / role / "model.safetensors")
        got = load_file(resumed_dir / "global_step_3" / role / "model.safetensors")
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), role
