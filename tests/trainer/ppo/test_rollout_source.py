"""The one-step-off rollout source, driven against stand-in worker groups that keep Ray's ordering rule.

A real Ray worker runs the calls it receives one after another, in the order they were made; the stand-in rollout
group does the same with a queue (each call runs when something waits for it or for a later call), so the versions
the batches are sampled with follow from the order of the driver's calls alone, as they do on Ray.
"""

import time
from collections import deque

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.rollout_source import AsyncRollout
from verl.workers.rollout.partial import WEIGHT_VERSION_KEY


class _Loader:
    """Prompt batches 0, 1, 2, ... (a batch's ``index`` says which), with a position to save and restore."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        batch = DataProto.from_dict(tensors={"index": torch.full((2,), self.position)})
        self.position += 1
        return batch

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class _Pending:
    def __init__(self, group, call_id):
        self.group, self.call_id = group, call_id

    def unfinished_ranks(self, timeout_s):
        # a call runs when waited for: a look without waiting (0 s) finds it finished only if it has run already; a
        # wait runs the queue up to it and finds it late when that took longer than the wait's bound
        if self.group.hangs:
            return [0]
        if timeout_s == 0:
            return [] if self.call_id in self.group.results else [0]
        start = time.perf_counter()
        self.group.run_through(self.call_id)
        return [0] if time.perf_counter() - start > timeout_s else []

    def get(self):
        return self.group.run_until(self.call_id)


class _RolloutGroup:
    """Runs its calls in submission order, each when something waits for it (or for a later call)."""

    def __init__(self, gen_seconds=0.0):
        self.queue = deque()
        self.results = {}
        self.next_id = 0
        self.version = None  # no weights until the first load_weights
        self.gen_seconds = gen_seconds
        self.log = []
        self.hangs = False

    def generation_timeout(self, rank, timeout_s):
        from verl.single_controller.results import GenerationTimeoutError

        return GenerationTimeoutError("rollout", rank, "node-a", "10.0.0.1", f"no result {timeout_s:g} s after")

    def submit(self, method, *args):
        self.queue.append((self.next_id, method, args))
        self.next_id += 1
        return _Pending(self, self.next_id - 1)

    def run_through(self, call_id):
        while call_id not in self.results:
            cid, method, args = self.queue.popleft()
            self.results[cid] = getattr(self, "_" + method)(*args)

    def run_until(self, call_id):
        self.run_through(call_id)
        return self.results.pop(call_id)

    def _load_weights(self, weights, version):
        self.version = version
        self.log.append(("load", version))

    _stage_weights = _load_weights  # the stand-in has no generation in progress to switch in the middle of

    def _generate_sequences(self, prompts):
        assert self.version is not None, "generated before any weights arrived"
        time.sleep(self.gen_seconds)
        rows = len(prompts)
        self.log.append(("gen", int(prompts.batch["index"][0]), self.version))
        out = DataProto.from_dict(
            tensors={
                "index": prompts.batch["index"],
                "response_mask": torch.ones(rows, 3, dtype=torch.long),
                WEIGHT_VERSION_KEY: torch.full((rows, 3), self.version),
            }
        )
        out.meta_info["metrics"] = {"timing_s/gen": [self.gen_seconds]}
        return out


class _ActorGroup:
    def __init__(self):
        self.exports = 0

    def export_weights(self):
        self.exports += 1
        return [{"w": torch.zeros(1)}, None]

    def add_log_probs(self, generated):
        generated.meta_info["metrics"] = {}
        return generated


@pytest.fixture(autouse=True)
def _no_object_store(monkeypatch):
    monkeypatch.setattr("verl.trainer.ppo.rollout_source.ray.put", lambda value: value)


def run_steps(source, applied, train_seconds=0.0):
    """The trainer's loop: per step, take the next prompts, get their samples, 'train', report the update.
    Returns per step (prompt batch index, staleness metrics)."""
    source.start()
    steps = []
    for was_applied in applied:
        timing = {}
        step_start = time.perf_counter()
        prompts = source.next_prompts()
        batch = source.generate(prompts, timing)
        time.sleep(train_seconds)
        metrics = source.batch_metrics(batch, time.perf_counter() - step_start, timing["wait_prev_gen"])
        metrics.update(source.after_update(was_applied))
        steps.append((int(batch.batch["index"][0]), metrics))
    return steps


def test_one_step_off_trains_on_batch_t_sampled_by_the_weights_of_update_t_minus_1():
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=1.0)
    steps = run_steps(source, applied=[True] * 4)
    # batches are trained in order 0, 1, 2, 3
    assert [index for index, _ in steps] == [0, 1, 2, 3]
    # batch 0 is sampled by version 0 and trained at version 0 (nothing trained yet): staleness 0. Batch t >= 1 is
    # launched when batch t-1 is taken, before update t-1 lands, so it is sampled by version t-1 and trained at
    # version t: staleness 1.
    assert [m["fully_async/staleness/max"] for _, m in steps] == [0.0, 1.0, 1.0, 1.0]
    assert [entry for entry in rollout.log if entry[0] == "gen"][:4] == [
        ("gen", 0, 0),
        ("gen", 1, 0),
        ("gen", 2, 1),
        ("gen", 3, 2),
    ]
    # each applied update sends weights (plus the first send at start): versions 1..4 after the steps
    assert [m["fully_async/count/current_param_version"] for _, m in steps] == [1.0, 2.0, 3.0, 4.0]
    # 2 rows per batch, rollout_n 1: three stale batches of 2 rows = 6 samples and 6 trajectories
    assert steps[-1][1]["fully_async/count/stale_samples_processed"] == 6.0
    assert steps[-1][1]["fully_async/count/stale_trajectory_processed"] == 6.0


def test_a_skipped_update_sends_no_weights_and_keeps_the_version():
    rollout, actor = _RolloutGroup(), _ActorGroup()
    source = AsyncRollout(rollout, actor, _Loader(), staleness_threshold=1.0)
    steps = run_steps(source, applied=[False, False, True, False, True])
    # one export at start, then one per applied update (steps 3 and 5)
    assert actor.exports == 3
    assert [m["timing_s/sync_rollout_weights"] > 0 for _, m in steps] == [False, False, True, False, True]
    # the version moves only on applied updates; batches sampled before any update are not stale
    assert [m["fully_async/count/current_param_version"] for _, m in steps] == [0.0, 0.0, 1.0, 1.0, 2.0]
    # batch 3 was launched when batch 2 was taken (version 0) and is trained at version 1: stale by 1
    assert [m["fully_async/staleness/max"] for _, m in steps] == [0.0, 0.0, 0.0, 1.0, 0.0]


def test_with_no_batch_ahead_every_batch_is_sampled_by_the_latest_weights():
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=0.0)
    steps = run_steps(source, applied=[True] * 4)
    assert [m["fully_async/staleness/max"] for _, m in steps] == [0.0] * 4
    assert [entry[2] for entry in rollout.log if entry[0] == "gen"] == [0, 1, 2, 3]


@pytest.mark.parametrize("gen_seconds, train_seconds", [(0.05, 0.0), (0.0, 0.05)], ids=["slow-rollout", "slow-trainer"])
def test_staleness_never_exceeds_one_under_a_slow_side(gen_seconds, train_seconds):
    source = AsyncRollout(_RolloutGroup(gen_seconds), _ActorGroup(), _Loader(), staleness_threshold=1.0)
    steps = run_steps(source, applied=[True] * 6, train_seconds=train_seconds)
    assert max(m["fully_async/staleness/max"] for _, m in steps) == 1.0
    idle = [m["trainer/idle_ratio"] for _, m in steps[1:]]
    # the stand-in generates only when waited on, so the trainer always waits out the generation: with a slow
    # rollout it is idle most of the step, with a slow trainer (0.05 s of training, no generation time) hardly
    assert all(0.0 <= value <= 1.0 for value in idle)
    if gen_seconds > train_seconds:
        assert min(idle) > 0.5
    else:
        assert max(idle) < 0.5


def test_a_checkpoint_saves_where_each_batch_in_flight_was_drawn():
    loader = _Loader()
    source = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=1.0)
    run_steps(source, applied=[True, True])
    # batches 0 and 1 were trained, batches 2 and 3 are in flight (one step off: two batches a version, one of
    # them waiting at each sync): the loader has handed out 4 batches; the checkpoint keeps that position and the
    # positions 2 and 3 the batches in flight were drawn at, so that a resumed run generates them again
    assert loader.position == 4
    assert source.loader_state() == {"position": 4}
    state = source.state_dict()
    assert state["version"] == 2
    assert state["in_flight_positions"] == [{"position": 2}, {"position": 3}]

    resumed = AsyncRollout(_RolloutGroup(), _ActorGroup(), _Loader(), staleness_threshold=1.0)
    resumed.train_loader.load_state_dict(source.loader_state())
    resumed.load_state_dict(state)
    steps = run_steps(resumed, applied=[True])
    # the first batch after the resume is batch 2, sampled by the checkpoint's weights (version 2): not stale
    assert steps[0][0] == 2
    assert steps[0][1]["fully_async/staleness/max"] == 0.0
    assert steps[0][1]["fully_async/count/current_param_version"] == 3.0
    # the stale counts carry on: batch 1 was stale (2 rows), nothing since
    assert steps[0][1]["fully_async/count/stale_samples_processed"] == 2.0


def test_rollouter_idle_ratio_is_the_share_of_time_not_generating():
    source = AsyncRollout(_RolloutGroup(gen_seconds=0.0), _ActorGroup(), _Loader(), staleness_threshold=1.0)
    steps = run_steps(source, applied=[True] * 3, train_seconds=0.02)
    # no generation time at all: the rollout group was idle the whole time
    assert all(np.isclose(m["rollouter/idle_ratio"], 1.0) for _, m in steps)


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="staleness_threshold must be >= 0"):
        AsyncRollout(_RolloutGroup(), _ActorGroup(), _Loader(), staleness_threshold=-1.0)
    with pytest.raises(ValueError, match="trigger_parameter_sync_step >= 1"):
        AsyncRollout(_RolloutGroup(), _ActorGroup(), _Loader(), trigger_parameter_sync_step=0)


def test_fully_async_syncs_every_trigger_steps_and_bounds_the_batches_per_version():
    # threshold 0.5, a sync every 2 steps: floor(1.5 x 2) = 3 batches per version. Version 0 starts batches 0-2;
    # steps 1-2 train batches 0-1 and sync (version 1), with batch 2 still waiting, so version 1 may start
    # 3 - 1 = 2 batches (3, 4); steps 3-4 train batch 2 (stale: version 0 at version 1) and batch 3, and sync
    # (version 2) with batch 4 waiting: batches 5, 6 by version 2; and so on.
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=0.5, trigger_parameter_sync_step=2)
    steps = run_steps(source, applied=[True] * 6)
    assert [index for index, _ in steps] == [0, 1, 2, 3, 4, 5]
    # (the stand-in runs a call when it is waited for: batch 6, started at the last sync, never ran)
    generated = [entry[1:] for entry in rollout.log if entry[0] == "gen"]
    assert generated == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 2)]
    # waiting after step 6: batch 6 (started by version 2) and batches 7, 8 (version 3's budget: 3 less the one
    # waiting); the next two steps train 6 (stale) and 7 (not)
    assert len(source.in_flight) == 3
    rollout.log.clear()
    source.generate(source.next_prompts(), {})
    source.generate(source.next_prompts(), {})
    assert [entry[1:] for entry in rollout.log if entry[0] == "gen"] == [(6, 2), (7, 3)]
    assert [m["fully_async/staleness/max"] for _, m in steps] == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    # a sync (and its transfer) only at the end of each window of 2 steps
    assert [m["timing_s/sync_rollout_weights"] > 0 for _, m in steps] == [False, True] * 3
    assert [m["fully_async/count/current_param_version"] for _, m in steps] == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]


def test_threshold_0_with_several_updates_per_sync_samples_each_window_by_its_version():
    # floor(1 x 3) = 3 batches per version: each window's 3 batches are started after the previous sync
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=0.0, trigger_parameter_sync_step=3)
    steps = run_steps(source, applied=[True] * 6)
    assert [entry[2] for entry in rollout.log if entry[0] == "gen"][:6] == [0, 0, 0, 1, 1, 1]
    assert [m["fully_async/staleness/max"] for _, m in steps] == [0.0] * 6


def test_token_versions_give_each_response_its_oldest_version_and_its_span():
    from verl.trainer.ppo.rollout_source import token_version_range

    # row 0: versions 3, 3, 4 over its three tokens (cut by a switch): oldest 3, span 1. Row 1: version 3, then its
    # padding (mask 0) carries version 5, which does not count: oldest 3, newest 3. Row 2: no token at all: its
    # first column's version, 2.
    batch = DataProto.from_dict(
        tensors={
            WEIGHT_VERSION_KEY: torch.tensor([[3, 3, 4], [3, 5, 5], [2, 2, 2]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]]),
        }
    )
    oldest, newest = token_version_range(batch)
    assert oldest.tolist() == [3, 3, 2]
    assert newest.tolist() == [4, 3, 2]


def test_a_rollout_rank_that_never_returns_stops_the_run_naming_it():
    from verl.single_controller.results import GenerationTimeoutError, WorkerDiedError

    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), wait_timeout_s=0.5)
    source.start()
    rollout.hangs = True
    with pytest.raises(GenerationTimeoutError) as info:
        source.generate(source.next_prompts(), {})
    # a death-like error: main_ppo's restart rule (trainer.max_restarts) covers it
    assert isinstance(info.value, WorkerDiedError)
    assert str(info.value).startswith("worker rollout rank 0 on node node-a (10.0.0.1) returned no samples in time")


def test_no_batch_is_started_past_the_last_step_of_the_run():
    # 4 steps to train, one step off: batches 0-3 are started and trained, and nothing is left generating
    loader = _Loader()
    source = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=1.0)
    source.start(steps_to_train=4)
    for _ in range(4):
        source.generate(source.next_prompts(), {})
        source.after_update(True)
    assert loader.position == 4 and not source.in_flight


def _train(source, loader, num_steps, extra_round_at=None):
    """The trainer's loop, with DAPO's extra round at step ``extra_round_at``: prompts drawn from the loader itself
    and generated at once (the trainer's ``generate_more``). Returns the batch indices trained, in order."""
    trained = []
    for step in range(num_steps):
        batch = source.generate(source.next_prompts(), {})
        trained.append(int(batch.batch["index"][0]))
        if step == extra_round_at:
            trained.append(int(source.generate(next(loader), {}).batch["index"][0]))
        source.after_update(True)
    return trained


def test_a_resume_after_an_extra_round_trains_what_the_uninterrupted_run_trains():
    # Uninterrupted: batches 0 and 1 start; step 1 trains 0, draws 2 for its extra round, and starts 3 after its
    # update; then 1, 3, 4 follow. Resumed after step 1: 1 and 3 must be drawn again from their own positions (1 and
    # 3); drawing on from 1 would start 1 and 2, and batch 2, already trained, would come back as step 3's batch.
    loader = _Loader()
    source = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=1.0)
    source.start()
    uninterrupted = _train(source, loader, 4, extra_round_at=0)
    assert uninterrupted == [0, 2, 1, 3, 4]

    loader = _Loader()
    first = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=1.0)
    first.start()
    before_save = _train(first, loader, 1, extra_round_at=0)
    data_position, state = first.loader_state(), first.state_dict()
    loader = _Loader()
    loader.load_state_dict(data_position)
    resumed = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=1.0)
    resumed.load_state_dict(state)
    resumed.start()
    assert before_save + _train(resumed, loader, 3) == uninterrupted


