"""Ctrl-C under a pipe: ``python -m verl.trainer.main_ppo 2>&1 | tee log`` in a process group of its own.

A terminal's Ctrl-C sends SIGINT to every process of its foreground group: the driver, Ray's daemons (its children)
and ``tee``, which dies at once, so the run goes on writing into a pipe nobody reads. The run must answer as it
answers a SIGINT to the driver alone: finish the step, save, exit 5. (A SIGTERM to the whole group, as ``timeout``
or a scheduler sends it, is the resume test's signal in test_main_ppo.py.)
"""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.utils.checkpoint import is_complete_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "data.train_batch_size=4",
    "data.num_val_examples=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.n=2",
    "trainer.plot=false",
    "ray_init.num_cpus=2",
    "trainer.total_training_steps=20",
]

pytestmark = pytest.mark.slow


def test_ctrl_c_to_a_piped_runs_process_group_saves_and_exits_5(tmp_path):
    out_dir = tmp_path / "run"
    command = shlex.join([sys.executable, "-m", "verl.trainer.main_ppo", *TINY, f"trainer.default_local_dir={out_dir}"])
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # the driver's exit code is written by the subshell, which outlives a Ctrl-C its child answered
    shell = subprocess.Popen(
        ["bash", "-c", f"({command}; echo $? > exit_code) 2>&1 | tee log"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a group of its own, as the terminal's foreground job
    )
    log = tmp_path / "log"
    while shell.poll() is None and "step 1:" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.2)  # polling for the line; the test asserts nothing about time
    assert shell.poll() is None, log.read_text()[-4000:]
    os.killpg(shell.pid, signal.SIGINT)  # what Ctrl-C does: every process of the group, tee included
    shell.wait(timeout=600)
    assert (tmp_path / "exit_code").read_text().strip() == "5", log.read_text()[-4000:]  # EXIT_PREEMPTED
    (checkpoint,) = sorted(out_dir.glob("global_step_*"))  # the step it finished, saved
    assert is_complete_checkpoint(checkpoint, ("actor",))
    assert "Traceback" not in log.read_text()  # what tee wrote before it died
