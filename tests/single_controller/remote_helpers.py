"""Worker classes and an error type for the worker-group tests, in a module the Ray worker processes can import.

Ray pickles classes by reference, so everything an actor runs or raises must be importable in the worker
processes; the tests put the repository root on their ``PYTHONPATH``.
"""

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import Dispatch, Execute, Worker, register


def start_local_ray(num_cpus: int = 2) -> None:
    """A Ray instance of the test's own (without an address Ray joins any cluster this machine runs, another
    test's), whose workers import this repository's modules (``tests.*`` included)."""
    import ray

    repo_root = str(Path(__file__).resolve().parents[2])
    python_path = os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p)
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": python_path}},
    )


class ExpectedWorkerError(RuntimeError):
    """Raised on purpose by ``EchoWorker.fail`` to check that the driver sees the same type and message."""


class EchoWorker(Worker):
    """Each method reports which rank ran it, so a test can check the dispatch."""

    def __init__(self, offset: int = 0) -> None:
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def tag_rows(self, data: DataProto, scale: int = 1) -> DataProto:
        """Per row: the rank that saw it and the row's ``x`` times ``scale``."""
        num_rows = len(data)
        return DataProto.from_dict(
            tensors={"rank": torch.full((num_rows,), self.rank), "x": data.batch["x"] * scale},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def row_metrics(self, data: DataProto) -> dict:
        return {"rank": self.rank, "num_rows": len(data)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, suffix: str) -> str:
        return f"rank{self.rank}/{self.world_size}{suffix}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_value(self, value: int) -> tuple[int, int]:
        return self.rank, value + self.offset

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def add(self, a: int, b: int = 0) -> tuple[int, int]:
        return self.rank, a + b

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, value: int) -> int:
        return value * 10 + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank_plus_one(self) -> float:
        """Sum over ranks of (rank + 1); the process group must be initialised first."""
        tensor = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(tensor)
        return float(tensor.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def all_reduce_after_sleep(self, sleeper: int, seconds: float) -> float:
        """Every rank all-reduces; rank ``sleeper`` first sleeps, so the others sit in the collective meanwhile."""
        if self.rank == sleeper:
            time.sleep(seconds)
        return self.all_reduce_rank_plus_one()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def backend(self) -> str:
        return dist.get_backend()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self, only_rank: int | None = None) -> int:
        if only_rank is None or only_rank == self.rank:
            raise ExpectedWorkerError(f"step 3 failed on purpose (grad norm inf), rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_same_message(self) -> None:
        raise ExpectedWorkerError("the same message on every rank")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> int:
        """Sleep ``seconds`` times (rank + 1): rank 1 is the slowest."""
        time.sleep(seconds * (self.rank + 1))
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, concurrency_group="side")
    def side_call(self) -> int:
        """Runs on a thread of its own, beside a call of the default group (a Ray concurrency group)."""
        return self.rank

    def plain_method(self, value: int) -> int:
        """Not registered: reachable through ``execute_all`` only."""
        return value + self.rank


class DiceWorker(Worker):
    """Draws from the process's random generators: a colocated role must see the same numbers as alone."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.seed = seed

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def roll(self, count: int) -> list[float]:
        return torch.rand(count).tolist()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mark_rows(self, data: DataProto) -> DataProto:
        """Per row: the rank that saw it, and the process that ran it."""
        num_rows = len(data)
        tensors = {"rank": torch.full((num_rows,), self.rank), "pid": torch.full((num_rows,), os.getpid())}
        return DataProto.from_dict(tensors=tensors)

    def layout(self) -> tuple[int, int]:
        return self.rank, self.seed
