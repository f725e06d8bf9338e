"""Tests for verl.single_controller.decorator: the dispatch table and call plans, in-process (no Ray)."""

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller.decorator import (
    DISPATCH_TABLE,
    Dispatch,
    Execute,
    get_register_spec,
    plan_call,
    register,
)


def make_batch(num_rows: int) -> DataProto:
    return DataProto.from_dict(tensors={"x": torch.arange(num_rows)})


def spec_of(dispatch_mode, execute_mode=Execute.ALL):
    @register(dispatch_mode=dispatch_mode, execute_mode=execute_mode)
    def method(self):
        return None

    return get_register_spec(method)


def test_register_attaches_spec_and_keeps_function():
    @register(dispatch_mode=Dispatch.RANK_ZERO, blocking=False)
    def method(self, value):
        return value + 1

    spec = get_register_spec(method)
    assert (spec.dispatch_mode, spec.execute_mode, spec.blocking) == (Dispatch.RANK_ZERO, Execute.ALL, False)
    assert method(None, 1) == 2  # still a normal function inside the worker
    assert get_register_spec(lambda: None) is None


def test_register_rejects_non_enum_modes():
    with pytest.raises(ValueError, match="Dispatch member"):
        register(dispatch_mode="one_to_all")
    with pytest.raises(ValueError, match="Execute member"):
        register(execute_mode="all")


def test_every_dispatch_mode_has_a_rule():
    assert set(DISPATCH_TABLE) == set(Dispatch)


def test_one_to_all_plan():
    plan = plan_call(spec_of(Dispatch.ONE_TO_ALL), 3, (1,), {"k": 2})
    assert plan.ranks == [0, 1, 2]
    assert plan.args == [(1,)] * 3 and plan.kwargs == [{"k": 2}] * 3
    assert plan.collect(["a", "b", "c"]) == ["a", "b", "c"]


def test_all_to_all_plan_transposes_lists():
    plan = plan_call(spec_of(Dispatch.ALL_TO_ALL), 2, ([1, 2], ["a", "b"]), {"k": [True, False]})
    assert plan.args == [(1, "a"), (2, "b")]
    assert plan.kwargs == [{"k": True}, {"k": False}]


def test_all_to_all_rejects_non_list():
    with pytest.raises(ValueError, match="argument 'k' is int"):
        plan_call(spec_of(Dispatch.ALL_TO_ALL), 2, (), {"k": 3})


def test_rank_zero_plan_runs_only_rank_zero():
    plan = plan_call(spec_of(Dispatch.RANK_ZERO), 4, (7,), {})
    assert plan.ranks == [0] and plan.args == [(7,)]
    assert plan.collect(["only"]) == "only"


def test_execute_rank_zero_takes_rank_zero_share():
    plan = plan_call(spec_of(Dispatch.ALL_TO_ALL, Execute.RANK_ZERO), 2, ([5, 6],), {})
    assert plan.ranks == [0] and plan.args == [(5,)]
    assert plan.collect([42]) == 42


def test_dp_compute_proto_pads_chunks_and_unpads():
    # 5 rows on 2 ranks: padded with row 0 to 6, chunks [0, 1, 2] and [3, 4, 0].
    plan = plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (make_batch(5), "broadcast"), {})
    assert [args[0].batch["x"].tolist() for args in plan.args] == [[0, 1, 2], [3, 4, 0]]
    assert [args[1] for args in plan.args] == ["broadcast", "broadcast"]
    merged = plan.collect([args[0] for args in plan.args])
    assert merged.batch["x"].tolist() == [0, 1, 2, 3, 4]


def test_dp_compute_proto_unpads_repeated_outputs():
    # 3 rows on 2 ranks pad to 4; each rank returns every row twice (contiguous), so 8 rows come back and the
    # last 2 * 1 = 2 belong to the padding row.
    plan = plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (), {"data": make_batch(3)})
    outputs = [kwargs["data"].repeat(2, interleave=True) for kwargs in plan.kwargs]
    assert plan.collect(outputs).batch["x"].tolist() == [0, 0, 1, 1, 2, 2]


