"""skip.rollout in the colocated trainer: a first run dumps, a second replays without generating.

The actor workers are a stand-in that counts its calls: ``generate_with_log_probs`` samples responses from a
generator that never repeats itself (so a replayed batch can only be the dumped one), ``add_log_probs`` computes
the old log-probs from the responses (as the real workers compute them from the current weights).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.rollout_source import ColocatedRollout
from verl.trainer.ppo.skip_rollout import RECOMPUTED_KEYS, ReplayingRollout, colocated_rollout
from verl.utils.rollout_skip import RolloutDumpMismatchError, RolloutSkip

N = 2  # responses per prompt


class FakeActorWorkers:
    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.num_generate = 0
        self.num_add_log_probs = 0

    def generate_with_log_probs(self, prompts: DataProto) -> DataProto:
        self.num_generate += 1
        rows = len(prompts) * N
        batch = DataProto.from_dict(
            tensors={
                "prompts": prompts.batch["input_ids"].repeat_interleave(N, dim=0),
                "responses": torch.randint(0, 1000, (rows, 3), generator=self.gen),
            },
            non_tensors={"uid": np.repeat(prompts.non_tensor_batch["uid"], N)},
            meta_info={"temperature": 1.0},
        )
        return self._with_log_probs(batch, {"timing_s/gen": 1.0})

    def add_log_probs(self, generated: DataProto) -> DataProto:
        self.num_add_log_probs += 1
        return self._with_log_probs(generated, {})

    @staticmethod
    def _with_log_probs(batch: DataProto, timing: dict) -> DataProto:
        batch.batch["old_log_probs"] = -batch.batch["responses"].float() / 1000
        batch.batch["ref_log_prob"] = -batch.batch["responses"].float() / 2000
        batch.meta_info["metrics"] = [{**timing, "timing_s/old_log_prob": 0.5}]
        return batch


class Loader:
    """Prompt batches of 2 prompts; batch k holds token ids k*10 .. k*10+7 (the same on every run)."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        ids = torch.arange(8).reshape(2, 4) + self.position * 10
        self.position += 1
        return DataProto.from_dict(tensors={"input_ids": ids})


def config(tmp_path, steps=(1, 2), action="cache", enable=True, batch_size=2):
    return SimpleNamespace(
        skip=SimpleNamespace(
            rollout=SimpleNamespace(enable=enable, dump_dir=str(tmp_path), steps=list(steps), action=action)
        ),
        trainer=SimpleNamespace(experiment_name="exp", project_name="proj"),
        data=SimpleNamespace(train_batch_size=batch_size, max_prompt_length=4, max_response_length=3),
        actor_rollout_ref=SimpleNamespace(
            model=SimpleNamespace(path="default"), rollout=SimpleNamespace(n=N, temperature=1.0)
        ),
    )


def run(source, num_steps: int, rounds: int = 1) -> tuple[list[DataProto], list[dict]]:
    """What the trainer does with its rollout source: per step, prompts, ``rounds`` generations, metrics."""
    batches, metrics = [], []
    for step in range(1, num_steps + 1):
        source.step = step
        prompts = source.next_prompts()
        for _ in range(rounds):
            batches.append(source.generate(prompts, {}))
            prompts = next(source.train_loader)  # DAPO's extra round draws more prompts
        metrics.append(source.batch_metrics(batches[-1], 1.0, 0.0))
    return batches, metrics


def make_source(tmp_path, workers, **kwargs):
    source = colocated_rollout(workers, Loader(), config(tmp_path, **kwargs), lambda: source.step)
    source.start(steps_to_train=None)
    return source


def test_skip_disabled_is_the_plain_colocated_rollout(tmp_path):
    source = colocated_rollout(FakeActorWorkers(0), Loader(), config(tmp_path, enable=False), lambda: 1)
    assert type(source) is ColocatedRollout


