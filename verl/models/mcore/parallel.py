"""Process-group and random-seed setup that megatron-core needs before a model can be built.

megatron-core reads its tensor/pipeline/data-parallel groups from the global ``parallel_state`` module, which in
turn needs ``torch.distributed``. This module brings both up for the common cases: a single process (a gloo group
of world size 1 on CPU, created on a free local port) and a process already launched into a world of N ranks by
someone else (then the data-parallel size is N / (tp * pp)). Seeding follows the same split: megatron's CUDA RNG
tracker is only touched when CUDA exists, because on CPU the portable layer spec never forks it.
"""

from __future__ import annotations

import logging
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

logger = logging.getLogger(__name__)


def _free_port() -> int:
    """Ask the OS for an unused TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _init_single_process_group(backend: str | None, timeout_s: float) -> None:
    """Start a world-size-1 process group, so that megatron's group bookkeeping has something to split."""
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    port = _free_port()
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=timeout_s),
    )
    logger.info("initialised a single-process %s group on port %d for megatron-core", backend, port)


def _groups_are_live() -> bool:
    """Whether megatron-core's model-parallel group is registered with the current default process group."""
    try:
        dist.get_rank(group=parallel_state.get_model_parallel_group())
    except (ValueError, RuntimeError, AssertionError):
        return False
    return True


def ensure_model_parallel_initialized(
    tp: int = 1, pp: int = 1, backend: str | None = None, timeout_s: float | None = None
) -> None:
    """Make sure torch.distributed and megatron-core's model-parallel groups exist; idempotent.

    If ``torch.distributed`` is not initialised, a single-process group is created (gloo on CPU, nccl when CUDA is
    available, unless ``backend`` says otherwise). If it is already initialised with world size N, megatron's
    groups are built over those N ranks, so the data-parallel size is ``N // (tp * pp)``. Calling it again with the
    same sizes does nothing.

    Args:
        tp: tensor-model-parallel size.
        pp: pipeline-model-parallel size.
        backend: torch.distributed backend for a group this function creates; ignored if one already exists.
        timeout_s: how long a collective of megatron-core's groups (tensor-parallel, pipeline, data-parallel, and
            the single-process group this function may create) waits before it raises; None: the worker's
            collective timeout (``VERL_COLLECTIVE_TIMEOUT_S``, which the worker group sets from
            ``trainer.collective_timeout_s``, else its default). megatron-core's own default is 30 minutes
            whatever the default group's timeout is, so a rank hung in a tensor-parallel all-reduce or a pipeline
            send would be reported half an hour late.

    Raises:
        ValueError: sizes that are not positive, that do not divide the world size, or that differ from those of
            an already initialised megatron-core; a timeout that is not a number of seconds > 0.
    """
    if tp < 1 or pp < 1:
        raise ValueError(f"tensor/pipeline parallel sizes must be >= 1, got tp={tp}, pp={pp}")
    timeout_s = _resolve_timeout_s(timeout_s)
    if not dist.is_initialized():
        _init_single_process_group(backend, timeout_s)
    if _live_groups_of_sizes(tp, pp):
        return
    world_size = dist.get_world_size()
    if world_size % (tp * pp) != 0:
        raise ValueError(
            f"world size {world_size} is not divisible by tp * pp = {tp} * {pp}; choose sizes whose product "
            "divides the number of ranks"
        )
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        distributed_timeout_minutes=timeout_s / 60,  # a timedelta of minutes, which takes a fraction
    )
    logger.info(
        "megatron-core model parallel initialised: tp=%d pp=%d dp=%d",
        tp,
        pp,
        parallel_state.get_data_parallel_world_size(),
    )


def _resolve_timeout_s(timeout_s: float | None) -> float:
    """``timeout_s``, or the worker's collective timeout when None.

    Raises:
        ValueError: a timeout that is not a number of seconds > 0.
    """
    if timeout_s is None:
        from verl.single_controller.worker import collective_timeout_s

        timeout_s = collective_timeout_s()
    if not timeout_s > 0:  # NaN fails too
        raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
    return timeout_s


def _live_groups_of_sizes(tp: int, pp: int) -> bool:
    """Whether megatron-core's groups already exist, live, with these sizes (stale ones are destroyed first).

    Raises:
        ValueError: live groups of other sizes.
    """
    if parallel_state.model_parallel_is_initialized() and not _groups_are_live():
        # megatron-core's groups outlived the process group they were split from (it was destroyed and made again,
        # e.g. by another library in the same process): they cannot be used, so they are built anew
        logger.warning("megatron-core's model-parallel groups belong to a destroyed process group; rebuilding them")
        parallel_state.destroy_model_parallel()
    if not parallel_state.model_parallel_is_initialized():
        return False
    have_tp = parallel_state.get_tensor_model_parallel_world_size()
    have_pp = parallel_state.get_pipeline_model_parallel_world_size()
    if (have_tp, have_pp) != (tp, pp):
        raise ValueError(
            f"megatron-core is already initialised with tp={have_tp}, pp={have_pp}, but tp={tp}, pp={pp} was "
            "requested; use the same sizes in one process, or call "
            "megatron.core.parallel_state.destroy_model_parallel() first"
        )
    return True


def answers_for_its_rows() -> bool:
    """Whether this rank answers for the rows of its model-parallel group (its tensor-parallel ranks and pipeline
    stages all take the same rows): tensor-parallel rank 0 of the last stage, where the losses' metrics exist. The
    group's other ranks hold copies."""
    return parallel_state.get_tensor_model_parallel_rank() == 0 and parallel_state.is_pipeline_last_stage()


def set_model_parallel_seed(seed: int) -> None:
    """Seed the CPU generator, and megatron's CUDA RNG tracker when CUDA is available.

    megatron's tracker (``model_parallel_cuda_manual_seed``) calls ``torch.cuda.manual_seed`` and is what its
    GPU-side weight init and attention dropout fork from; on CPU nothing of megatron forks it (weights are
    initialised on CPU with the default generator), so only ``torch.manual_seed`` is needed there.

    Args:
        seed: the base seed; megatron derives per-rank tensor-parallel seeds from it on GPU.
    """
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def ensure_cuda_rng_tracker(seed: int = 1234) -> None:
    """Initialise megatron's CUDA RNG tracker if nobody has; a no-op without CUDA.

    megatron's GPU weight init and its local core attention fork the tracker's "model-parallel-rng" state, which
    raises if that state was never added.

    Args:
        seed: seed to use when the tracker has to be created here.
    """
    if not torch.cuda.is_available():
        return
    tracker = tensor_parallel.get_cuda_rng_tracker()
    if not tracker.is_initialized():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