def _generated(rollout):
    return [entry[1:] for entry in rollout.log if entry[0] == "gen"]


def test_a_resume_in_the_middle_of_a_sync_window_keeps_the_staleness_rule():
    # threshold 1, a sync every 2 steps: floor(2 x 2) = 4 batches per version. Uninterrupted: version 0 starts
    # batches 0-3; step 2 syncs (version 1) with 2 and 3 waiting, so version 1 starts 4 - 2 = 2 batches (4, 5);
    # step 4 syncs (version 2) and starts 6, 7. Staleness: 0, 0, then 1 (2, 3 by version 0 at version 1; 4, 5 by
    # version 1 at version 2).
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=1.0, trigger_parameter_sync_step=2)
    steps = run_steps(source, applied=[True] * 6)
    assert [m["fully_async/staleness/max"] for _, m in steps] == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert _generated(rollout) == [(0, 0), (1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]

    # saved after step 1, mid-window: 1, 2, 3 in flight and nothing left to start in version 0. The resumed run
    # starts those three again and no fourth: with a full version's budget it started batch 4 by version 0, which
    # step 5 trained at version 2 (staleness 2).
    loader = _Loader()
    first = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=1.0, trigger_parameter_sync_step=2)
    run_steps(first, applied=[True])
    data_position, state = first.loader_state(), first.state_dict()
    assert state["may_start"] == 0 and len(state["in_flight_positions"]) == 3
    rollout, loader = _RolloutGroup(), _Loader()
    loader.load_state_dict(data_position)
    resumed = AsyncRollout(rollout, _ActorGroup(), loader, staleness_threshold=1.0, trigger_parameter_sync_step=2)
    resumed.load_state_dict(state)
    after = run_steps(resumed, applied=[True] * 5)
    assert [index for index, _ in after] == [1, 2, 3, 4, 5]
    assert [m["fully_async/staleness/max"] for _, m in after] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert _generated(rollout) == [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1)]