def test_a_replay_gives_the_dumped_batches_and_never_generates(tmp_path):
    first_workers = FakeActorWorkers(seed=0)
    first, first_metrics = run(make_source(tmp_path, first_workers), num_steps=3)
    assert first_workers.num_generate == 3  # steps 1 and 2 generate and dump; step 3 is not listed
    dumped = DataProto.load_from_disk(tmp_path.resolve() / "exp_proj" / "1" / "gen_batch.dp")
    assert not set(RECOMPUTED_KEYS) & set(dumped.batch.keys()) and "metrics" not in dumped.meta_info
    assert [m["rollout_skip/dumped"] for m in first_metrics] == [1.0, 1.0, 0.0]

    replay_workers = FakeActorWorkers(seed=1)  # another generator: a generated batch could never equal a dumped one
    replay, replay_metrics = run(make_source(tmp_path, replay_workers), num_steps=3)
    assert replay_workers.num_generate == 1  # step 3 only
    assert replay_workers.num_add_log_probs == 2  # the log-probs of the replayed steps come from the workers
    for step in (0, 1):
        for key in ("prompts", "responses", *RECOMPUTED_KEYS):
            assert torch.equal(replay[step].batch[key], first[step].batch[key]), key
        assert list(replay[step].non_tensor_batch["uid"]) == list(first[step].non_tensor_batch["uid"])
    assert not torch.equal(replay[2].batch["responses"], first[2].batch["responses"])  # step 3 generated anew
    assert [m["rollout_skip/replayed"] for m in replay_metrics] == [1.0, 1.0, 0.0]
    assert [m["rollout_skip/num_replayed_steps"] for m in replay_metrics] == [1.0, 2.0, 2.0]
    assert [m["rollout_skip/dumped"] for m in replay_metrics] == [0.0, 0.0, 0.0]


def test_every_round_of_a_step_is_dumped_and_replayed(tmp_path):
    first, _ = run(make_source(tmp_path, FakeActorWorkers(seed=0), steps=[1]), num_steps=1, rounds=2)
    workers = FakeActorWorkers(seed=1)
    replay, metrics = run(make_source(tmp_path, workers, steps=[1]), num_steps=1, rounds=2)
    assert workers.num_generate == 0
    assert [torch.equal(a.batch["responses"], b.batch["responses"]) for a, b in zip(first, replay)] == [True, True]
    assert metrics[0]["rollout_skip/num_replayed_steps"] == 1.0  # two rounds, one step


def test_repeat_replays_one_dump_on_every_listed_step(tmp_path):
    first, _ = run(make_source(tmp_path, FakeActorWorkers(seed=0), steps=[1]), num_steps=1)
    workers = FakeActorWorkers(seed=1)
    replay, metrics = run(make_source(tmp_path, workers, steps=[1, 2, 3], action="repeat"), num_steps=3)
    assert workers.num_generate == 0
    assert all(torch.equal(batch.batch["responses"], first[0].batch["responses"]) for batch in replay)
    assert metrics[-1]["rollout_skip/num_replayed_steps"] == 3.0


def test_a_dump_of_another_batch_size_stops_the_run_before_the_first_step(tmp_path):
    run(make_source(tmp_path, FakeActorWorkers(seed=0)), num_steps=1)
    workers = FakeActorWorkers(seed=1)
    source = colocated_rollout(workers, Loader(), config(tmp_path, batch_size=4), lambda: 1)
    with pytest.raises(RolloutDumpMismatchError, match=r"meta.json .*data.train_batch_size=2 there, 4 in this run"):
        source.start()
    assert workers.num_generate == 0


def test_a_replay_of_other_prompts_is_refused(tmp_path):
    run(make_source(tmp_path, FakeActorWorkers(seed=0)), num_steps=1)
    source = make_source(tmp_path, FakeActorWorkers(seed=1))
    next(source.train_loader)  # the loader is one batch further than in the dumping run
    with pytest.raises(RolloutDumpMismatchError, match="other prompts"):
        run(source, num_steps=1)


def test_the_replayed_count_survives_a_resume(tmp_path):
    skip = RolloutSkip.from_config(config(tmp_path), DataProto.load_from_disk)
    source = ReplayingRollout(FakeActorWorkers(0), Loader(), skip, lambda: 1)
    source.num_replayed_steps = 2
    resumed = ReplayingRollout(FakeActorWorkers(0), Loader(), skip, lambda: 1)
    resumed.load_state_dict(source.state_dict())
    assert resumed.num_replayed_steps == 2
    resumed.load_state_dict({})  # a checkpoint of a run without skip
    assert resumed.num_replayed_steps == 0
