"""Tests for verl.workers.config.compat: verl's command-line spellings that Hydra alone would refuse here."""

from __future__ import annotations

import pytest

from verl.workers.config import compose_ppo_config
from verl.workers.config.compat import command_line_override

RO = "actor_rollout_ref.rollout"


@pytest.mark.parametrize(
    ("given", "read_as"),
    [
        # verl's "+" on a config key: add or set (our YAML may hold keys verl's leaves out)
        (f"+{RO}.moe_tensor_parallel_size=2", f"++{RO}.moe_tensor_parallel_size=2"),
        ("+trainer.use_legacy_worker_impl=disable", "++trainer.use_legacy_worker_impl=disable"),
        # already Hydra's add-or-set, a deletion, a plain key outside the open mappings: as given
        (f"++{RO}.n=2", f"++{RO}.n=2"),
        (f"~{RO}.n", f"~{RO}.n"),
        (f"{RO}.n=2", f"{RO}.n=2"),
        # group choices and Hydra's own section keep Hydra's "+"
        ("+embedded@_global_=tiny_grpo_fp16", "+embedded@_global_=tiny_grpo_fp16"),
        ("+actor@actor_rollout_ref.actor=megatron_actor", "+actor@actor_rollout_ref.actor=megatron_actor"),
        ("+ray_kwargs=default", "+ray_kwargs=default"),
        ("+hydra.job.name=x", "+hydra.job.name=x"),
        # a plain entry of an open mapping: added or set (as before)
        (f"{RO}.engine_kwargs.vllm.max_model_len=4096", f"++{RO}.engine_kwargs.vllm.max_model_len=4096"),
    ],
)
def test_command_line_override_by_hand(given, read_as):
    assert command_line_override(given) == read_as


def test_a_plus_on_a_key_the_yaml_holds_sets_it_and_an_unknown_key_is_still_refused():
    # run_qwen3_30b_a3b_megatron.sh adds it: verl's rollout YAML has no such key, ours holds its default (1)
    cfg = compose_ppo_config([f"+{RO}.moe_tensor_parallel_size=1", f"{RO}.temperature=0.5"])
    assert (cfg.actor_rollout_ref.rollout.moe_tensor_parallel_size, cfg.actor_rollout_ref.rollout.temperature) == (
        1,
        0.5,
    )
    # a "+" on a key verl's YAML defines is refused, as verl's Hydra refuses it (tests/workers/config/test_verl_keys.py)
    with pytest.raises(ValueError, match=rf"\+{RO}.temperature=\.\.\.: .* Set it without '\+'"):
        compose_ppo_config([f"+{RO}.temperature=0.5"])
    with pytest.raises(ValueError, match=rf"{RO}.moe_tensor_paralel_size is not a known config key"):
        compose_ppo_config([f"+{RO}.moe_tensor_paralel_size=1"])
