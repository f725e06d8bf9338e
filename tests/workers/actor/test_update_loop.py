"""The update loop under the profiler: each mini-batch a labelled range and one step of the torch schedule."""

import json
import os
from types import SimpleNamespace

from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
from verl.utils.profiler import RoleProfiler
from verl.workers.actor.dp_actor import build_dp_actor


def test_the_update_loop_steps_the_profilers_schedule_once_per_mini_batch(tmp_path):
    # 8 samples in mini-batches of 4: two updates. skip_first 1, active 1: mini-batch 1 is passed over, mini-batch 2
    # alone is recorded, in the update pass's own trace (discrete)
    actor = build_dp_actor(
        actor_config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=2), tiny_qwen2(), total_training_steps=10
    )
    batch = ppo_batch()
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    schedule = {"skip_first": 1, "wait": 0, "warmup": 0, "active": 1, "repeat": 1}
    tools = {"torch": {"discrete": True, "contents": ["cpu"], "schedule": schedule}}
    section = SimpleNamespace(enable=True, all_ranks=True, ranks=[], tool=None, save_path=None, tool_config=tools)
    settings = SimpleNamespace(tool="torch", save_path=str(tmp_path), global_tool_config={})
    profiler = RoleProfiler("actor_rollout_ref", [section], settings, rank=0)
    profiler.start(1)
    with profiler.phase("update_actor"):
        assert actor.update_policy(batch).num_attempted == 2
    written = profiler.stop()
    assert [os.path.basename(path) for path in written] == ["actor_rollout_ref_rank0_step1_update_actor_mb2.json"]
    names = {event.get("name") for event in json.loads(open(written[0]).read())["traceEvents"]}
    assert "mini_batch2" in names and "mini_batch1" not in names
