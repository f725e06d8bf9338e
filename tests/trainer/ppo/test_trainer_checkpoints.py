"""The run plan in a checkpoint: ``run_plan.json`` written beside ``trainer_state.pt``, read back as plain values."""

import json

from verl.trainer.ppo.trainer_checkpoints import RUN_PLAN_FILE, read_run_plan, write_run_plan
from verl.workers.config import build_run_plan, compose_ppo_config
from verl.workers.config.plan import resolve_device


def test_run_plan_json_reads_back_the_plan_values(tmp_path):
    # 100 prompts in steps of 16 -> 6 steps an epoch, x 2 epochs = 12 steps; a KL loss needs the reference
    config = compose_ppo_config(["trainer.total_epochs=2", "actor_rollout_ref.actor.use_kl_loss=true"])
    # the plan a run saves is resolved on its cluster: trainer.device=auto on one without GPUs is cpu
    plan = resolve_device(build_run_plan(config, num_train_prompts=100), config, 0)
    path = write_run_plan(tmp_path, plan)
    assert path == tmp_path / RUN_PLAN_FILE
    values = read_run_plan(tmp_path)
    assert values["total_training_steps"] == 12 and values["total_epochs"] == 2
    assert values["train_batch_size"] == 16 and values["test_freq"] == 10
    assert values["needs_reference"] is True and values["roles"] == ["actor", "rollout", "ref"]  # JSON: a list
    assert values["device"] == "cpu" and values["megatron_optimizer"] == {}
    assert json.loads(path.read_text()) == values  # plain JSON, for people and tools


def test_config_json_reads_back_the_runs_config_and_a_damaged_one_is_named(tmp_path):
    import pytest

    from verl.trainer.ppo.trainer_checkpoints import CONFIG_FILE, read_saved_config, write_saved_config
    from verl.utils.checkpoint import CheckpointError

    assert read_saved_config(tmp_path) is None  # a checkpoint written before configs were saved
    config = compose_ppo_config(["actor_rollout_ref.actor.optim.lr=0.125", "trainer.total_training_steps=7"])
    path = write_saved_config(tmp_path, config)
    values = read_saved_config(tmp_path)
    assert path == tmp_path / CONFIG_FILE and values == json.loads(json.dumps(config.to_dict()))
    assert (
        values["actor_rollout_ref"]["actor"]["optim"]["lr"] == 0.125 and values["trainer"]["total_training_steps"] == 7
    )
    path.write_text('{"trainer": ')  # cut short
    with pytest.raises(CheckpointError, match=CONFIG_FILE):
        read_saved_config(tmp_path)
