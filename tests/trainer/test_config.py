"""The YAML configs and their typed schema: every key commented, keys and fields equal, every bad value refused."""

import functools
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from verl.workers.config import PPOConfig, compose_omegaconf, compose_ppo_config

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
    return compose_omegaconf(list(overrides), name)


def validated(overrides=(), name="ppo_trainer") -> PPOConfig:
    # validated against the file's own defaults, as the command line does: settings nothing reads are refused
    return compose_ppo_config(list(overrides), name)


def test_defaults_compose_and_validate():
    cfg = validated()
    assert cfg.actor_rollout_ref.actor.dtype == "float16"
    assert cfg.actor_rollout_ref.actor.update_failure_policy == "auto"
    assert cfg.actor_rollout_ref.rollout.response_length == cfg.data.max_response_length
    assert cfg.actor_rollout_ref.actor.optim.eps == 1e-8  # read by both optimizers, so it has its YAML key


def test_megatron_config_mirrors_the_dp_keys():
    dp, megatron = compose_config(), compose_config(name="ppo_megatron_trainer")
    assert validated(name="ppo_megatron_trainer").actor_rollout_ref.actor.strategy == "megatron"
    assert set(OmegaConf.to_container(dp.actor_rollout_ref.actor)) == set(
        OmegaConf.to_container(megatron.actor_rollout_ref.actor)
    )


def yaml_leaf_keys(node, prefix=""):
    """Dotted keys of a composed config; an ``update_failure_policy`` value (name or mapping) is one leaf."""
    keys = set()
    for key, value in node.items():
        path = f"{prefix}{key}"
        # a policy (name or mapping), an empty mapping of pass-through arguments, verl's Ascend profiler settings
        # (a mapping read by nothing here), the global profiler's per-tool settings (a mapping only the profiler
        # reads, typed Any), megatron-core's TransformerConfig overrides (a mapping checked against
        # megatron-core's dataclass), verl's SGLang arguments (a mapping) and ray_kwargs.ray_init (keyword arguments
        # of ray.init, checked against its signature) are leaves
        leaves = (
            "update_failure_policy",
            "tool_config.npu",
            "global_tool_config",
            "override_transformer_config",
            "engine_kwargs.sglang",
            "ray_kwargs.ray_init",
        )
        if isinstance(value, dict) and value and not path.endswith(leaves):
            keys |= yaml_leaf_keys(value, path + ".")
        else:
            keys.add(path)
    return keys


def field_keys(cls, prefix=""):
    """Dotted keys of the schema: every field of every nested config dataclass."""
    import dataclasses
    import typing

    from verl.workers.config import BaseConfig

    keys = set()
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        if isinstance(tp, type) and issubclass(tp, BaseConfig):
            keys |= field_keys(tp, f"{prefix}{field.name}.")
        else:
            keys.add(f"{prefix}{field.name}")
    return keys


def test_every_yaml_key_is_a_field_and_every_field_a_yaml_key():
    from verl.workers.config.reward import RewardConfig

    yaml_keys = yaml_leaf_keys(OmegaConf.to_container(compose_config()))
    # verl's reward section is typed on its own and folded into reward_model / custom_reward_function before
    # PPOConfig is built (verl.workers.config.reward)
    assert yaml_keys == field_keys(PPOConfig) | field_keys(RewardConfig, "reward.")


def test_no_config_default_lives_in_code():
    import dataclasses

    from verl.workers import config as config_pkg

    classes = [getattr(config_pkg, name) for name in config_pkg.__all__]
    for cls in classes:
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            with_defaults = [
                f.name
                for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            ]
            assert with_defaults == [], f"{cls.__name__} has defaults in code: {with_defaults}"
    # and nothing reads config keys with a fallback any more
    offenders = [p for p in (REPO / "verl").rglob("*.py") if "cfg_get(" in p.read_text() or "_cfg(" in p.read_text()]
    assert offenders == []


