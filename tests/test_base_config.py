"""verl.base_config.BaseConfig: the mapping view and the fixed fields of user config dataclasses."""

import dataclasses
from typing import ClassVar

import pytest

from verl.base_config import BaseConfig


@dataclasses.dataclass
class Budget(BaseConfig):
    _mutable_fields: ClassVar[set[str]] = {"tokens"}
    tokens: int = 100
    name: str = "run"


def test_reads_like_a_mapping():
    budget = Budget(tokens=5)
    assert budget["tokens"] == 5 and budget.get("name") == "run" and budget.get("absent", 1) == 1
    # _target_ (a field of the base) + tokens + name
    assert len(budget) == 3 and list(budget) == ["_target_", "tokens", "name"]
    assert "name" in budget and 3 not in budget
    with pytest.raises(TypeError):
        budget[0]


def test_fields_are_fixed_unless_mutable():
    budget = Budget()
    budget.tokens = 7
    assert budget.tokens == 7
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.name = "other"
    budget.note = "free"  # not a field: allowed, as in verl
    assert budget.note == "free"
