"""Composing the config: one mechanism for scripts and the command line, Hydra's global state left as found, and
settings that nothing reads refused against the defaults of the file the config was composed from, at load time
only (building or replacing a typed config reads no file and calls no Hydra)."""

import builtins
import io
import logging
import re
import textwrap

import pytest
import ray
from hydra import compose, initialize_config_dir
from hydra._internal.hydra import Hydra
from hydra.core.global_hydra import GlobalHydra

from verl.trainer import main_ppo
from verl.workers.config import PPOConfig, compose_omegaconf, compose_ppo_config, compose_with_defaults

OFFLOAD = "actor_rollout_ref.actor.fsdp_config.param_offload=true"
DP = "actor_rollout_ref.actor.strategy=dp"  # a backend that reads no fsdp_config (the default, fsdp, reads it)
OFFLOAD_REFUSED = r"actor_rollout_ref.actor.fsdp_config is set, but nothing reads it: it applies with .*strategy=fsdp2"


def hydra_state() -> tuple:
    """What Hydra's public API says of its process-wide state: the initialisation in force (by identity, None when
    uninitialised) and the version base."""
    from hydra.version import VersionBase

    return GlobalHydra.instance().hydra, VersionBase.instance().getbase()


def refuse(*args, **kwargs):
    raise AssertionError("validation must not compose or read files")


def test_building_and_replacing_a_config_neither_composes_nor_reads_files(monkeypatch):
    composed = compose_with_defaults()
    PPOConfig.from_omegaconf(composed.config)  # imports everything validation imports lazily
    before = hydra_state()
    monkeypatch.setattr(Hydra, "compose_config", refuse)
    monkeypatch.setattr(builtins, "open", refuse)
    monkeypatch.setattr(io, "open", refuse)
    typed = PPOConfig.from_omegaconf(composed.config)
    replaced = typed.replace(trainer=typed.trainer.replace(total_epochs=2))
    assert replaced.trainer.total_epochs == 2
    # the comparison with the defaults reads the defaults composed at load time, not the file
    assert PPOConfig.from_omegaconf(composed.config, defaults=composed.defaults) == typed
    assert hydra_state() == before


def test_composition_keeps_a_callers_hydra_initialisation(tmp_path):
    (tmp_path / "mine.yaml").write_text("answer: 42\n")
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        before = hydra_state()
        compose_ppo_config(["trainer.total_epochs=2"])
        compose_omegaconf(config_name="ppo_megatron_trainer")
        assert hydra_state()[0] is before[0] and hydra_state() == before  # the caller's Hydra object itself
        assert compose(config_name="mine").answer == 42  # still composing from the caller's folder
    assert not GlobalHydra.instance().is_initialized()


def test_composition_leaves_hydra_uninitialised_when_it_was():
    assert not GlobalHydra.instance().is_initialized()
    compose_ppo_config()
    with pytest.raises(ValueError, match="update_failure_polcy"):  # a failed composition too
        compose_omegaconf(["actor_rollout_ref.actor.update_failure_polcy=strict"])
    assert not GlobalHydra.instance().is_initialized()


def test_composition_touches_no_private_hydra_state():
    """Hydra is driven through its public API: nothing in loading.py or composition.py (where Hydra runs) names
    Hydra's singleton registry or its private modules (the test of the state it leaves is above)."""
    import inspect

    from verl.workers.config import composition, loading

    for module in (loading, composition):
        source = inspect.getsource(module)
        assert "Singleton" not in source and "_instances" not in source and "hydra._internal" not in source
    assert "initialize_config_dir" in inspect.getsource(composition)  # the module read is the one that runs Hydra


