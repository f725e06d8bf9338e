"""The agent-loop surface: the registry and its config-path loader, the output's tensor form, the trajectory
labels, the config path lookup, the server-manager protocol and the single-turn loop."""

import asyncio
import subprocess
import sys

import pytest
import torch

import verl.experimental.agent_loop.agent_loop as agent_loop_module
from verl.experimental.agent_loop import (
    AgentLoopMetrics,
    AgentLoopOutput,
    ServerManager,
    SingleTurnAgentLoop,
    ToolAgentLoop,
    get_agent_loop_class,
    get_trajectory_info,
    instantiate_agent_loop,
    load_agent_loop_config,
    register,
)
from verl.experimental.agent_loop.utils import resolve_config_path

from .tiny_chat import EchoAgentLoop, ScriptedServer, make_loop, tiny_tokenizer, trainer_config

ECHO_TARGET = "tests.experimental.agent_loop.tiny_chat.EchoAgentLoop"
PROMPT = [{"role": "user", "content": "What is 2+3?"}]


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry, so that a test's registrations do not outlive it."""
    copy = dict(agent_loop_module._agent_loop_registry)
    monkeypatch.setattr(agent_loop_module, "_agent_loop_registry", copy)
    return copy


def test_builtin_loops_are_registered_under_verls_names(registry):
    assert registry["single_turn_agent"] == {
        "_target_": "verl.experimental.agent_loop.single_turn_agent_loop.SingleTurnAgentLoop"
    }
    assert get_agent_loop_class("single_turn_agent") is SingleTurnAgentLoop
    assert get_agent_loop_class("tool_agent") is ToolAgentLoop


def test_unknown_name_lists_the_registered_ones(registry):
    with pytest.raises(ValueError, match=r"'react'.*\['single_turn_agent', 'tool_agent'\]"):
        get_agent_loop_class("react")


def test_register_decorator_records_the_dotted_path(registry):
    decorated = register("echo_decorated")(EchoAgentLoop)
    assert decorated is EchoAgentLoop
    assert registry["echo_decorated"] == {"_target_": ECHO_TARGET}
    assert get_agent_loop_class("echo_decorated") is EchoAgentLoop


def test_config_path_loader_registers_entries_with_their_options(registry, tmp_path):
    path = tmp_path / "loops.yaml"
    path.write_text(f"- name: echo\n  _target_: {ECHO_TARGET}\n  greeting: hello\n")
    assert load_agent_loop_config(str(path)) == ["echo"]
    assert registry["echo"] == {"_target_": ECHO_TARGET, "greeting": "hello"}
    wrap = trainer_config()
    loop = instantiate_agent_loop("echo", trainer_config=wrap, server_manager=None, tokenizer=tiny_tokenizer())
    assert isinstance(loop, EchoAgentLoop) and loop.greeting == "hello"
    # a keyword given at instantiation wins over the file's option
    loop = instantiate_agent_loop("echo", trainer_config=wrap, server_manager=None, tokenizer=None, greeting="yo")
    assert loop.greeting == "yo"


@pytest.mark.parametrize(
    "text, message",
    [
        ("name: echo\n", "is a list"),
        (f"- _target_: {ECHO_TARGET}\n", "entry 0 needs a `name`"),
        ("- name: echo\n", "entry 0 needs a `name` and a `_target_`"),
    ],
)
def test_config_path_loader_refuses_malformed_files(registry, tmp_path, text, message):
    path = tmp_path / "loops.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_agent_loop_config(str(path))


def test_a_target_that_is_not_a_loop_is_refused(registry, tmp_path):
    registry["not_a_loop"] = {"_target_": "collections.OrderedDict"}
    with pytest.raises(TypeError, match="not an AgentLoopBase subclass"):
        get_agent_loop_class("not_a_loop")


