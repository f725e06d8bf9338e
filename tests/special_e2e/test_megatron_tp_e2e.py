"""``main_ppo`` with the megatron actor and critic split over 2 CPU ranks (gloo), in tensor-parallel halves or in two
pipeline stages: one data-parallel rank whose two ranks share every batch, checkpoint shards per rank, and a resume
from them. Each run holds every role the split must carry (the PPO critic, a LoRA critic, the frozen reference), so
that one pair of runs per split covers them all."""

import re

import pytest
from safetensors.torch import load_file

from tests.special_e2e.test_main_ppo import run_main, train_records

pytestmark = pytest.mark.slow

TP2 = [
    "actor_rollout_ref.actor.strategy=megatron",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.name=naive",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "trainer.n_gpus_per_node=2",
    "trainer.test_freq=-1",
    "trainer.save_freq=2",
    "actor_rollout_ref.actor.optim.initial_loss_scale=1024",  # fp16 updates apply from the first steps
]


def test_ppo_with_a_tensor_parallel_lora_critic_trains_saves_shards_and_resumes(tmp_path):
    ppo = [o for o in TP2 if not o.startswith("algorithm.adv_estimator")] + [
        "algorithm.adv_estimator=gae",
        "critic.strategy=megatron",
        "critic.megatron.tensor_model_parallel_size=2",
        "critic.model.lora.rank=4",  # verl's megatron form: adapters split over the 2 ranks as their layers are
        # verl's checkpoint contents: the Hugging Face export only when hf_model is listed
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]
    first, out_dir = run_main(tmp_path, "trainer.total_training_steps=2", *ppo)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "MegatronPPOCritic (float32 master weights" in first.stderr
    assert "tensor parallel over 2 ranks, LoRA rank 4 on 8 layers" in first.stderr
    records = train_records(out_dir)
    assert [r["step"] for r in records] == [1, 2] and all("critic/vf_loss" in r for r in records)
    # both ranks reached the same verdicts (one rank's records come back); the scale 1024 lets updates through
    assert any(r["actor/update_failed"] == 0.0 for r in records)
    actor_dir = out_dir / "global_step_2" / "actor"
    shards = [load_file(actor_dir / f"mp_rank_{rank:02d}" / "model.safetensors") for rank in (0, 1)]
    whole = load_file(actor_dir / "model.safetensors")
    # the actor's vocabulary-parallel embedding: each rank holds half the rows, the gathered weights all of them
    key = "embedding.word_embeddings.weight"
    assert shards[0][key].shape[0] * 2 == whole[key].shape[0]
    assert (shards[0][key] == whole[key][: shards[0][key].shape[0]]).all()
    assert (actor_dir / "huggingface" / "model.safetensors").is_file()
    critic_dir = out_dir / "global_step_2" / "critic"
    shards = [load_file(critic_dir / f"mp_rank_{rank:02d}" / "model.safetensors") for rank in (0, 1)]
    whole = load_file(critic_dir / "model.safetensors")
    # the value head is whole on each rank and once in the gathered weights; the MLP's down projection is split
    assert shards[0]["output_layer.value.weight"].shape == whole["output_layer.value.weight"].shape
    key = "decoder.layers.0.mlp.linear_fc2.weight"
    assert shards[0][key].shape[1] * 2 == whole[key].shape[1]
    # its adapter's A takes the split input features too (row-parallel), rank 4
    key = "decoder.layers.0.mlp.linear_fc2.adapter.lora_A.weight"
    assert shards[0][key].shape[0] == 4 and shards[0][key].shape[1] * 2 == whole[key].shape[1]

    second, _ = run_main(tmp_path, "trainer.total_training_steps=3", *ppo)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from" in second.stderr + second.stdout
    assert [r["step"] for r in train_records(out_dir)] == [1, 2, 3]


def test_ppo_with_actor_reference_and_critic_in_two_stages_saves_a_shard_per_stage_and_resumes(tmp_path):
    ppo = [o for o in TP2 if "tensor_model_parallel_size" not in o and not o.startswith("algorithm.adv_estimator")]
    ppo += [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.use_kl_loss=true",  # the frozen reference runs in the same two stages
        "critic.strategy=megatron",
        "critic.megatron.pipeline_model_parallel_size=2",
    ]
    first, out_dir = run_main(tmp_path, "trainer.total_training_steps=2", *ppo)
    assert first.returncode == 0, first.stderr[-4000:]
    for stage in (1, 2):  # the start-up lines of both roles on both ranks
        assert re.search(rf"MegatronPPOActor \([^)]*pipeline stage {stage} of 2", first.stderr)
        assert re.search(rf"MegatronPPOCritic \([^)]*pipeline stage {stage} of 2", first.stderr)
    records = train_records(out_dir)
    assert [r["step"] for r in records] == [1, 2] and all("critic/vf_loss" in r for r in records)
    # the last stage's records came back: it holds the losses
    assert all("actor/pg_loss" in r and "actor/kl_loss" in r for r in records)
    assert any(r["actor/update_failed"] == 0.0 for r in records)
    actor_dir = out_dir / "global_step_2" / "actor"
    stages = [load_file(actor_dir / f"mp_rank_00_{stage:03d}" / "model.safetensors") for stage in (0, 1)]
    whole = load_file(actor_dir / "model.safetensors")
    layers = {int(k.split(".")[2]) for k in whole if k.startswith("decoder.layers.")}
    per_stage = [{int(k.split(".")[2]) for k in s if k.startswith("decoder.layers.")} for s in stages]
    # each stage holds half the layers under its own numbers; the gathered weights all of them
    assert per_stage[0] == per_stage[1] and 2 * len(per_stage[0]) == len(layers)
    assert "embedding.word_embeddings.weight" in stages[0] and "embedding.word_embeddings.weight" not in stages[1]
    critic_dir = out_dir / "global_step_2" / "critic"
    last = load_file(critic_dir / "mp_rank_00_001" / "model.safetensors")
    assert "output_layer.value.weight" in last  # the value head on the last stage
    assert "output_layer.value.weight" not in load_file(critic_dir / "mp_rank_00_000" / "model.safetensors")
    second, _ = run_main(tmp_path, "trainer.total_training_steps=3", *ppo)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "resumed from" in second.stderr + second.stdout
    assert [r["step"] for r in train_records(out_dir)] == [1, 2, 3]
