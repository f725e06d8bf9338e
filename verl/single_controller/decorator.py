"""The ``@register`` decorator and the dispatch table that turn one driver call into per-rank calls.

A worker method decorated with ``@register(dispatch_mode=...)`` carries a :class:`RegisterSpec`; the worker group
reads it to split the driver's arguments into one set per rank (dispatch), to decide which ranks run
(execute), and to merge the per-rank results back into one value (collect). Every dispatch mode is one row of
``DISPATCH_TABLE``: a dispatch function ``(world_size, args, kwargs) -> (per-rank args, per-rank kwargs,
context)`` and a collect function ``(outputs, context) -> result``. Nothing here knows about Ray, so the table is
testable in-process.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto

REGISTER_ATTR = "__verl_register_spec__"


class Dispatch(enum.Enum):
    """How the driver's arguments are split across ranks and how the results come back."""

    ONE_TO_ALL = "one_to_all"  # same arguments to every rank; result is the list of per-rank outputs
    ALL_TO_ALL = "all_to_all"  # every argument is a list with one entry per rank; result is the list of outputs
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto arguments are padded and chunked, one chunk per rank
    RANK_ZERO = "rank_zero"  # only rank 0 runs, with the arguments as given; result is its output


class Execute(enum.Enum):
    """Which ranks run the method once the arguments are dispatched."""

    ALL = "all"
    RANK_ZERO = "rank_zero"  # only rank 0 runs, with its share of the dispatched arguments; its output is returned


@dataclass(frozen=True)
class RegisterSpec:
    """Metadata that ``@register`` attaches to a worker method."""

    dispatch_mode: Dispatch
    execute_mode: Execute
    blocking: bool
    concurrency_group: str | None = None


@dataclass(frozen=True)
class DispatchRule:
    """One row of the dispatch table; ``rank_zero_only`` means the dispatch yields arguments for rank 0 alone."""

    dispatch: Callable[[int, tuple, dict], tuple[list[tuple], list[dict], Any]]
    collect: Callable[[list, Any], Any]
    rank_zero_only: bool = False


