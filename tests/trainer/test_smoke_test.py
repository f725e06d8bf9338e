"""``--smoke-test``: any script shrunk to one step on CPU (issue 51, item 6). The one-step runs of verl's scripts
(tests/trainer/test_verl_scripts_one_step.py) go through the same shrink; here, what it does to a command line, and
the documented recipe on one of verl's stored scripts up to the start of Ray."""

import pytest

from tests.trainer.verl_scripts.harness import CURRENT_SCRIPTS_JSON, load_scripts
from verl.models.loading import DEFAULT_MODEL_PATH
from verl.trainer.smoke_test import MAX_LORA_RANK, SMOKE_TEST_OVERRIDES, smoke_test_overrides
from verl.utils.dataset.make_tiny_data import write_tiny_data

GRPO_SCRIPT = "examples/grpo_trainer/run_qwen3_8b_fsdp.sh"  # Qwen/Qwen3-8B, vLLM with TP 2, 8 GPUs, W&B


def _settings(overrides):
    """{key: value} of the last setting of each key (what Hydra applies)."""
    return {o.partition("=")[0].lstrip("+~"): o.partition("=")[2] for o in overrides}


def _script(name=GRPO_SCRIPT):
    return next(s for s in load_scripts(CURRENT_SCRIPTS_JSON) if s.name == name)


def test_the_smoke_test_replaces_the_scripts_sizes_and_hardware_and_its_model():
    script = _script()
    shrunk = smoke_test_overrides(script.overrides)
    settings = _settings(shrunk)
    keys = [o.partition("=")[0] for o in shrunk]
    assert len(keys) == len(set(keys))  # each key once: the script's 1024 prompts are gone, not shadowed
    assert settings["data.train_batch_size"] == "8" and settings["trainer.total_training_steps"] == "1"
    assert settings["trainer.logger"] == "[console,jsonl]"  # the script's W&B is gone
    # its hardware: 8 GPUs and a vLLM engine over 2 of them become one CPU rank
    assert (settings["trainer.n_gpus_per_node"], settings["trainer.device"]) == ("1", "cpu")
    assert settings["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"
    # Qwen/Qwen3-8B is no directory here: the embedded tiny model, with heads vLLM's CPU attention takes
    assert settings["actor_rollout_ref.model.path"] == str(DEFAULT_MODEL_PATH)
    assert settings["actor_rollout_ref.model.override_config.num_attention_heads"] == "2"
    # the rest is the script's own
    assert settings["actor_rollout_ref.rollout.n"] == "5" and settings["algorithm.adv_estimator"] == "grpo"
    assert "rollout.total_rollout_steps" not in settings  # only for a script that counts its run in prompts
    for override in SMOKE_TEST_OVERRIDES:
        assert override in shrunk


def test_a_model_directory_stays_and_a_lora_rank_follows_the_tiny_model(tmp_path):
    kept = _settings(
        smoke_test_overrides([f"actor_rollout_ref.model.path={tmp_path}", "rollout.total_rollout_steps=4096"])
    )
    assert kept["actor_rollout_ref.model.path"] == str(tmp_path)
    assert not any(key.startswith("actor_rollout_ref.model.override_config") for key in kept)
    assert kept["rollout.total_rollout_steps"] == "8"  # one step's worth of prompts for the fully async trainer
    lora = ["actor_rollout_ref.model.path=~/models/Qwen3-8B", "actor_rollout_ref.model.lora_rank=64"]
    lora += ["actor_rollout_ref.model.lora_adapter_path=/elsewhere/adapter"]
    swapped = _settings(smoke_test_overrides(lora))
    assert swapped["actor_rollout_ref.model.lora_rank"] == str(MAX_LORA_RANK)  # 64 -> 32
    assert swapped["actor_rollout_ref.model.lora_adapter_path"] == "null"  # the other model's adapter


@pytest.mark.filterwarnings("ignore")
def test_the_documented_recipe_starts_a_stored_verl_script(tmp_path):
    """docs/start/from_verl.md, "Smoke-test a verl script on CPU": the script's command line, then --smoke-test and
    the tiny data (after the script's own overrides, as its "$@" puts them), checked as main_ppo checks it before
    Ray starts."""
    from verl.trainer.main_ppo import CONFIG_DIR, parse_command_line, prepare

    script = _script()
    files = write_tiny_data(tmp_path / "data", num_train=64, num_test=8)
    user = ("--smoke-test", f"data.train_files={files['train']}", f"data.val_files={files['test']}")
    user += ("ray_kwargs.ray_init.runtime_env.py_executable=null",)  # the uv prefix (from_verl.md, step 2)
    typed, data, plan, resume_from = prepare(
        parse_command_line(script.argv(script.overrides + user), CONFIG_DIR, "ppo_trainer")
    )
    model = typed.actor_rollout_ref.model
    assert model.path == str(DEFAULT_MODEL_PATH) and model.override_config["max_position_embeddings"] == 65536
    assert (typed.trainer.device, typed.trainer.n_gpus_per_node, typed.trainer.logger) == (
        "cpu",
        1,
        ["console", "jsonl"],
    )
    assert (plan.train_batch_size, plan.total_training_steps, resume_from) == (8, 1, None)
    assert data.num_train_prompts == 64 and typed.data.filter_overlong_prompts  # the script's own key stays
