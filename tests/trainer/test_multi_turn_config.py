"""``actor_rollout_ref.rollout.multi_turn`` and ``rollout.agent``: verl's agent-loop keys accepted with their
meaning, and what stays out refused by name before any worker starts."""

import pytest

from verl.workers.config import compose_ppo_config
from verl.workers.config.registries import tool_parser_names

R = "actor_rollout_ref.rollout"
MT = f"{R}.multi_turn"


def test_verls_agent_loop_keys_are_accepted():
    config = compose_ppo_config(
        [
            f"{MT}.enable=true",
            f"{MT}.tool_config_path=verl/tools/configs/calculator_tool.yaml",
            f"{MT}.function_tool_path=my_tools.py",
            f"{MT}.format=hermes",
            f"{MT}.max_assistant_turns=3",
            f"{MT}.max_tool_response_length=64",
            f"{MT}.tool_response_truncate_side=left",
            f"{R}.agent.num_workers=2",
            f"{R}.agent.default_agent_loop=tool_agent",
            f"{R}.agent.agent_loop_config_path=loops.yaml",
        ]
    )
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.multi_turn.enable, rollout.multi_turn.function_tool_path) == (True, "my_tools.py")
    assert (rollout.agent.num_workers, rollout.agent.default_agent_loop) == (2, "tool_agent")
    assert rollout.agent.agent_loop_config_path == "loops.yaml"


def test_the_defaults_are_verls():
    rollout = compose_ppo_config([]).actor_rollout_ref.rollout
    assert (rollout.multi_turn.enable, rollout.multi_turn.function_tool_path, rollout.multi_turn.format) == (
        False,
        None,
        "hermes",
    )
    assert (rollout.agent.default_agent_loop, rollout.agent.agent_loop_config_path) == ("single_turn_agent", None)


def test_the_format_names_are_the_registered_parsers():
    # verl's formats that the agent loops parse
    assert {"hermes", "qwen3_coder", "kimi", "gpt-oss"} <= set(tool_parser_names())


def test_an_unused_format_is_not_checked_while_multi_turn_is_off():
    # verl reads multi_turn.* only when enabled; its scripts may leave another format there
    assert compose_ppo_config([f"{MT}.format=llama3_json"]).actor_rollout_ref.rollout.multi_turn.format == "llama3_json"


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            [f"{MT}.enable=true", f"{MT}.format=llama3_json"],
            rf"{MT}\.format=.llama3_json. is not supported.*hermes.*registered tool parsers",
        ),
        (
            [f"{MT}.interaction_config_path=chat.yaml"],
            rf"{MT}\.interaction_config_path is set, but verl's interactions",
        ),
        ([f"{MT}.tool_response_truncate_side=top"], rf"{MT}\.tool_response_truncate_side"),
        ([f"{MT}.max_parallel_calls=0"], rf"{MT}\.max_parallel_calls"),
        ([f"{R}.agent.default_agent_loop=''"], rf"{R}\.agent\.default_agent_loop is empty"),
        (
            [f"{MT}.enable=true", "actor_rollout_ref.hybrid_engine=false"],
            rf"{MT}\.enable=true runs the agent loops on the actor workers' rollout",
        ),
        (
            [f"{MT}.enable=true", "skip.rollout.enable=true", "skip.rollout.steps=[1]"],
            r"skip\.rollout\.enable=true: replayed rollouts",
        ),
        ([f"{MT}.enable=true", f"{R}.name=sglang"], rf"{R}\.name=sglang: SGLang rollouts are out of scope"),
    ],
)
def test_what_stays_out_is_refused_by_name(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)
