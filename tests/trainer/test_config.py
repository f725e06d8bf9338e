"""The YAML configs: every key commented, Hydra composition, and start-up validation errors."""

from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from verl.trainer.config_validation import validate_config
from verl.trainer.main_ppo import CONFIG_DIR, default_config

REPO = Path(__file__).resolve().parents[2]
YAML_FILES = sorted(p for root in ("verl/trainer/config", "examples", "recipe") for p in (REPO / root).rglob("*.yaml"))


def uncommented_keys(path: Path) -> list[str]:
    """Mapping keys whose line is not directly preceded by a comment line (or that carry no inline comment)."""
    lines = path.read_text().splitlines()
    missing = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("- ") or ":" not in stripped:
            continue
        key = stripped.split(":", 1)[0]
        if key in ("defaults",) or " " in key:
            continue
        previous = lines[i - 1].strip() if i else ""
        value = stripped.split(":", 1)[1].strip()
        is_section = value == ""
        # A section header may go without its own comment when its first child explains it; leaves may not.
        if not previous.startswith("#") and "#" not in value and not is_section:
            missing.append(f"{path.name}:{i + 1}: {key}")
    return missing


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_yaml_parses_and_every_key_is_commented(path):
    assert yaml.safe_load(path.read_text()) is not None
    assert uncommented_keys(path) == []


def compose_config(overrides=(), name="ppo_trainer"):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_defaults_compose_and_validate():
    cfg = compose_config()
    validate_config(cfg, default_config())
    assert cfg.actor_rollout_ref.actor.dtype == "float16"
    assert cfg.actor_rollout_ref.actor.update_failure_policy == "auto"
    assert cfg.actor_rollout_ref.rollout.response_length == cfg.data.max_response_length


def test_megatron_config_mirrors_the_dp_keys():
    dp, megatron = compose_config(), compose_config(name="ppo_megatron_trainer")
    validate_config(megatron, default_config())
    assert megatron.actor_rollout_ref.actor.strategy == "megatron"
    assert set(OmegaConf.to_container(dp.actor_rollout_ref.actor)) == set(
        OmegaConf.to_container(megatron.actor_rollout_ref.actor)
    )


def test_unknown_key_is_an_error():
    with pytest.raises(Exception, match="update_failure_polcy"):
        compose_config(["actor_rollout_ref.actor.update_failure_polcy=strict"])


def test_policy_mapping_from_the_command_line():
    cfg = compose_config(
        ["actor_rollout_ref.actor.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 3}"]
    )
    validate_config(cfg, default_config())
    assert cfg.actor_rollout_ref.actor.update_failure_policy.max_consecutive_failures == 3


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["data.train_batch_size=abc"], r"data.train_batch_size='abc' has the wrong type: expected int"),
        (["actor_rollout_ref.actor.optim.lr=fast"], "optim.lr='fast' has the wrong type"),
        (
            ["actor_rollout_ref.actor.strategy=fsdp9"],
            r"strategy='fsdp9' is not supported; use one of \['dp', 'megatron'\]",
        ),
        (["actor_rollout_ref.actor.dtype=int8"], "dtype='int8' is not supported"),
        (["data.train_batch_size=12"], "not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=16"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"], "multiple of actor_rollout_ref.actor.ppo_micro"),
        (["actor_rollout_ref.actor.update_failure_policy=strikt"], "unknown update-outcome handler 'strikt'"),
        (
            ["critic.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 0}"],
            "critic.update_failure_policy",
        ),
        (["actor_rollout_ref.rollout.name=vllm"], r"rollout.name='vllm' is not supported"),
        (["trainer.logger=[console,mlflow]"], "trainer.logger"),
        (["actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=0"], "ref.log_prob_micro_batch_size_per_gpu"),
        (
            ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.enable=false"],
            "use_kl_loss=true needs reference log-probs",
        ),
        (["trainer.resume_mode=resume_path"], "needs trainer.resume_from_path"),
        (["algorithm.adv_estimator=gae", "critic.enable=false"], "needs a value model"),
        (
            ["actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.actor.strategy=megatron"],
            "needs a Hugging Face actor",
        ),
        (
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.use_megatron_optimizer=true",
            ],
            "use_megatron_optimizer=true needs CUDA",
        ),
        (
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            ],
            "must be 1 in main_ppo",
        ),
    ],
)
def test_bad_config_fails_with_the_key_and_the_fix(overrides, match):
    with pytest.raises(ValueError, match=match):
        validate_config(compose_config(overrides), default_config())


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], False),  # defaults: 16 prompts per step, mini-batches of 16, one epoch -> one on-policy update
        (["actor_rollout_ref.actor.ppo_epochs=2"], True),
        (["actor_rollout_ref.actor.ppo_mini_batch_size=8"], True),  # two updates per step
        (["actor_rollout_ref.actor.recompute_old_log_prob=true"], True),
    ],
)
def test_old_log_prob_pass_runs_unless_the_step_is_one_on_policy_update(overrides, expected):
    from verl.trainer.config_validation import computes_old_log_prob

    cfg = compose_config(overrides)
    validate_config(cfg, default_config())
    assert computes_old_log_prob(cfg) is expected


def test_recompute_old_log_prob_false_is_rejected():
    cfg = compose_config(["actor_rollout_ref.actor.recompute_old_log_prob=false"])
    with pytest.raises(ValueError, match=r"recompute_old_log_prob=False is not supported; use one of \['auto', True\]"):
        validate_config(cfg, default_config())
