"""End-to-end multi-node runs: ``main_ppo`` on a two-node Ray cluster started on this machine, and killed workers.

The cluster (``ray.cluster_utils.Cluster``, two nodes of one CPU each) lives in this test process; each run is a
``python -m verl.trainer.main_ppo`` subprocess that joins it with ``ray_init.address``, one rank per node on the
dp backend. A run that loses a worker is started through ``tests/special_e2e/main_ppo_killing_a_worker.py``
instead, which kills it from outside the trainer (``tests/single_controller/fault_injection.py``): the N-th
``update_actor`` call first SIGKILLs rank 1, then rank 0 runs the update and waits for rank 1 in the gradient
all-reduce.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ray.cluster_utils import Cluster
from safetensors.torch import load_file

from tests.special_e2e.test_main_ppo import SMALL
from verl.utils.checkpoint import is_complete_checkpoint

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
# 4 steps with a checkpoint every 2; a loss scale at which fp16 updates happen, so that a resume has state to get
# right; a micro-batch that splits over 2 ranks (4 prompts x 2 samples = 8 samples, 4 per rank).
TWO_NODES = [
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=-1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.actor.optim.initial_loss_scale=1024",
    "ray_init.num_cpus=null",  # the cluster's nodes have their own sizes
]
# how long a run may take before the test calls it hung: far above the ~25 s the longest one takes here
RUN_TIMEOUT_S = 300
PLACEMENT_LINE = re.compile(
    r"rank (\d+) on node (\w+) \(([^)]*)\) local (\d+)/(\d+) pid \d+ CUDA_VISIBLE_DEVICES=\S+ rendezvous ([^;\s]+)"
)
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/", "trainer/restarts")


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


def run_on_cluster(cluster, tmp_dir: Path, *overrides: str, kill: str | None = None) -> tuple:
    """One ``main_ppo`` run joining ``cluster``; returns (completed process, checkpoint directory)."""
    out_dir = tmp_dir / "run"
    small = [o for o in SMALL if not o.startswith("ray_init.num_cpus=")]
    # a kill is <group>:<rank>:<method>:<call>, carried out by the test's own entry point around main_ppo's
    entry = ["verl.trainer.main_ppo"] if kill is None else ["tests.special_e2e.main_ppo_killing_a_worker", kill]
    cmd = [
        sys.executable,
        "-m",
        *entry,
        *small,
        *TWO_NODES,
        f"ray_init.address={cluster.address}",
        f"trainer.default_local_dir={out_dir}",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"}
    proc = subprocess.run(cmd, cwd=tmp_dir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    return proc, out_dir


def train_records(out_dir: Path) -> list[dict]:
    with open(out_dir / "metrics.jsonl") as handle:
        return [r for r in map(json.loads, handle) if "critic/score/mean" in r]


def comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(NOT_COMPARED)}


def placements(log: str) -> list[list[tuple]]:
    """Every actor-group placement line of a run's log: per rank (rank, node, ip, local, local world, rendezvous)."""
    lines = [line for line in log.splitlines() if "actor_rollout_ref: " in line and " rank(s) on " in line]
    return [[m.groups() for m in PLACEMENT_LINE.finditer(line)] for line in lines]


def actor_weights(checkpoint: Path) -> dict:
    return load_file(checkpoint / "actor" / "model.safetensors")


@pytest.fixture(scope="module")
def reference(cluster, tmp_path_factory):
    """The uninterrupted two-node run that the killed runs are compared with."""
    return run_on_cluster(cluster, tmp_path_factory.mktemp("reference"))


def test_two_node_run_rendezvouses_at_rank_zero_and_saves(cluster, reference):
    proc, out_dir = reference
    assert proc.returncode == 0, proc.stderr[-4000:]
    (ranks,) = placements(proc.stderr)  # one actor group, built once
    (r0, node0, ip0, local0, lws0, rdv0), (r1, node1, _, local1, lws1, rdv1) = ranks
    # one rank on each of the cluster's two nodes, each the only (local rank 0 of 1) rank there
    assert (r0, r1) == ("0", "1")
    assert {node0, node1} == {node.node_id for node in cluster.list_all_nodes()}
    assert (local0, lws0, local1, lws1) == ("0", "1", "0", "1")
    # both ranks got the address rank 0 reported: its own node's IP and a port claimed there
    assert rdv0 == rdv1 and rdv0.startswith(f"{ip0}:")
    assert [r["step"] for r in train_records(out_dir)] == [1, 2, 3, 4]
    assert [r["trainer/restarts"] for r in train_records(out_dir)] == [0.0] * 4
    assert is_complete_checkpoint(out_dir / "global_step_4", ("actor",))


