"""verl.utils.rollout_skip: where dumps live, which one a step replays, and which dumps are refused."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.rollout_skip import RolloutDumpMismatchError, RolloutSkip, dump_settings, prompts_fingerprint

SETTINGS = {
    "data.train_batch_size": 2,
    "data.max_prompt_length": 4,
    "data.max_response_length": 3,
    "actor_rollout_ref.model.path": "default",
    "actor_rollout_ref.rollout.n": 2,
    "actor_rollout_ref.rollout.temperature": 1.0,
}


def make_skip(tmp_path, steps=(1, 2), action="cache", settings=None, enable=True) -> RolloutSkip:
    section = SimpleNamespace(enable=enable, dump_dir=str(tmp_path), steps=list(steps), action=action)
    return RolloutSkip(section, settings or SETTINGS, "exp_proj", DataProto.load_from_disk)


def generated(seed: int, rows: int = 4) -> DataProto:
    """A batch as a rollout returns it: tensors, a non-tensor field per row, meta_info."""
    gen = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        tensors={
            "prompts": torch.randint(0, 50, (rows, 4), generator=gen),
            "responses": torch.randint(0, 50, (rows, 3), generator=gen),
            "rollout_log_probs": torch.randn(rows, 3, generator=gen),
        },
        non_tensors={"uid": np.array([f"u{seed}-{i // 2}" for i in range(rows)], dtype=object)},
        meta_info={"temperature": 1.0},
    )


def assert_same_batch(a: DataProto, b: DataProto) -> None:
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for key in a.batch.keys():
        assert torch.equal(a.batch[key], b.batch[key]), key
    assert list(a.non_tensor_batch["uid"]) == list(b.non_tensor_batch["uid"])
    assert a.meta_info == b.meta_info


def test_a_dumped_batch_loads_back_identical_with_the_step_it_came_from(tmp_path):
    skip = make_skip(tmp_path)
    batch = generated(seed=0)
    path = skip.dump(1, 0, batch, "abcd")
    assert path == tmp_path.resolve() / "exp_proj" / "1" / "gen_batch.dp"
    meta = json.loads((path.parent / "meta.json").read_text())
    assert meta["num_rows"] == 4 and meta["settings"] == SETTINGS and meta["prompts_fingerprint"] == "abcd"
    loaded, source = skip.load(1, 0, "abcd")
    assert source == 1
    assert_same_batch(loaded, batch)


def test_cache_generates_where_no_dump_is_and_ignores_unlisted_steps(tmp_path):
    skip = make_skip(tmp_path, steps=[1, 2])
    assert skip.load(1, 0, None) is None  # nothing dumped yet: generate
    skip.dump(3, 0, generated(seed=3), None)  # a dump of an unlisted step exists...
    assert not skip.covers(3) and skip.load(3, 0, None) is None  # ...but step 3 is not listed: it generates
    assert skip.load(2, 0, None) is None  # cache never substitutes another step's dump
    disabled = make_skip(tmp_path, steps=[3], enable=False)
    assert disabled.load(3, 0, None) is None


def test_repeat_replays_the_nearest_dump_in_verls_order(tmp_path):
    skip = make_skip(tmp_path, steps=[1, 2, 3, 4, 5, 6], action="repeat")
    assert skip.source_step(4) is None  # no dump at all: generate (and dump)
    for step in (2, 5):
        skip.dump(step, 0, generated(seed=step), None)
    # by hand, dumps at 2 and 5: the step's own, else the latest earlier one, else the earliest later one
    assert [skip.source_step(step) for step in (1, 2, 3, 4, 5, 6)] == [2, 2, 2, 2, 5, 5]
    loaded, source = skip.load(4, 0, "other prompts")  # a substitute's prompts differ by design: no comparison
    assert source == 2
    assert_same_batch(loaded, generated(seed=2))


def test_rounds_of_one_step_are_files_of_their_own(tmp_path):
    skip = make_skip(tmp_path, steps=[1])
    skip.dump(1, 0, generated(seed=10), None)
    assert skip.load(1, 1, None) is None  # round 1 was never dumped
    path = skip.dump(1, 1, generated(seed=11), None)
    assert path.name == "gen_batch_round1.dp" and (path.parent / "meta_round1.json").is_file()
    assert_same_batch(skip.load(1, 1, None)[0], generated(seed=11))
    assert_same_batch(skip.load(1, 0, None)[0], generated(seed=10))


def test_a_dump_without_its_meta_file_is_incomplete_and_not_replayed(tmp_path):
    skip = make_skip(tmp_path)
    batch_path, meta_path = skip.paths(1)
    skip.dump(1, 0, generated(seed=0), None)
    meta_path.unlink()  # as a dump interrupted before its last file
    assert not skip.has_dump(1) and skip.dumped_steps() == [] and skip.load(1, 0, None) is None
    assert batch_path.is_file()
    assert not list(batch_path.parent.glob(".*tmp*"))  # no temporary files were left behind


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("data.train_batch_size", 4),
        ("data.max_prompt_length", 8),
        ("actor_rollout_ref.model.path", "/models/other"),
        ("actor_rollout_ref.rollout.n", 4),
    ],
)
def test_a_dump_made_with_other_settings_is_refused_naming_the_file_and_the_difference(tmp_path, key, value):
    make_skip(tmp_path).dump(1, 0, generated(seed=0), None)
    replay = make_skip(tmp_path, settings={**SETTINGS, key: value})
    meta_path = replay.paths(1)[1]
    with pytest.raises(RolloutDumpMismatchError) as err:
        replay.load(1, 0, None)
    message = str(err.value)
    assert str(meta_path) in message
    assert f"{key}={SETTINGS[key]!r} there, {value!r} in this run" in message
    # the start-up check finds it before any step runs, with the same message
    with pytest.raises(RolloutDumpMismatchError, match="other settings"):
        replay.check_dumps()


def test_a_dump_of_other_prompts_is_refused(tmp_path):
    skip = make_skip(tmp_path)
    skip.dump(1, 0, generated(seed=0), "11111111")
    with pytest.raises(RolloutDumpMismatchError, match="other prompts .*fingerprint 11111111 there, 22222222 now"):
        skip.load(1, 0, "22222222")


def test_a_batch_file_that_does_not_match_its_meta_file_is_refused(tmp_path):
    skip = make_skip(tmp_path)
    skip.dump(1, 0, generated(seed=0, rows=4), None)
    generated(seed=1, rows=6).save_to_disk(skip.paths(1)[0])  # replaced behind the meta file's back
    with pytest.raises(RolloutDumpMismatchError, match="holds 6 rows, its meta.json says 4"):
        skip.load(1, 0, None)


@pytest.mark.parametrize("content", ["not json", json.dumps({"format": "other", "version": 1})])
def test_an_unreadable_or_foreign_meta_file_is_refused(tmp_path, content):
    skip = make_skip(tmp_path)
    skip.dump(1, 0, generated(seed=0), None)
    skip.paths(1)[1].write_text(content)
    with pytest.raises(RolloutDumpMismatchError, match="meta"):
        skip.check_dumps()


def test_dumps_live_per_experiment_under_the_expanded_dump_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    section = SimpleNamespace(enable=True, dump_dir="~/dumps", steps=[2, 1, 2], action="cache")
    skip = RolloutSkip(section, SETTINGS, "e_p", DataProto.load_from_disk)
    assert skip.dump_root == tmp_path.resolve() / "dumps" / "e_p"
    assert skip.steps == [1, 2]


def test_prompts_fingerprint_tells_prompts_apart():
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    assert prompts_fingerprint(ids) == prompts_fingerprint(ids.clone())
    assert prompts_fingerprint(ids) != prompts_fingerprint(ids.flip(0))
    assert prompts_fingerprint(ids) != prompts_fingerprint(ids.reshape(3, 2))  # same bytes, other shape


def test_dump_settings_reads_the_keys_a_replay_must_share():
    config = SimpleNamespace(
        data=SimpleNamespace(train_batch_size=2, max_prompt_length=4, max_response_length=3),
        actor_rollout_ref=SimpleNamespace(
            model=SimpleNamespace(path="default"), rollout=SimpleNamespace(n=2, temperature=1.0)
        ),
    )
    assert dump_settings(config) == SETTINGS