def test_a_run_resumed_with_more_steps_after_it_ended_starts_the_budget_its_end_left():
    # 3 steps, sync every 2, threshold 0 (2 batches a version): version 1 may start 2 batches at step 2's sync,
    # but the run has 1 step left, so it starts batch 2 only and saves a budget of 1 with nothing in flight after
    # step 3. Resumed for 1 more step, it starts that 1 batch (3), as the longer run would have.
    loader = _Loader()
    first = AsyncRollout(_RolloutGroup(), _ActorGroup(), loader, staleness_threshold=0.0, trigger_parameter_sync_step=2)
    first.start(steps_to_train=3)
    for _ in range(3):
        first.generate(first.next_prompts(), {})
        first.after_update(True)
    state = first.state_dict()
    assert state["in_flight_positions"] == [] and state["may_start"] == 1
    loader2 = _Loader()
    loader2.load_state_dict(first.loader_state())
    resumed = AsyncRollout(
        _RolloutGroup(), _ActorGroup(), loader2, staleness_threshold=0.0, trigger_parameter_sync_step=2
    )
    resumed.load_state_dict(state)
    resumed.start(steps_to_train=1)
    assert int(resumed.generate(resumed.next_prompts(), {}).batch["index"][0]) == 3


def test_a_sync_queued_behind_a_generation_nobody_took_yet_is_not_waited_for():
    # threshold 2: floor(3 x 1) = 3 batches per version, so at a sync two batches are still queued before it. The
    # trainer must not wait for the previous sync (it sits behind a batch it has not asked for): each step runs
    # exactly the generation of the batch it trains, in order, with versions 0, 0, 0, 1, 2, ...
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=2.0)
    generated_by_step = []
    source.start()
    for _ in range(5):
        source.generate(source.next_prompts(), {})
        source.after_update(True)
        generated_by_step.append(len(_generated(rollout)))
    assert generated_by_step == [1, 2, 3, 4, 5]
    assert _generated(rollout) == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 2)]
    # the syncs whose generation came: read (their errors raised); the rest still pending
    assert len(source._syncs) <= 3