def register(
    dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    concurrency_group: str | None = None,
) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable from the worker group with the given dispatch and execute modes.

    The method itself is returned unchanged (it still runs normally inside the worker); only a
    :class:`RegisterSpec` is attached to it.

    Args:
        dispatch_mode: how arguments are split across ranks and results merged (see :class:`Dispatch`).
        execute_mode: which ranks run the method (see :class:`Execute`).
        blocking: when False, the group method returns a pending result whose ``get()`` waits and collects.
        concurrency_group: run the method on a thread of its own (a Ray concurrency group of one thread, named
            so), beside the calls of the default group: it must not touch what those calls use, except through a
            lock. None: calls to a worker run one after another, in the order they were made.

    Raises:
        ValueError: when a mode is not a member of its enum.
    """
    if not isinstance(dispatch_mode, Dispatch):
        accepted = [m.name for m in Dispatch]
        raise ValueError(f"dispatch_mode must be a Dispatch member {accepted}, got {dispatch_mode!r}.")
    if not isinstance(execute_mode, Execute):
        accepted = [m.name for m in Execute]
        raise ValueError(f"execute_mode must be an Execute member {accepted}, got {execute_mode!r}.")
    spec = RegisterSpec(
        dispatch_mode=dispatch_mode,
        execute_mode=execute_mode,
        blocking=bool(blocking),
        concurrency_group=concurrency_group,
    )

    def decorate(func: Callable) -> Callable:
        setattr(func, REGISTER_ATTR, spec)
        return func

    return decorate


def get_register_spec(func: Any) -> RegisterSpec | None:
    """The :class:`RegisterSpec` of a decorated function, or None for an undecorated one."""
    return getattr(func, REGISTER_ATTR, None)


def registered_methods(cls: type) -> dict[str, RegisterSpec]:
    """Every method of ``cls`` a worker group calls, with its spec, resolved along the class's MRO.

    A method that overrides a registered one keeps the registration (and the dispatch mode) of the method it
    overrides unless it is decorated itself, in which case its own spec wins: a subclass that forgets to repeat
    ``@register`` cannot silently drop a method from its group. Dunder names are never registered.
    """
    specs: dict[str, RegisterSpec] = {}
    for klass in reversed(cls.__mro__):  # base classes first, so that a subclass's own decoration overrides
        for name, value in vars(klass).items():
            spec = get_register_spec(value)
            if spec is not None and not name.startswith("__"):
                specs[name] = spec
    return specs


# ------------------------------------------------------------------------------------------ dispatch / collect


def _dispatch_one_to_all(world_size: int, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], None]:
    return [args] * world_size, [kwargs] * world_size, None


def _dispatch_all_to_all(world_size: int, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], None]:
    named = [(f"positional argument {i}", value) for i, value in enumerate(args)]
    named += [(f"argument {key!r}", value) for key, value in kwargs.items()]
    for label, value in named:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise ValueError(
                f"Dispatch.ALL_TO_ALL needs every argument to be a list with one entry per rank ({world_size}); "
                f"{label} is {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
                + ". Pass a list of length world_size, or register the method with Dispatch.ONE_TO_ALL."
            )
    per_rank_args = [tuple(value[rank] for value in args) for rank in range(world_size)]
    per_rank_kwargs = [{key: value[rank] for key, value in kwargs.items()} for rank in range(world_size)]
    return per_rank_args, per_rank_kwargs, None


def _dispatch_dp_compute_proto(world_size: int, args: tuple, kwargs: dict) -> tuple[list[tuple], list[dict], dict]:
    """Pad every DataProto argument to a multiple of ``world_size`` and give rank r the r-th chunk.

    Non-DataProto arguments are passed unchanged to every rank. The context records the padding so that the
    collect step can drop the outputs of the padding rows.
    """
    lengths = {len(value) for value in (*args, *kwargs.values()) if isinstance(value, DataProto)}
    if not lengths:
        raise ValueError(
            "Dispatch.DP_COMPUTE_PROTO needs at least one DataProto argument (positional or keyword), got none. "
            "Pass the batch as a DataProto, or register the method with Dispatch.ONE_TO_ALL."
        )
    if len(lengths) > 1:
        raise ValueError(
            f"Dispatch.DP_COMPUTE_PROTO got DataProto arguments of different lengths {sorted(lengths)}; "
            "they are chunked row by row across ranks, so they must have the same number of rows."
        )
    context = {"num_rows": lengths.pop(), "pad_size": 0}

    def split(value: Any) -> list:
        if not isinstance(value, DataProto):
            return [value] * world_size
        padded, context["pad_size"] = pad_dataproto_to_divisor(value, world_size)
        return padded.chunk(world_size)

    split_args = [split(value) for value in args]
    split_kwargs = {key: split(value) for key, value in kwargs.items()}
    per_rank_args = [tuple(chunks[rank] for chunks in split_args) for rank in range(world_size)]
    per_rank_kwargs = [{key: chunks[rank] for key, chunks in split_kwargs.items()} for rank in range(world_size)]
    return per_rank_args, per_rank_kwargs, context


def _collect_list(outputs: list, context: Any) -> list:
    return list(outputs)


def _collect_first(outputs: list, context: Any) -> Any:
    assert len(outputs) == 1, f"rank-zero execution produced {len(outputs)} outputs"
    return outputs[0]


def _collect_dp_compute_proto(outputs: list, context: dict) -> Any:
    """Concatenate DataProto outputs in rank order and drop the padding rows; other outputs stay a list.

    An output may hold ``k`` rows per input row (e.g. ``n`` sampled responses per prompt); the padding then
    accounts for the last ``k * pad_size`` rows, which holds when each input row's outputs are contiguous.
    """
    if not all(isinstance(output, DataProto) for output in outputs):
        return list(outputs)
    merged = DataProto.concat(outputs)
    pad_size = context["pad_size"]
    if pad_size == 0:
        return merged
    num_padded_rows = context["num_rows"] + pad_size
    if len(merged) % num_padded_rows != 0:
        raise ValueError(
            f"Dispatch.DP_COMPUTE_PROTO padded the input from {context['num_rows']} to {num_padded_rows} rows, but "
            f"the workers returned {len(merged)} rows in all, not a multiple of {num_padded_rows}, so the padding "
            "rows cannot be dropped. Return a whole number of rows per input row, or pass a batch whose size is "
            "divisible by the world size."
        )
    return unpad_dataproto(merged, pad_size * (len(merged) // num_padded_rows))


DISPATCH_TABLE: dict[Dispatch, DispatchRule] = {
    Dispatch.ONE_TO_ALL: DispatchRule(_dispatch_one_to_all, _collect_list),
    Dispatch.ALL_TO_ALL: DispatchRule(_dispatch_all_to_all, _collect_list),
    Dispatch.DP_COMPUTE_PROTO: DispatchRule(_dispatch_dp_compute_proto, _collect_dp_compute_proto),
    Dispatch.RANK_ZERO: DispatchRule(
        lambda world_size, args, kwargs: ([args], [kwargs], None), _collect_first, rank_zero_only=True
    ),
}


@dataclass(frozen=True)
class CallPlan:
    """What a group call does: run ``ranks[i]`` with ``args[i]`` / ``kwargs[i]``, then ``collect(outputs)``."""

    ranks: list[int]
    args: list[tuple]
    kwargs: list[dict]
    collect: Callable[[list], Any]


def check_data_parallel_layout(layout: list[tuple[int, bool]]) -> int:
    """Check a per-rank ``(data-parallel rank, collects)`` layout; returns the data-parallel size.

    Every data-parallel rank ``0 .. D-1`` must appear, and exactly one rank of each must collect (return the
    results of its data-parallel group; the others compute the same rows, e.g. tensor-parallel peers).

    Raises:
        ValueError: a layout that breaks those rules.
    """
    dp_ranks = sorted({dp_rank for dp_rank, _ in layout})
    collectors = sorted(dp_rank for dp_rank, collects in layout if collects)
    if dp_ranks != list(range(len(dp_ranks))) or collectors != dp_ranks:
        raise ValueError(
            f"data-parallel layout {layout} must name data-parallel ranks 0..D-1 with exactly one collecting rank "
            "each; the workers' data_parallel_layout() disagree with each other."
        )
    return len(dp_ranks)


def _plan_data_parallel(rule: DispatchRule, layout: list[tuple[int, bool]], args: tuple, kwargs: dict) -> CallPlan:
    """DP_COMPUTE_PROTO over data-parallel groups: chunk per data-parallel rank, every rank of a group gets its
    group's chunk, and the results come from each group's collecting rank, in data-parallel order."""
    dp_size = check_data_parallel_layout(layout)
    per_dp_args, per_dp_kwargs, context = rule.dispatch(dp_size, args, kwargs)
    ranks = list(range(len(layout)))
    collectors = {dp_rank: rank for rank, (dp_rank, collects) in enumerate(layout) if collects}
    order = [collectors[dp_rank] for dp_rank in range(dp_size)]

    def collect(outputs: list) -> Any:
        by_rank = dict(zip(ranks, outputs, strict=True))
        return rule.collect([by_rank[rank] for rank in order], context)

    return CallPlan(
        ranks,
        [per_dp_args[dp_rank] for dp_rank, _ in layout],
        [per_dp_kwargs[dp_rank] for dp_rank, _ in layout],
        collect,
    )


def plan_call(
    spec: RegisterSpec,
    world_size: int,
    args: tuple,
    kwargs: dict,
    data_parallel_layout: list[tuple[int, bool]] | None = None,
) -> CallPlan:
    """Apply the dispatch rule and the execute mode of ``spec`` to one driver call.

    Args:
        spec: the method's dispatch and execute modes.
        world_size: the number of ranks.
        args: the driver's positional arguments.
        kwargs: the driver's keyword arguments.
        data_parallel_layout: per rank, ``(data-parallel rank, collects)`` when several ranks share their data
            (model parallelism); DP_COMPUTE_PROTO then splits over data-parallel ranks. None: every rank is its
            own data-parallel rank.

    Raises:
        ValueError: when the arguments do not fit the dispatch mode (see the dispatch functions).
    """
    rule = DISPATCH_TABLE[spec.dispatch_mode]
    sharing = data_parallel_layout is not None and any(not collects for _, collects in data_parallel_layout)
    if sharing and spec.dispatch_mode is Dispatch.DP_COMPUTE_PROTO and spec.execute_mode is Execute.ALL:
        return _plan_data_parallel(rule, data_parallel_layout, args, kwargs)
    per_rank_args, per_rank_kwargs, context = rule.dispatch(world_size, args, kwargs)
    if rule.rank_zero_only:
        return CallPlan([0], per_rank_args, per_rank_kwargs, lambda outputs: rule.collect(outputs, context))
    if spec.execute_mode is Execute.RANK_ZERO:
        return CallPlan([0], per_rank_args[:1], per_rank_kwargs[:1], lambda outputs: outputs[0])
    return CallPlan(
        list(range(world_size)), per_rank_args, per_rank_kwargs, lambda outputs: rule.collect(outputs, context)
    )