def test_killed_worker_stops_the_run_with_its_code_and_message(cluster, tmp_path):
    # update_actor call 3 is step 3: global_step_2 is saved, step 3 never finishes
    proc, out_dir = run_on_cluster(cluster, tmp_path, kill="actor_rollout_ref:1:update_actor:3")
    assert proc.returncode == 4, proc.stderr[-4000:]  # EXIT_WORKER_DIED
    (ranks,) = placements(proc.stderr)
    rank1_node, rank1_ip = ranks[1][1], ranks[1][2]
    assert f"A worker died: role actor_rollout_ref, rank 1, node {rank1_node} ({rank1_ip})." in proc.stderr
    assert f"Last good checkpoint: {out_dir / 'global_step_2'} (intact;" in proc.stderr
    assert "set trainer.max_restarts=N" in proc.stderr
    # what was saved is whole, and nothing after it was written
    assert is_complete_checkpoint(out_dir / "global_step_2", ("actor",))
    assert sorted(p.name for p in out_dir.iterdir() if p.name.startswith(("global_step", ".global_step"))) == [
        "global_step_2"
    ]


def test_killed_worker_with_a_restart_finishes_like_the_uninterrupted_run(cluster, reference, tmp_path):
    proc, out_dir = run_on_cluster(
        cluster, tmp_path, "trainer.max_restarts=1", kill="actor_rollout_ref:1:update_actor:3"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert len(placements(proc.stderr)) == 2  # the actor group was built twice
    records = train_records(out_dir)
    # steps 1-2 from the first workers, 3-4 (after the restart) from the rebuilt ones; each step once
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["trainer/restarts"] for r in records] == [0.0, 0.0, 1.0, 1.0]  # one restart, from step 2's checkpoint
    # the exact resume makes the run indistinguishable from the uninterrupted one: metrics and final weights
    expected_proc, expected_dir = reference
    assert expected_proc.returncode == 0
    assert [comparable(r) for r in records] == [comparable(r) for r in train_records(expected_dir)]
    want, got = actor_weights(expected_dir / "global_step_4"), actor_weights(out_dir / "global_step_4")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_killed_worker_before_any_checkpoint_restarts_from_the_start(cluster, reference, tmp_path):
    # update_actor call 1 is step 1, before the first checkpoint (step 2): the restart starts over, data included
    proc, out_dir = run_on_cluster(
        cluster, tmp_path, "trainer.max_restarts=1", kill="actor_rollout_ref:1:update_actor:1"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = train_records(out_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["trainer/restarts"] for r in records] == [1.0] * 4  # every step after the one restart, from step 1
    _, expected_dir = reference
    # the same batches (data.batch_fingerprint) and results as the uninterrupted run
    assert [comparable(r) for r in records] == [comparable(r) for r in train_records(expected_dir)]
    want, got = actor_weights(expected_dir / "global_step_4"), actor_weights(out_dir / "global_step_4")
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_killed_critic_rebuilds_the_process_it_shares_with_the_actor_and_the_run_finishes(cluster, tmp_path):
    # the critic lives in the actor's processes (trainer.colocate_roles): its death takes the actor's rank with it,
    # and the restart rebuilds that process whole, both roles resuming from step 2's checkpoint
    critic = ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4"]
    restart = "trainer.max_restarts=1"
    proc, out_dir = run_on_cluster(cluster, tmp_path, *critic, restart, kill="critic:1:update_critic:3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "worker actor_rollout_ref+critic rank 1 on node" in proc.stderr and " died: " in proc.stderr
    assert proc.stderr.count("actor_rollout_ref+critic: 2 rank(s) on 2 node(s)") == 2  # built, then rebuilt whole
    records = train_records(out_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["trainer/restarts"] for r in records] == [0.0, 0.0, 1.0, 1.0]
    assert is_complete_checkpoint(out_dir / "global_step_4", ("actor", "critic"))


def test_cluster_too_small_is_a_config_error_at_start_up(cluster, tmp_path):
    # 3 ranks of one CPU each on a cluster of two one-CPU nodes; batch 6 x 2 samples split over 3 ranks
    proc, _ = run_on_cluster(
        cluster,
        tmp_path,
        "trainer.nnodes=3",
        "data.train_batch_size=6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=6",
    )
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "trainer.nnodes=3 x trainer.n_gpus_per_node=1 (CPU ranks) does not fit the Ray cluster" in proc.stderr
    assert "needs 3 node(s) with CPU 1 each" in proc.stderr and "1 more such node(s) are missing" in proc.stderr