@pytest.mark.parametrize(("name", "strategy"), [("ppo_trainer", "fsdp"), ("ppo_megatron_trainer", "megatron")])
def test_every_trainer_yaml_builds_the_schema(name, strategy):
    cfg = validated(name=name)
    assert isinstance(cfg, PPOConfig)
    # each file picks its training backend, for the actor and the reference model alike
    assert (cfg.actor_rollout_ref.actor.strategy, cfg.actor_rollout_ref.ref.strategy) == (strategy, strategy)


def test_unknown_key_is_an_error():
    with pytest.raises(Exception, match="update_failure_polcy"):
        compose_config(["actor_rollout_ref.actor.update_failure_polcy=strict"])


@pytest.mark.parametrize(
    "override, match",
    [
        ("+trainer.totl_training_steps=5", r"trainer\.totl_training_steps is not a known config key"),
        ("+foo.bar=1", r"foo is not a known config key"),
    ],
)
def test_added_unknown_keys_are_errors_not_ignored(override, match):
    with pytest.raises(ValueError, match=match):
        validated([override])


@pytest.mark.parametrize(
    "key", ["actor_rollout_ref.model.use_fused_kernels", "actor_rollout_ref.actor.use_torch_compile"]
)
def test_verl_compile_and_fused_kernel_switches_are_accepted_both_ways(key):
    # real features on dp and fsdp2 (refused on megatron: tests/workers/actor/test_fused_and_compiled_actor.py)
    def value(cfg):
        return functools.reduce(getattr, key.split("."), cfg)

    assert value(validated([f"{key}=False"])) is False
    assert value(validated([f"{key}=True", "actor_rollout_ref.actor.strategy=fsdp2"])) is True


@pytest.mark.parametrize(
    ("value", "sinks"),
    [
        ("console", ["console"]),
        ("[console,jsonl]", ["console", "jsonl"]),
        # verl's fully async scripts: single quotes kept inside a double-quoted bash string give Hydra a string
        ("'[console,jsonl]'", ["console", "jsonl"]),
        ('\'["console", "jsonl"]\'', ["console", "jsonl"]),
    ],
)
def test_the_logger_is_a_list_or_one_name(value, sinks):
    assert validated([f"trainer.logger={value}"]).trainer.logger == sinks
    with pytest.raises(ValueError, match="unknown sink"):
        validated(["trainer.logger=consol"])


def test_policy_mapping_from_the_command_line():
    cfg = validated(
        ["actor_rollout_ref.actor.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 3}"]
    )
    assert cfg.actor_rollout_ref.actor.update_failure_policy["max_consecutive_failures"] == 3


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["data.train_batch_size=abc"], r"data.train_batch_size='abc' has the wrong type: expected int"),
        (["actor_rollout_ref.actor.optim.lr=fast"], "optim.lr='fast' has the wrong type"),
        (
            ["actor_rollout_ref.actor.strategy=fsdp9"],
            r"strategy='fsdp9' is not supported; use one of 'dp', 'fsdp', 'fsdp2', 'megatron'",
        ),
        (["actor_rollout_ref.actor.dtype=int8"], "dtype='int8' is not supported"),
        (["actor_rollout_ref.actor.dtype=fp16"], "dtype='fp16' is not supported"),  # one spelling: float16
        (["data.train_batch_size=12"], "not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=16"),
        (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"], "multiple of actor_rollout_ref.actor.ppo_micro"),
        (["actor_rollout_ref.actor.update_failure_policy=strikt"], "unknown update-outcome handler 'strikt'"),
        (
            ["critic.update_failure_policy={name: fp16_warn_and_count, max_consecutive_failures: 0}"],
            "critic.update_failure_policy",
        ),
        (["actor_rollout_ref.rollout.name=sglang"], r"rollout.name=sglang: SGLang rollouts are out of scope here"),
        (["trainer.logger=[console,mlflow]"], "trainer.logger has unknown sink"),
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
                # an explicit cpu is known before Ray starts; under the default auto the run plan refuses it
                "trainer.device=cpu",
            ],
            "use_megatron_optimizer=true needs CUDA",
        ),
        (
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            ],
            r"megatron.tensor_model_parallel_size=1 x pipeline_model_parallel_size=2 does not divide the 1 ranks",
        ),
        (
            [
                "actor_rollout_ref.actor.strategy=megatron",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "trainer.n_gpus_per_node=1",
            ],
            r"megatron.tensor_model_parallel_size=2 does not divide the 1 ranks",
        ),
        (["actor_rollout_ref.actor.recompute_old_log_prob=false"], r"recompute_old_log_prob=False is not supported"),
        # settings nothing would read: refused, with the setting that makes them apply
        (
            ["actor_rollout_ref.rollout.gpu_memory_utilization=0.5"],
            r"rollout.gpu_memory_utilization is set, but nothing reads it: it applies with .*rollout.name=vllm",
        ),
        (
            # on dp (the default backend, fsdp, reads fsdp_config)
            ["actor_rollout_ref.actor.strategy=dp", "actor_rollout_ref.actor.fsdp_config.param_offload=true"],
            r"actor.fsdp_config is set, but nothing reads it: it applies with actor_rollout_ref.actor.strategy=fsdp2",
        ),
    ],
)
def test_bad_config_fails_with_the_key_and_the_fix(overrides, match):
    with pytest.raises(ValueError, match=match):
        validated(overrides)


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
    assert validated(overrides).computes_old_log_prob is expected


