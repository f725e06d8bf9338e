"""Tests for verl.utils.profiler: which steps, which ranks, which tool; torch traces on CPU; nsys calls mocked."""

import json
from types import SimpleNamespace

import pytest
import torch

from verl.utils import profiler as profiler_module
from verl.utils.profiler import RoleProfiler, StepSchedule, profile_windows, worker_runtime_env
from verl.workers.config import compose_ppo_config


def glob(tool="torch", steps=(2,), continuous=False, save_path="unused", tool_config=None):
    return SimpleNamespace(
        tool=tool,
        steps=list(steps),
        profile_continuous_steps=continuous,
        save_path=save_path,
        global_tool_config=tool_config or {},
    )


def section(enable=True, all_ranks=False, ranks=(0,), tool=None, save_path=None, tool_config=None):
    return SimpleNamespace(
        enable=enable, all_ranks=all_ranks, ranks=list(ranks), tool=tool, save_path=save_path, tool_config=tool_config
    )


def test_windows_by_hand():
    assert profile_windows([5, 1, 2], continuous=False) == [(1, 1), (2, 2), (5, 5)]
    # 1 and 2 are consecutive: one window; 5 alone
    assert profile_windows([5, 1, 2], continuous=True) == [(1, 2), (5, 5)]
    assert profile_windows(None, continuous=True) == []
    schedule = StepSchedule(glob(steps=[1, 2, 5], continuous=True))
    assert [s for s in range(1, 7) if schedule.starts_at(s)] == [1, 5]
    assert [s for s in range(1, 7) if schedule.stops_at(s)] == [2, 5]
    assert StepSchedule(glob(tool=None, steps=[1])).windows == []


def test_a_rank_is_profiled_only_when_its_role_asks_for_it():
    assert RoleProfiler("critic", [section(enable=False)], glob(), rank=0).tool is None
    assert RoleProfiler("critic", [section(ranks=[1])], glob(), rank=0).tool is None
    assert RoleProfiler("critic", [section(ranks=[1])], glob(), rank=1).tool == "torch"
    assert RoleProfiler("critic", [section(all_ranks=True, ranks=[])], glob(), rank=3).tool == "torch"
    # the actor worker: the reference's section alone turns it on; the role's own tool wins over the global one
    both = [section(enable=False), section(tool="nsys")]
    assert RoleProfiler("actor_rollout_ref", both, glob(), rank=0).tool == "nsys"
    idle = RoleProfiler("critic", [section(enable=False)], glob(), rank=0)
    idle.start(2)
    with idle.phase("values"):
        pass
    assert not idle.active and idle.stop() == []


def _trace_names(path):
    return {event.get("name") for event in json.loads(open(path).read())["traceEvents"]}


def test_a_torch_window_writes_one_trace_with_the_passes_labelled(tmp_path):
    profiler = RoleProfiler("actor_rollout_ref", [section()], glob(save_path=str(tmp_path)), rank=0)
    profiler.start(2)
    assert profiler.active
    with profiler.phase("update_actor"):
        torch.randn(64, 64) @ torch.randn(64, 64)
    written = profiler.stop()
    assert written == [str(tmp_path / "actor_rollout_ref_rank0_step2.json")]
    assert "update_actor" in _trace_names(written[0])
    assert not profiler.active


def test_a_discrete_torch_profiler_writes_a_trace_per_pass(tmp_path):
    discrete = {"torch": {"discrete": True, "contents": ["cpu", "shapes"]}}
    profiler = RoleProfiler("critic", [section(tool_config=discrete)], glob(save_path=str(tmp_path)), rank=0)
    profiler.start(3)
    for name in ("values", "update_critic"):
        with profiler.phase(name):
            torch.ones(8).sum()
    assert profiler.stop() == []  # nothing left open: each pass wrote its own
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "critic_rank0_step3_update_critic.json",
        "critic_rank0_step3_values.json",
    ]
    assert "values" in _trace_names(tmp_path / "critic_rank0_step3_values.json")


def test_nsys_opens_and_closes_capture_ranges_around_the_window_and_labels_passes(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.cuda.nvtx, "range", lambda name: _Recorded(calls, name))
    profiler = RoleProfiler("actor_rollout_ref", [section(tool="nsys")], glob(tool="nsys"), rank=0)
    profiler.start(1)
    with profiler.phase("gen"):
        calls.append("work")
    profiler.stop()
    assert calls == ["start", "push gen", "work", "pop gen", "stop"]
    # discrete (verl's global nsys switch): a capture range per pass
    calls.clear()
    discrete = glob(tool="nsys", tool_config={"nsys": {"discrete": True}})
    profiler = RoleProfiler("actor_rollout_ref", [section(tool="nsys")], discrete, rank=0)
    profiler.start(1)
    for name in ("gen", "ref"):
        with profiler.phase(name):
            pass
    profiler.stop()
    assert calls == ["start", "push gen", "pop gen", "stop", "start", "push ref", "pop ref", "stop"]


class _Recorded:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __enter__(self):
        self.calls.append(f"push {self.name}")

    def __exit__(self, *exc):
        self.calls.append(f"pop {self.name}")


def test_nsys_workers_run_under_nsight_with_the_users_options_over_ours():
    assert worker_runtime_env(glob(tool="torch")) == {}
    env = worker_runtime_env(glob(tool="nsys", tool_config={"nsys": {"worker_nsight_options": {"t": "cuda,nvtx"}}}))
    assert env["nsight"]["t"] == "cuda,nvtx"
    assert env["nsight"]["capture-range"] == "cudaProfilerApi"  # ours, which the windows' start/stop rely on
    assert set(profiler_module.DEFAULT_NSIGHT_OPTIONS) <= set(env["nsight"])


A = "actor_rollout_ref.actor.profiler"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([f"{A}.enable=true"], r"actor.profiler.enable=true, but global_profiler.tool is null"),
        (["global_profiler.tool=npu", "global_profiler.steps=[1]"], r"global_profiler.tool='npu' asks for Ascend"),
        (["global_profiler.tool=torch"], r"global_profiler.steps=None: list the training steps"),
        (["global_profiler.tool=vtune", "global_profiler.steps=[1]"], r"'vtune' is not a profiler here"),
        (
            ["global_profiler.tool=nsys", "global_profiler.steps=[1]", f"{A}.enable=true", "trainer.device=cpu"],
            r"tool nsys needs CUDA \(Nsight Systems captures CUDA ranges\); on CPU use global_profiler.tool=torch",
        ),
    ],
)
def test_bad_profiling_settings_fail_at_start_up(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


def test_verl_profiling_lines_start():
    config = compose_ppo_config(
        ["global_profiler.tool=torch", "global_profiler.steps=[1,2]", f"{A}.enable=true", f"{A}.ranks=[0,4]"]
    )
    assert config.global_profiler.steps == [1, 2]
    assert [key for key, _ in config.profiler_sections()["actor_rollout_ref"]][0] == A