def test_dp_compute_proto_rejects_unmatched_output_rows():
    plan = plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (make_batch(3),), {})
    # 4 padded rows in, 3 out: not a whole number of output rows per input row.
    with pytest.raises(ValueError, match="not a multiple of 4"):
        plan.collect([make_batch(2), make_batch(1)])


def test_dp_compute_proto_needs_a_dataproto_of_one_length():
    with pytest.raises(ValueError, match="at least one DataProto"):
        plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (1,), {})
    with pytest.raises(ValueError, match="different lengths"):
        plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (make_batch(2), make_batch(3)), {})


def test_dp_compute_proto_lists_non_dataproto_outputs():
    plan = plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (make_batch(4),), {})
    assert plan.collect([{"loss": 1.0}, {"loss": 2.0}]) == [{"loss": 1.0}, {"loss": 2.0}]


# tensor parallelism 2 over 4 ranks: ranks 0, 1 are data-parallel rank 0 and ranks 2, 3 data-parallel rank 1
TP2_OF_4 = [(0, True), (0, False), (1, True), (1, False)]


def test_data_parallel_layout_shares_chunks_within_a_group_and_collects_once():
    # 5 rows over 2 data-parallel ranks: padded to 6, chunks [0, 1, 2] and [3, 4, 0], each to both ranks of a group
    plan = plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 4, (make_batch(5),), {}, TP2_OF_4)
    assert plan.ranks == [0, 1, 2, 3]
    assert [args[0].batch["x"].tolist() for args in plan.args] == [[0, 1, 2], [0, 1, 2], [3, 4, 0], [3, 4, 0]]
    # the non-collecting ranks' outputs are dropped: marked with 100 + row, they never appear
    outputs = [
        make_batch(3) if collects else DataProto.from_dict(tensors={"x": torch.arange(100, 103)})
        for _, collects in TP2_OF_4
    ]
    outputs[2] = DataProto.from_dict(tensors={"x": torch.tensor([3, 4, 0])})
    assert plan.collect(outputs).batch["x"].tolist() == [0, 1, 2, 3, 4]


def test_data_parallel_layout_collects_metrics_from_one_rank_per_group():
    plan = plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 4, (make_batch(4),), {}, TP2_OF_4)
    assert plan.collect(["dp0", "dp0-peer", "dp1", "dp1-peer"]) == ["dp0", "dp1"]


def test_data_parallel_layout_leaves_other_modes_alone():
    plan = plan_call(spec_of(Dispatch.ONE_TO_ALL), 4, (1,), {}, TP2_OF_4)
    assert plan.ranks == [0, 1, 2, 3] and plan.collect([1, 2, 3, 4]) == [1, 2, 3, 4]


def test_a_data_parallel_layout_without_one_collector_per_group_is_refused():
    with pytest.raises(ValueError, match="exactly one collecting rank each"):
        plan_call(spec_of(Dispatch.DP_COMPUTE_PROTO), 2, (make_batch(2),), {}, [(0, False), (0, False)])


def test_registered_methods_resolve_along_the_mro():
    from verl.single_controller.decorator import Dispatch, register, registered_methods

    class Base:
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def compute(self, data):
            return data

        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def save(self, path):
            return path

    class Plain(Base):
        def compute(self, data):  # no decorator: keeps DP_COMPUTE_PROTO
            return super().compute(data)

    class Redecorated(Plain):
        @register(dispatch_mode=Dispatch.RANK_ZERO)
        def save(self, path):
            return path

    assert {name: spec.dispatch_mode for name, spec in registered_methods(Plain).items()} == {
        "compute": Dispatch.DP_COMPUTE_PROTO,
        "save": Dispatch.ONE_TO_ALL,
    }
    assert registered_methods(Redecorated)["save"].dispatch_mode is Dispatch.RANK_ZERO
    assert registered_methods(Redecorated)["compute"].dispatch_mode is Dispatch.DP_COMPUTE_PROTO