def test_inert_setting_is_refused_on_the_command_line(monkeypatch, caplog):
    monkeypatch.setattr(main_ppo, "setup_logging", lambda: None)  # it would remove caplog's handler
    with caplog.at_level(logging.ERROR, logger="verl.trainer"), pytest.raises(SystemExit) as info:
        main_ppo.cli([DP, OFFLOAD])
    assert info.value.code == main_ppo.EXIT_BAD_CONFIG
    assert not ray.is_initialized()
    (message,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert message.startswith("Bad config: ")
    assert re.search(OFFLOAD_REFUSED, message)


def test_inert_setting_is_refused_by_compose_ppo_config():
    with pytest.raises(ValueError, match=OFFLOAD_REFUSED):
        compose_ppo_config([DP, OFFLOAD])


def test_megatron_config_is_checked_against_its_own_defaults():
    composed = compose_with_defaults(config_name="ppo_megatron_trainer")
    assert composed.defaults.actor_rollout_ref.actor.strategy == "megatron"
    assert composed.validate().actor_rollout_ref.actor.strategy == "megatron"
    with pytest.raises(ValueError, match=r"fsdp_config is set, but nothing reads it: .*it trains with megatron"):
        compose_ppo_config([OFFLOAD], "ppo_megatron_trainer")


@pytest.fixture
def recipe_dir(tmp_path):
    """A recipe-style config folder: ppo_trainer.yaml with a vLLM engine key of its own (the rollout stays naive)."""
    (tmp_path / "my_recipe.yaml").write_text(
        textwrap.dedent(
            """\
            defaults:
              - ppo_trainer
              - _self_
            hydra:
              searchpath:
                - pkg://verl.trainer.config
            actor_rollout_ref:
              rollout:
                gpu_memory_utilization: 0.3
            """
        )
    )
    return tmp_path


def test_a_recipes_own_settings_are_its_defaults_not_changes(recipe_dir):
    # ppo_trainer.yaml's default is another value: compared with that file, the recipe itself would be refused
    typed = compose_ppo_config([], "my_recipe", recipe_dir)
    assert typed.actor_rollout_ref.rollout.gpu_memory_utilization == 0.3
    with pytest.raises(ValueError, match=r"rollout.gpu_memory_utilization is set, but nothing reads it"):
        compose_ppo_config(["actor_rollout_ref.rollout.gpu_memory_utilization=0.4"], "my_recipe", recipe_dir)


def test_command_line_config_path_and_name_compose_the_defaults_of_that_file(recipe_dir):
    composed = main_ppo.parse_command_line(
        ["--config-path", str(recipe_dir), "--config-name", "my_recipe", "trainer.total_epochs=2"],
        main_ppo.CONFIG_DIR,
        "ppo_trainer",
    )
    assert composed.config.trainer.total_epochs == 2
    assert composed.defaults.actor_rollout_ref.rollout.gpu_memory_utilization == 0.3
    assert composed.validate().trainer.total_epochs == 2


def test_defaults_resolve_only_where_compared(tmp_path, monkeypatch):
    # a recipe that takes its model from the environment; the user names the model instead
    monkeypatch.delenv("MY_RECIPE_MODEL_DIR", raising=False)
    (tmp_path / "env_recipe.yaml").write_text(
        textwrap.dedent(
            """\
            defaults:
              - ppo_trainer
              - _self_
            hydra:
              searchpath:
                - pkg://verl.trainer.config
            actor_rollout_ref:
              model:
                path: ${oc.env:MY_RECIPE_MODEL_DIR}
            """
        )
    )
    typed = compose_ppo_config(["actor_rollout_ref.model.path=default"], "env_recipe", tmp_path)
    assert typed.actor_rollout_ref.model.path == "default"


def test_the_embedded_layer_is_named_in_one_info_line_only_when_it_is_layered_in(caplog):
    def layered_lines(overrides):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="verl.workers.config.loading"):
            config = compose_omegaconf(overrides)
        return config, [r.getMessage() for r in caplog.records if "layered" in r.getMessage()]

    config, lines = layered_lines([])  # model.path=default: the tiny GRPO fp16 task
    assert len(lines) == 1
    assert "embedded/tiny_grpo_fp16.yaml" in lines[0] and "embedded@_global_=tiny_grpo_fp16" in lines[0]
    assert config.data.train_batch_size == 16  # the layer's value over verl's 1024
    for overrides in (["actor_rollout_ref.model.path=/models/named"], ["~embedded@_global_"]):
        config, lines = layered_lines(overrides)
        assert lines == []  # verl's defaults, nothing layered in
        assert config.data.train_batch_size == 1024