def test_a_threshold_too_small_for_a_whole_batch_ahead_is_said_at_start_up(caplog):
    # verl's fully async example: floor(1.1 x 4) = 4 batches per version, the window itself; 0.25 x 4 = 1 goes ahead
    with caplog.at_level("WARNING", logger="verl.trainer.ppo.rollout_source"):
        quiet = AsyncRollout(_RolloutGroup(), _ActorGroup(), _Loader(), 0.25, trigger_parameter_sync_step=4)
        assert quiet.batches_per_version == 5 and not caplog.records
        AsyncRollout(_RolloutGroup(), _ActorGroup(), _Loader(), staleness_threshold=0.1, trigger_parameter_sync_step=4)
    assert "never generates ahead of a sync" in caplog.text and "staleness_threshold >= 0.25" in caplog.text


def test_an_extra_round_queued_behind_the_batches_in_flight_is_bounded_on_its_own():
    # threshold 2: batches 1 and 2 are in flight when step 1's extra round (DAPO) is queued behind them. Each
    # generation takes 0.2 s against a bound of 0.5 s: the whole queue (0.6 s) is longer than the bound, no single
    # generation is, so nothing may be reported late.
    loader = _Loader()
    source = AsyncRollout(_RolloutGroup(gen_seconds=0.2), _ActorGroup(), loader, 2.0, wait_timeout_s=0.5)
    source.start()
    assert _train(source, loader, 1, extra_round_at=0) == [0, 3]


def test_validation_answers_with_the_last_syncs_weights_and_says_which():
    # a sync every 2 steps: after step 1 the rollout group holds version 0 and misses step 1's applied update; after
    # step 2 it holds version 1, the trainer's
    rollout = _RolloutGroup()
    source = AsyncRollout(rollout, _ActorGroup(), _Loader(), staleness_threshold=0.5, trigger_parameter_sync_step=2)
    run_steps(source, applied=[True])
    prompts = DataProto.from_dict(tensors={"index": torch.full((2,), 100)})
    output, metrics = source.validation_samples(prompts)
    assert metrics == {"val/weight_version": 0.0, "val/steps_behind": 1.0}
    assert int(output.batch["index"][0]) == 100 and output.batch[WEIGHT_VERSION_KEY].max().item() == 0
    source.generate(source.next_prompts(), {})
    source.after_update(True)
    output, metrics = source.validation_samples(prompts)
    assert metrics == {"val/weight_version": 1.0, "val/steps_behind": 0.0}
    assert output.batch[WEIGHT_VERSION_KEY].max().item() == 1
