"""Tests for verl.utils.profiler: which steps, which ranks, which tool; torch traces on CPU (schedules, the rollout's
traces and token window); nsys calls mocked; relocation and the finish hook."""

import json
import os
import socket
from types import SimpleNamespace

import torch

from verl.utils import profiler as profiler_module
from verl.utils.profiler import RoleProfiler, StepSchedule, mini_batch, profile_windows, worker_runtime_env


def glob(tool="torch", steps=(2,), continuous=False, save_path="unused", tool_config=None, **hooks):
    return SimpleNamespace(
        tool=tool,
        steps=list(steps),
        profile_continuous_steps=continuous,
        save_path=save_path,
        global_tool_config=tool_config or {},
        **{"relocate_results": False, "finish_hook_cmd": None, "finish_hook_all_ranks": False, "finish_hook_ranks": []}
        | hooks,
    )


def section(enable=True, all_ranks=False, ranks=(0,), tool=None, save_path=None, tool_config=None, **hooks):
    inherited = dict.fromkeys(("relocate_results", "finish_hook_cmd", "finish_hook_all_ranks", "finish_hook_ranks"))
    return SimpleNamespace(
        enable=enable,
        all_ranks=all_ranks,
        ranks=list(ranks),
        tool=tool,
        save_path=save_path,
        tool_config=tool_config,
        **(inherited | hooks),
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
    # a run of 4 steps: the window 5 never opens, and 5 is not the last window: (1, 2) is
    clipped = StepSchedule(glob(steps=[1, 2, 5], continuous=True), last_step=4)
    assert clipped.windows == [(1, 2)] and clipped.is_last(2) and not clipped.is_last(1)
    # a window across the run's end closes at its last step
    assert StepSchedule(glob(steps=[3, 4, 5], continuous=True), last_step=4).windows == [(3, 4)]


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
    written = profiler.stop()  # each pass wrote its own, in the order they ran
    assert [os.path.basename(path) for path in written] == [
        "critic_rank0_step3_values.json",
        "critic_rank0_step3_update_critic.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(os.path.basename(path) for path in written)
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


def _torch(**settings):
    """A role's tool_config with torch settings: ``discrete``, ``schedule`` (a mapping), token window."""
    return {"torch": {"contents": ["cpu"], **settings}}


def _update(profiler, num_mini_batches, name="update_critic"):
    """An update pass of ``num_mini_batches`` mini-batches, each labelled and stepped as the update loop does."""
    with profiler.phase(name):
        for index in range(1, num_mini_batches + 1):
            with mini_batch(index):
                torch.ones(4).sum()


def _mini_batches(path):
    return sorted(name for name in _trace_names(path) if str(name).startswith("mini_batch"))


def test_a_discrete_schedule_keeps_the_active_mini_batches_of_the_update(tmp_path):
    # wait 1, warmup 1, active 1 (repeat 0: until the pass ends) over 7 mini-batches: a cycle is 3 mini-batches,
    # mini-batch 1 waits, 2 warms up, 3 is recorded; then 4 waits, 5 warms up, 6 is recorded; 7 waits
    schedule = {"skip_first": 0, "wait": 1, "warmup": 1, "active": 1, "repeat": 0}
    tools = _torch(discrete=True, schedule=schedule)
    profiler = RoleProfiler("critic", [section(tool_config=tools)], glob(save_path=str(tmp_path)), rank=0)
    profiler.start(1)
    with profiler.phase("values"):  # not an update pass: recorded whole, no schedule
        torch.ones(4).sum()
    _update(profiler, 7)
    written = [os.path.basename(path) for path in profiler.stop()]
    stem = "critic_rank0_step1"
    assert written == [f"{stem}_values.json", f"{stem}_update_critic_mb3.json", f"{stem}_update_critic_mb6.json"]
    assert _mini_batches(tmp_path / f"{stem}_update_critic_mb3.json") == ["mini_batch3"]
    assert _mini_batches(tmp_path / f"{stem}_update_critic_mb6.json") == ["mini_batch6"]
    assert "values" in _trace_names(tmp_path / f"{stem}_values.json")


def test_a_window_schedule_keeps_the_passes_before_the_update_and_its_first_active_mini_batches(tmp_path):
    # one trace per window: everything up to the end of mini-batch 1 is the schedule's first step; active 2 keeps
    # steps 1 and 2 (the passes before the update, mini-batches 1 and 2); repeat 0 means one cycle here
    tools = _torch(schedule={"skip_first": 0, "wait": 0, "warmup": 0, "active": 2, "repeat": 0})
    profiler = RoleProfiler("critic", [section(tool_config=tools)], glob(save_path=str(tmp_path)), rank=0)
    profiler.start(2)
    with profiler.phase("values"):
        torch.ones(4).sum()
    _update(profiler, 4)
    written = profiler.stop()
    assert [os.path.basename(path) for path in written] == ["critic_rank0_step2_mb1-2.json"]
    assert _mini_batches(written[0]) == ["mini_batch1", "mini_batch2"]
    assert {"values", "update_critic"} <= _trace_names(written[0])


def test_mini_batch_outside_a_session_does_nothing():
    with mini_batch(1):
        pass  # no profiler open in this process: a no-op, no error


def _rollout_section(ranks=(0,), **torch_settings):
    return section(ranks=ranks, tool_config=_torch(discrete=True, **torch_settings))


def test_the_rollout_writes_generation_traces_on_its_ranks_only(tmp_path):
    # the actor profiles ranks 0 and 1 (one trace per window); the rollout's discrete section names rank 0 only
    actor = section(ranks=(0, 1), tool_config=_torch())
    written = {}
    for rank in (0, 1):
        profiler = RoleProfiler(
            "actor_rollout_ref", [actor], glob(save_path=str(tmp_path)), rank=rank, rollout=_rollout_section()
        )
        profiler.start(1)
        for name in ("gen", "old_log_prob"):
            with profiler.phase(name):
                torch.ones(4).sum()
        written[rank] = [os.path.basename(path) for path in profiler.stop()]
    # rank 0: generation is the rollout's trace, out of the window's (which begins with its own first pass)
    assert written[0] == ["actor_rollout_ref_rank0_step1_gen.json", "actor_rollout_ref_rank0_step1.json"]
    assert "gen" in _trace_names(tmp_path / written[0][0])
    assert _trace_names(tmp_path / written[0][1]) >= {"old_log_prob"} and "gen" not in _trace_names(
        tmp_path / written[0][1]
    )
    # rank 1: no rollout trace; generation is a pass of the window
    assert written[1] == ["actor_rollout_ref_rank1_step1.json"]
    assert {"gen", "old_log_prob"} <= _trace_names(tmp_path / written[1][0])


def test_the_window_goes_on_in_a_part_after_a_generation_in_its_middle(tmp_path):
    # a window over steps 1-2: the second step's generation interrupts it; it resumes with the next pass
    actor = section(tool_config=_torch())
    profiler = RoleProfiler("actor_rollout_ref", [actor], glob(save_path=str(tmp_path)), 0, rollout=_rollout_section())
    profiler.start(1)
    for name in ("gen", "update_actor", "gen", "update_actor"):
        with profiler.phase(name):
            torch.ones(4).sum()
    names = [os.path.basename(path) for path in profiler.stop()]
    stem = "actor_rollout_ref_rank0_step1"
    assert names == [f"{stem}_gen.json", f"{stem}.json", f"{stem}_gen.json", f"{stem}_part2.json"]


def test_a_rollout_only_rank_records_nothing_but_generation(tmp_path):
    actor = section(enable=False)
    profiler = RoleProfiler("actor_rollout_ref", [actor], glob(save_path=str(tmp_path)), 0, rollout=_rollout_section())
    assert profiler.tool is None and profiler.generation is not None
    profiler.start(3)
    for name in ("gen", "update_actor"):
        with profiler.phase(name) as tokens:
            assert tokens is None  # no token window configured
    assert [os.path.basename(p) for p in profiler.stop()] == ["actor_rollout_ref_rank0_step3_gen.json"]


def test_a_token_window_traces_the_tokens_it_names(tmp_path):
    # tokens [2, 4): the trace opens before token 2 is produced and closes before token 4
    rollout = _rollout_section(profile_token_start=2, profile_token_end=4)
    profiler = RoleProfiler("actor_rollout_ref", [section(enable=False)], glob(save_path=str(tmp_path)), 0, rollout)
    profiler.start(1)
    with profiler.phase("gen") as tokens:
        for index in range(6):
            tokens(index)  # what the rollout calls before producing token `index`
            with torch.profiler.record_function(f"token{index}"):
                torch.ones(4).sum()
    written = profiler.stop()
    assert [os.path.basename(path) for path in written] == ["actor_rollout_ref_rank0_step1_gen.json"]
    assert sorted(n for n in _trace_names(written[0]) if str(n).startswith("token")) == ["token2", "token3"]
    # a generation that ends before token 2: nothing to trace
    profiler.start(2)
    with profiler.phase("gen") as tokens:
        tokens(0)
        tokens(1)
    assert profiler.stop() == []


def test_relocate_results_moves_this_processs_nsys_reports_into_save_path(tmp_path):
    nsight, save = tmp_path / "nsight", tmp_path / "save"
    nsight.mkdir()
    (nsight / f"worker_process_{os.getpid()}.nsys-rep").write_text("ours")
    (nsight / "worker_process_1.nsys-rep").write_text("another process's")
    for relocate, expected in ((False, []), (True, [f"worker_process_{os.getpid()}.nsys-rep"])):
        # the role's null takes global_profiler's
        settings = glob(tool="nsys", save_path=str(save), relocate_results=relocate)
        profiler = RoleProfiler("critic", [section(tool="nsys")], settings, rank=0, nsight_dir=nsight)
        profiler.start(1)  # (a window without passes: no capture range, nothing for nsys to do)
        written = profiler.stop()
        # named <role>_<host>_<report>
        assert [os.path.basename(path).removeprefix(f"critic_{socket.gethostname()}_") for path in written] == expected
    assert sorted(p.name for p in nsight.iterdir()) == ["worker_process_1.nsys-rep"]
    assert (save / os.path.basename(written[0])).read_text() == "ours"


def test_the_finish_hook_runs_once_after_the_last_window_on_its_ranks(tmp_path, caplog):
    out = tmp_path / "hook"
    command = f'echo "$VERL_PROFILE_RANK $VERL_PROFILE_ROLE $VERL_PROFILE_TOOL $VERL_PROFILE_SAVE_PATH" >> {out}'
    settings = glob(save_path=str(tmp_path / "traces"), finish_hook_cmd=command)
    # ranks [] -> the profiled ranks: rank 0 (profiled) runs it, rank 1 (not profiled) does not
    for rank in (0, 1):
        profiler = RoleProfiler("critic", [section(ranks=[0])], settings, rank=rank)
        profiler.start(1)
        profiler.stop()  # not the last window: nothing runs
        profiler.start(2)
        profiler.stop(last=True)
    assert out.read_text().splitlines() == [f"0 critic torch {tmp_path / 'traces'}"]
    # finish_hook_ranks names a rank that profiles nothing: it runs there alone
    out.unlink()
    chosen = glob(save_path="s", finish_hook_cmd=command, finish_hook_ranks=[1])
    for rank in (0, 1):
        RoleProfiler("critic", [section(ranks=[0])], chosen, rank=rank).stop(last=True)
    assert out.read_text().splitlines() == ["1 critic torch s"]
    # a failing command is logged, never raised; no section enabled: no hook at all
    failing = glob(finish_hook_cmd="echo oops; exit 3")
    RoleProfiler("critic", [section()], failing, rank=0).stop(last=True)
    assert "exited with 3" in caplog.text and "oops" in caplog.text
    RoleProfiler("critic", [section(enable=False)], glob(finish_hook_cmd=f"echo x >> {out}"), 0).stop(last=True)
    assert out.read_text().splitlines() == ["1 critic torch s"]
