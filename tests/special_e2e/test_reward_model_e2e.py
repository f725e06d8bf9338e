"""``main_ppo`` with a model-based reward: a tiny sequence-classification model, built here, scores the responses
in a worker group of its own (FSDP2), and its scores are the ones the run trains on; on one rank with the responses
re-tokenised, and on two ranks with token-budget micro-batches (which the two ranks cut differently, so their
sharded forwards must still pair up) and padding-free forwards."""

import pytest

from tests.special_e2e.test_main_ppo import run_main, train_records
from tests.workers.test_reward_model import build_tiny_rm

pytestmark = pytest.mark.slow

ONE_RANK_RETOKENISED = [
    "trainer.n_gpus_per_node=1",
    "reward_model.model.input_tokenizer=default",  # the actor's tokens decoded and re-tokenised
    "reward_model.micro_batch_size_per_gpu=4",
]
TWO_RANKS_TOKEN_BUDGET = [
    "trainer.n_gpus_per_node=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "reward_model.model.input_tokenizer=null",
    "reward_model.use_dynamic_bsz=true",
    "reward_model.forward_max_token_len_per_gpu=20",
    "reward_model.model.use_remove_padding=true",
]


@pytest.mark.parametrize("layout", [ONE_RANK_RETOKENISED, TWO_RANKS_TOKEN_BUDGET], ids=["one_rank", "two_ranks"])
def test_a_run_scores_with_the_reward_model(tmp_path, layout):
    # a head of std 100: the model's scores run to tens and hundreds, outside the embedded task's rule-based [0, 1]
    reward_model = build_tiny_rm(tmp_path / "rm", head_std=100.0)
    proc, out_dir = run_main(
        tmp_path,
        "algorithm.adv_estimator=grpo",
        "critic.enable=false",
        "actor_rollout_ref.actor.strategy=dp",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "reward_model.enable=true",
        "reward_model.strategy=fsdp",
        f"reward_model.model.path={reward_model}",
        *layout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"reward model {reward_model} (fsdp, float32) on cpu" in proc.stderr
    records = train_records(out_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert all("timing_s/reward" in r for r in records)
    assert any(r["critic/score/max"] > 1.5 or r["critic/score/min"] < -0.5 for r in records)
