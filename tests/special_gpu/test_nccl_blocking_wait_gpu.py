"""An NCCL collective that waits past its timeout, with and without ``TORCH_NCCL_BLOCKING_WAIT=1``
(``trainer.nccl_blocking_wait``).

The trainer names a rank that hangs in a collective when the ranks that waited for it raise their timeout in
Python (:func:`~verl.single_controller.worker.is_collective_timeout`) and it is still running. Gloo does that; NCCL
does it only in blocking-wait mode, where torch turns the watchdog's tear-down off. Without it the watchdog ends
the waiting process. One GPU shows both: a world of one rank whose all-reduce cannot finish before its timeout,
because the NCCL stream waits for a spinning kernel (``torch.cuda._sleep``) queued before it on the current stream.
Each case runs in a process of its own (the process group is broken afterwards, and the mode is read when the group
is built).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.special_gpu.checks import NEEDS_CUDA

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 2
# GPU clock cycles the spinning kernel runs: about 10 s at 2 GHz, far past the timeout at any clock
SPIN_CYCLES = 20_000_000_000

CHILD = f"""
import json, os, time
import torch
import torch.distributed as dist
from tests.special_gpu.test_worker_nccl_gpu import worker_class

worker = worker_class()()  # first: it loads the worker module without Ray where Ray is missing
from verl.single_controller.worker import is_collective_timeout
worker.init_torch_distributed(backend="nccl", timeout_s={TIMEOUT_S})
values = torch.ones(4, device="cuda")
torch.cuda._sleep({SPIN_CYCLES})
start = time.monotonic()
try:
    dist.all_reduce(values)
    torch.cuda.synchronize()
    outcome = {{"raised": None}}
except RuntimeError as err:
    outcome = {{"raised": type(err).__name__, "message": str(err)[:2000], "recognised": is_collective_timeout(err)}}
outcome["seconds"] = time.monotonic() - start
print("OUTCOME " + json.dumps(outcome), flush=True)
os._exit(0)
"""


def run_child(blocking_wait: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    env.pop("MASTER_PORT", None)
    env["TORCH_NCCL_BLOCKING_WAIT"] = "1" if blocking_wait else "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", CHILD], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def outcome_of(result: subprocess.CompletedProcess) -> dict | None:
    lines = [line for line in result.stdout.splitlines() if line.startswith("OUTCOME ")]
    return json.loads(lines[-1].removeprefix("OUTCOME ")) if lines else None


@pytest.mark.gpu
@NEEDS_CUDA
def test_in_blocking_wait_mode_the_waiting_rank_raises_a_timeout_the_trainer_recognises(figure):
    result = run_child(blocking_wait=True)
    outcome = outcome_of(result)
    assert result.returncode == 0 and outcome is not None, result.stderr[-4000:]
    # the rank's own thread got the timeout, as a RuntimeError the hang detection reads as one, and lived on
    assert outcome["raised"] is not None, outcome
    assert outcome["recognised"], outcome["message"]
    # raised once the 2 s timeout ran out, long before the spinning kernel (about 10 s) let the all-reduce finish
    assert TIMEOUT_S <= figure("blocking_wait_timeout_raised_after_s", outcome["seconds"]) < 8, outcome


@pytest.mark.gpu
@NEEDS_CUDA
def test_without_blocking_wait_the_watchdog_ends_the_waiting_process():
    result = run_child(blocking_wait=False)
    # what the trainer then sees is a dead worker (the docs say so): the process is gone without reporting
    assert result.returncode != 0 and outcome_of(result) is None, (result.returncode, result.stdout[-2000:])
    assert "Watchdog caught collective operation timeout" in result.stderr, result.stderr[-4000:]