def test_decisions_import_no_worker_and_the_trainer_and_workers_do_not_import_each_other():
    import subprocess
    import sys

    # A fresh interpreter: what importing the config package (and the trainer's algorithms) pulls in.
    code = (
        "import sys, verl.workers.config, verl.trainer.ppo.core_algos, verl.trainer.ppo.rollout_corr; "
        "bad = [m for m in sys.modules if m.startswith(('verl.workers.actor', 'verl.workers.critic', "
        "'verl.workers.base_worker', 'verl.trainer.main_ppo', 'verl.trainer.ppo.ray_trainer'))]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
    worker_sources = [p.read_text() for p in (REPO / "verl" / "workers").rglob("*.py")]
    trainer_imports = [
        line for src in worker_sources for line in src.splitlines() if "import" in line and "verl.trainer" in line
    ]
    # the workers use the trainer's algorithm modules (pure functions over tensors), nothing else of it
    algorithm_modules = ("verl.trainer.ppo.core_algos", "verl.trainer.ppo.rollout_corr")
    assert all(any(m in line for m in algorithm_modules) for line in trainer_imports), trainer_imports


@pytest.mark.parametrize(
    "overrides, match",
    [
        # the embedded model has 2 layers and 4 heads in 2 query groups: 4 stages or 4 tensor-parallel ranks do not fit
        (
            ["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4", "trainer.n_gpus_per_node=4"],
            r"actor_rollout_ref\.actor\.megatron\.pipeline_model_parallel_size=4: the model's 2 layers",
        ),
        (
            [
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                "+actor_rollout_ref.actor.megatron.override_transformer_config.num_layers_in_last_pipeline_stage=13",
                "trainer.n_gpus_per_node=2",
            ],
            r"override_transformer_config\.num_layers_in_last_pipeline_stage=13: the model has 2 layers",
        ),
        (
            [
                "algorithm.adv_estimator=gae",
                "critic.strategy=megatron",
                "critic.megatron.tensor_model_parallel_size=4",
                "trainer.n_gpus_per_node=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",  # the whole actor: 4 data-parallel ranks
            ],
            r"critic\.megatron\.tensor_model_parallel_size=4",
        ),
    ],
)
def test_a_megatron_layout_that_does_not_fit_the_model_is_a_bad_config_before_ray(overrides, match):
    from verl.trainer.main_ppo import check_model_path

    config = validated(["actor_rollout_ref.actor.strategy=megatron", *overrides])
    with pytest.raises(ValueError, match=match):
        check_model_path(config)
