"""verl.utils.config.omega_conf_to_dataclass: by type, by ``_target_``, user dataclasses and verl-named sections."""

from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from verl.base_config import BaseConfig
from verl.utils import omega_conf_to_dataclass as lazy_name
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import FSDPActorConfig, FSDPOptimizerConfig


@dataclass
class Schedule(BaseConfig):
    steps: int = 10
    names: list[str] = field(default_factory=lambda: ["warmup"])


@dataclass
class Plan(BaseConfig):
    rate: float = 0.5
    schedule: Schedule = field(default_factory=Schedule)


def test_the_lazy_name_is_the_function():
    assert lazy_name is omega_conf_to_dataclass


def test_user_dataclass_by_type_keeps_its_defaults():
    plan = omega_conf_to_dataclass(OmegaConf.create({"schedule": {"steps": 3}}), Plan)
    assert isinstance(plan, Plan) and isinstance(plan.schedule, Schedule)
    assert plan.rate == 0.5 and plan.schedule.steps == 3 and plan.schedule.names == ["warmup"]
    assert plan["rate"] == 0.5 and list(plan) == ["_target_", "rate", "schedule"]


def test_user_dataclass_by_target_and_empty_configs():
    plan = omega_conf_to_dataclass({"_target_": f"{__name__}.Plan", "rate": 2.0})
    assert isinstance(plan, Plan) and plan.rate == 2.0
    assert omega_conf_to_dataclass({}, Plan) == Plan() and omega_conf_to_dataclass(None) is None
    with pytest.raises(ValueError, match="_target_"):
        omega_conf_to_dataclass({"rate": 1.0})
    with pytest.raises(ValueError, match="importable"):
        omega_conf_to_dataclass({"_target_": "no_such_module.Thing"})


def test_a_type_mismatch_is_refused():
    with pytest.raises(Exception, match="rate"):
        omega_conf_to_dataclass({"rate": "fast"}, Plan)


def test_verl_named_section_fills_the_rest_from_the_yaml():
    config = omega_conf_to_dataclass(
        OmegaConf.create(
            {
                "_target_": "verl.workers.config.FSDPActorConfig",
                "ppo_micro_batch_size_per_gpu": 3,
                "optim": {"_target_": "verl.workers.config.FSDPOptimizerConfig", "lr": 0.5},
            }
        )
    )
    assert type(config) is FSDPActorConfig and config.ppo_micro_batch_size_per_gpu == 3
    assert isinstance(config.optim, FSDPOptimizerConfig) and config.optim.lr == 0.5
    with pytest.raises(ValueError, match="optim"):
        omega_conf_to_dataclass(
            {"optim": {"_target_": f"{__name__}.Plan"}, "ppo_micro_batch_size_per_gpu": 1}, FSDPActorConfig
        )


def test_non_dataclass_target_is_instantiated():
    made = omega_conf_to_dataclass({"_target_": "collections.Counter", "a": 2})
    assert made["a"] == 2