def test_resolve_config_path_looks_in_the_working_directory_only_below_it(tmp_path, monkeypatch):
    (tmp_path / "loops.yaml").write_text("[]\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("loops.yaml") == str(tmp_path / "loops.yaml")
    assert resolve_config_path("/abs/never/checked.yaml") == "/abs/never/checked.yaml"
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        resolve_config_path("missing.yaml")
    (tmp_path.parent / "outside.yaml").write_text("[]\n")
    with pytest.raises(FileNotFoundError):  # climbing out of the working directory is not followed
        resolve_config_path("../outside.yaml")


def test_as_dict_gives_verls_tensor_form():
    output = AgentLoopOutput(
        prompt_ids=[1, 2],
        response_ids=[3, 4, 5],
        response_mask=[1, 0, 1],
        response_logprobs=[-0.5, 0.0, -0.25],
        reward_score=1.5,
        num_turns=3,
        metrics=AgentLoopMetrics(),
        extra_fields={"tool_rewards": [1.0], "teacher_ids": [9]},
    )
    data = output.as_dict()
    assert data["prompts"].tolist() == [1, 2] and data["prompts"].dtype == torch.int64
    assert data["responses"].tolist() == [3, 4, 5]
    assert data["response_mask"].tolist() == [1, 0, 1]
    assert data["rollout_log_probs"].dtype == torch.float32
    assert data["rollout_log_probs"].tolist() == [-0.5, 0.0, -0.25]
    assert data["rm_scores"].tolist() == [0.0, 0.0, 1.5]  # the score sits on the last response position
    assert data["teacher_ids"] == [9] and data["extra_fields"] == {"tool_rewards": [1.0]}


def test_trajectory_info_counts_rollouts_of_one_index():
    info = asyncio.run(get_trajectory_info(3, [7, 7, 9], False))
    # rows 0 and 1 share index 7: rollout_n 0 then 1; row 2 starts index 9 at 0
    assert [row["rollout_n"] for row in info] == [0, 1, 0]
    assert info[2] == {"step": 3, "sample_index": 9, "rollout_n": 0, "validate": False}


def test_the_scripted_server_meets_the_protocol():
    assert isinstance(ScriptedServer(tiny_tokenizer(), []), ServerManager)


def test_single_turn_returns_the_sample_as_sampled():
    tokenizer = tiny_tokenizer()
    a, b = tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("b")
    sample = [a, b] + tokenizer.encode("c<|im_end|>", add_special_tokens=False)  # 4 ids
    loop, server = make_loop(SingleTurnAgentLoop, [sample], response_length=3)
    output = asyncio.run(loop.run({"temperature": 1.0}, raw_prompt=PROMPT))
    expected_prompt = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert output.prompt_ids == tokenizer.encode(expected_prompt, add_special_tokens=False)
    # response_length=3: the server is asked for 3 tokens and returns [a, b, c], never re-tokenised to [ab, c]
    assert server.calls[0]["params"] == {"temperature": 1.0, "max_tokens": 3}
    assert output.response_ids == [a, b, tokenizer.convert_tokens_to_ids("c")]
    assert output.response_mask == [1, 1, 1]
    assert output.response_logprobs == [ScriptedServer.logprob(0, i) for i in range(3)]
    assert output.num_turns == 2 and output.metrics.num_preempted == 0
    assert output.extra_fields["tool_rewards"] == [] and output.extra_fields["num_tool_calls"] == 0
    assert output.extra_fields["global_steps"] == 0


def test_single_turn_cuts_a_long_prompt_from_the_left_and_refuses_media():
    tokenizer = tiny_tokenizer()
    loop, _ = make_loop(SingleTurnAgentLoop, ["x"], prompt_length=5)
    output = asyncio.run(loop.run({}, raw_prompt=PROMPT))
    full = tokenizer.encode(tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True))
    assert output.prompt_ids == full[-5:]
    image_prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]
    with pytest.raises(NotImplementedError, match="multimodal prompts"):
        asyncio.run(loop.run({}, raw_prompt=image_prompt))


def test_importing_the_package_pulls_no_ray_hydra_or_pil():
    code = (
        "import sys, verl.experimental.agent_loop; "
        "print(sorted(m for m in ('ray', 'hydra', 'PIL') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
