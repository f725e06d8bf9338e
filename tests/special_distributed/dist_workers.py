"""Process entry points for the multi-process (gloo) tests; importable so that spawned processes can find them."""

import os
import traceback

import torch
import torch.distributed as dist


def dp_actor_fire_drill(rank: int, world_size: int, port: int, result_queue) -> None:
    """Train the tiny dp actor on two ranks with only rank 1's gradients poisoned; report what each rank saw."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from tests.workers.actor.conftest import actor_config, ppo_batch, tiny_qwen2
    from verl.workers.actor.dp_actor import build_dp_actor
    from verl.workers.update_outcome import UpdateFailedError

    seen, raised_at, error = [], None, None
    try:
        model = tiny_qwen2(seed=0)
        cfg = actor_config(
            update_failure_policy={"name": "fp16_warn_and_count", "max_consecutive_failures": 2},
            fault_injection={"nonfinite_grad_steps": [2, 3, 4, 5], "ranks": [1]},
        )
        actor = build_dp_actor(cfg, model, total_training_steps=10, rank=rank, process_group=dist.group.WORLD)
        batch = ppo_batch(seed=rank)  # each rank trains on its own data
        batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
        for _ in range(8):
            metrics = actor.update_policy(batch).metrics
            seen.append((actor.num_update_steps, metrics["actor/update_failed"]))
    except UpdateFailedError as err:
        raised_at = err.step
    except Exception:  # report, so that the test fails with the real cause instead of a timeout
        error = traceback.format_exc()
    # bytes, not tensors: tensors cross a Queue through shared memory that dies with this process
    weights = [p.detach().numpy().tobytes() for p in model.parameters()] if error is None else None
    causes = None if error is not None else _failure_causes_on_one_rank(rank, actor_config, ppo_batch, tiny_qwen2)
    result_queue.put((rank, seen, raised_at, error, weights, causes))
    dist.destroy_process_group()


def _failure_causes_on_one_rank(rank, actor_config, ppo_batch, tiny_qwen2):
    """The outcome each rank reports when only rank 1 holds NaN advantages, then when only rank 0's loss is NaN:
    ``[(step, cause, nonfinite_inputs), ...]`` (each stops the run at once under fp16_warn_and_count)."""
    from verl.workers.actor.dp_actor import build_dp_actor
    from verl.workers.update_outcome import UpdateFailedError

    actor = build_dp_actor(
        actor_config(dtype="float16", optim={"initial_loss_scale": 1024.0}),
        tiny_qwen2(seed=0),
        total_training_steps=10,
        rank=rank,
        process_group=dist.group.WORLD,
    )
    batch = ppo_batch(seed=rank)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    reported = []
    if rank == 1:
        batch.batch["advantages"][3, :2] = float("nan")
    try:
        actor.update_policy(batch)
    except UpdateFailedError as err:
        reported.append((err.step, str(err.outcome.cause), err.outcome.nonfinite_inputs))
    batch.batch["advantages"] = torch.nan_to_num(batch.batch["advantages"])
    if rank == 0:
        real_loss = actor._micro_batch_loss
        actor._micro_batch_loss = lambda *args: (lambda out: (out[0] * float("nan"), out[1]))(real_loss(*args))
    try:
        actor.update_policy(batch)
    except UpdateFailedError as err:
        reported.append((err.step, str(err.outcome.cause), err.outcome.nonfinite_inputs))
    reported.append(actor.optimizer.get_loss_scale())
    return reported
