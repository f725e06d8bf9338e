"""Process entry points of the two-rank FSDP2 tests (gloo); importable so that spawned processes find them.

Each entry point runs several scenarios in one process group (a spawn costs more than a scenario) and puts
``(rank, results)`` on the queue, where ``results`` maps a scenario name to what it observed, or to
``{"error": traceback}`` so that a test fails with the real cause instead of a timeout. Only plain Python values
cross the queue (tensors would travel through shared memory that dies with the process).
"""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from tests.workers.rollout.conftest import sampling_options


def _run(
    rank: int, world_size: int, port: int, queue, scenarios: dict[str, Callable[[int], dict]], backend: str = "gloo"
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if "nccl" in backend:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    # a deadlock (ranks taking different numbers of collectives) fails within a minute instead of hanging
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
    results = {}
    for name, scenario in scenarios.items():
        try:
            results[name] = scenario(rank)
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    queue.put((rank, results))
    dist.destroy_process_group()


def _actor(seed=0, device="cpu", **overrides):
    from tests.workers.actor.conftest import actor_config, tiny_qwen2
    from verl.utils.fsdp_utils import device_mesh
    from verl.workers.actor.fsdp_actor import build_fsdp_actor

    return build_fsdp_actor(
        actor_config(**overrides),
        tiny_qwen2(seed),
        mesh=device_mesh(device),
        total_training_steps=100,
        rank=dist.get_rank(),
    )


def _batch(actor, rank: int, seed_offset: int = 0, device: str = "cpu"):
    from tests.workers.actor.conftest import ppo_batch

    batch = ppo_batch(seed=rank + 10 * seed_offset).to(device)  # each rank trains on its own rows
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    return batch


def _local_bytes_of(module) -> list[bytes]:
    from verl.utils.fsdp_utils import local_tensor

    return [local_tensor(p).detach().cpu().numpy().tobytes() for p in module.parameters()]


def _optimizer_bytes(optimizer) -> dict[tuple[int, str], bytes]:
    """Each parameter's optimizer state (by parameter index and state key), as bytes of the local shard."""
    from verl.utils.fsdp_utils import local_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    return {
        (index, key): local_tensor(value).detach().cpu().numpy().tobytes()
        for index, param in enumerate(params)
        for key, value in optimizer.state.get(param, {}).items()
    }


def _full_bytes(module) -> list[bytes]:
    from torch.distributed.tensor import DTensor

    return [
        (v.full_tensor() if isinstance(v, DTensor) else v).cpu().numpy().tobytes() for v in module.state_dict().values()
    ]


# ---------------------------------------------------------------------- training scenarios


def _shards(rank: int) -> dict:
    """Local vs global shapes of every parameter and Adam moment after one applied fp32 update."""
    actor = _actor()
    actor.update_policy(_batch(actor, rank))
    params = {n: (list(p.to_local().shape), list(p.shape)) for n, p in actor.actor_module.named_parameters()}
    names = {p: n for n, p in actor.actor_module.named_parameters()}
    moments = {
        f"{names[p]}.{key}": (list(v.to_local().shape), list(v.shape))
        for p, state in actor.optimizer.optimizer.state.items()
        for key, v in state.items()
        if key in ("exp_avg", "exp_avg_sq")
    }
    return {"params": params, "moments": moments}


def _global_norm(rank: int) -> dict:
    """The step's grad norm against torch's DTensor-aware norm and the norm of the gathered full gradients."""
    actor = _actor()
    mini = _batch(actor, rank)
    actor._backward_mini_batch(mini, 1.0)
    grads = [p.grad for p in actor.actor_module.parameters()]
    torch_norm = torch.nn.utils.get_total_norm(grads, 2.0).full_tensor().item()
    full_norm = torch.cat([g.full_tensor().reshape(-1) for g in grads]).double().norm().item()
    local_norm = torch.cat([g.to_local().reshape(-1) for g in grads]).double().norm().item()
    successful, step_norm, _ = actor.optimizer.step()
    return {"torch": torch_norm, "full": full_norm, "local": local_norm, "step": step_norm, "ok": successful}


def _overflow_in_one_shard(rank: int) -> dict:
    """fp16: update 1 applies; update 2 has NaN gradients in rank 1's shard only (the fire drill)."""
    actor = _actor(
        dtype="float16",
        optim={"initial_loss_scale": 1024.0},
        fault_injection={"nonfinite_grad_steps": [2], "ranks": [1]},
    )
    batch = _batch(actor, rank)
    first = actor.update_policy(batch).metrics
    params, moments = _local_bytes_of(actor.actor_module), _optimizer_bytes(actor.optimizer.optimizer)
    step_counts = [float(s["step"]) for s in actor.optimizer.optimizer.state.values()]
    second = actor.update_policy(batch).metrics
    return {
        "failed": [first["actor/update_failed"], second["actor/update_failed"]],
        "local_found_inf": actor.optimizer.local_found_inf,
        "loss_scale": actor.optimizer.get_loss_scale(),
        "params_unchanged": params == _local_bytes_of(actor.actor_module),
        "moments_unchanged": moments == _optimizer_bytes(actor.optimizer.optimizer),
        "step_counts": sorted(set(step_counts + [float(s["step"]) for s in actor.optimizer.optimizer.state.values()])),
        "lr_epoch": actor.lr_scheduler.last_epoch,
    }


def _strict_stop(rank: int) -> dict:
    """strict: NaN gradients in rank 1's shard at update 3; where does each rank stop?"""
    from verl.workers.update_outcome import UpdateFailedError

    actor = _actor(update_failure_policy="strict", fault_injection={"nonfinite_grad_steps": [3], "ranks": [1]})
    batch = _batch(actor, rank)
    update_failed = []
    try:
        for _ in range(5):
            update_failed.append(actor.update_policy(batch).metrics["actor/update_failed"])
    except UpdateFailedError as err:
        return {"raised_at": err.step, "update_failed": update_failed}
    return {"raised_at": None, "update_failed": update_failed}


def _critic_overflow(rank: int) -> dict:
    """The critic on FSDP2, fp16: update 2 has NaN gradients in rank 1's shard only."""
    from tests.workers.actor.conftest import tiny_qwen2
    from tests.workers.critic.conftest import critic_config, value_batch
    from verl.utils.fsdp_utils import device_mesh
    from verl.workers.critic.dp_critic import ValueModel
    from verl.workers.critic.fsdp_critic import build_fsdp_critic

    config = critic_config(
        dtype="float16",
        optim={"initial_loss_scale": 1024.0},
        fault_injection={"nonfinite_grad_steps": [2], "ranks": [1]},
    )
    critic = build_fsdp_critic(
        ValueModel.from_pretrained_lm(tiny_qwen2(0), seed=3),
        config,
        mesh=device_mesh("cpu"),
        total_training_steps=10,
        rank=rank,
    )
    batch = value_batch(seed=rank)
    failed = [critic.update_critic(batch).metrics["critic/update_failed"]]
    params = _local_bytes_of(critic.critic_module)
    failed.append(critic.update_critic(batch).metrics["critic/update_failed"])
    return {"failed": failed, "params_unchanged": params == _local_bytes_of(critic.critic_module)}


def _padding_free(rank: int) -> dict:
    """fp32, one update with and without packing; rank 1's rows carry 3 more pads, so the ranks pack to different
    lengths (the collectives do not depend on it). Returns the largest weight difference after the update."""
    actors = [_actor(), _actor()]
    actors[1].use_remove_padding = True
    batch = _batch(actors[0], rank)
    if rank == 1:  # end three more responses early: fewer real tokens to pack on this rank
        batch.batch["attention_mask"][2:5, -1] = 0
        batch.batch["response_mask"][2:5, -1] = 0
    metrics = [actor.update_policy(batch).metrics for actor in actors]
    full = [{k: v.full_tensor() for k, v in a.actor_module.state_dict().items()} for a in actors]
    return {
        "num_real_tokens": int(batch.batch["attention_mask"].sum()),
        "max_weight_diff": max((full[0][k] - full[1][k]).abs().max().item() for k in full[0]),
        "pg_loss": [m["actor/pg_loss"] for m in metrics],
    }


def _token_budget_lockstep(rank: int) -> dict:
    """fp32, micro-batches by a token budget of 16 over rows of 8 tokens (4 prompt + 4 response): rank 0's rows are
    whole (real tokens 7, 7, 8 x 6 -> 4 micro-batches of two), rank 1's responses end after 1 token (4, 5 x 7 ->
    4+5+5 | 5+5+5 | 5+5: 3). Unagreed, rank 1 would stop after 3 forwards while rank 0 gathers parameters for a 4th.
    Counts the forward passes of the log-prob pass and of one update, against the same update by sample count."""
    from verl.workers.config.roles import MicroBatching

    budget = {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 16}
    actors = [_actor(), _actor(**budget)]
    batch = _batch(actors[0], rank)
    if rank == 1:
        batch.batch["attention_mask"][:, 5:] = 0
        batch.batch["response_mask"][:, 1:] = 0
    forwards = []
    actors[1].actor_module.register_forward_pre_hook(lambda module, args: forwards.append(1))
    whole, _ = actors[1].compute_log_prob(batch)
    by_budget, _ = actors[1].compute_log_prob(batch, MicroBatching(size=None, use_dynamic_bsz=True, max_token_len=16))
    log_prob_forwards = len(forwards) - 1
    mask = batch.batch["response_mask"].bool()
    for actor in actors:
        actor.update_policy(batch)
    full = [{k: v.full_tensor() for k, v in a.actor_module.state_dict().items()} for a in actors]
    return {
        "log_prob_forwards": log_prob_forwards,
        "update_forwards": len(forwards) - 1 - log_prob_forwards,
        "max_log_prob_diff": (whole[mask] - by_budget[mask]).abs().max().item(),
        "max_weight_diff": max((full[0][k] - full[1][k]).abs().max().item() for k in full[0]),
    }


def _rollout_stop(rank: int) -> dict:
    """The naive rollout over a logits_fn that is a collective: rank 0's rows end at token 1, rank 1's at token 2
    (first call), and never (second call)."""
    from verl.workers.rollout.naive_rollout import NaiveRollout

    vocab, eos, calls, rank1_ends = 8, 2, [], {"at_token_two": True}

    def logits_fn(input_ids, attention_mask, position_ids):
        token = torch.zeros(1)
        dist.all_reduce(token)  # a sharded model's forward: every rank must take part
        calls[-1] += 1
        generated = input_ids.shape[1] - 3
        ends_now = (rank == 0 and generated == 0) or (rank == 1 and generated == 1 and rank1_ends["at_token_two"])
        logits = torch.full((*input_ids.shape, vocab), -1e4)
        logits[:, -1, eos if ends_now else 5] = 0.0
        return logits

    rollout = NaiveRollout(
        logits_fn, sampling_options(n=1, response_length=4, do_sample=False), pad_token_id=0, eos_token_id=eos
    )
    rollout.synchronize_stop(dist.group.WORLD)
    ids = torch.full((2, 3), 4)
    for ends_at_two in (True, False):
        rank1_ends["at_token_two"] = ends_at_two
        calls.append(0)
        rollout._generate_tokens(ids, torch.ones_like(ids), rollout.params)
    return {"calls": calls}


def fsdp_training_scenarios(rank: int, world_size: int, port: int, queue) -> None:
    scenarios = {
        "shards": _shards,
        "global_norm": _global_norm,
        "overflow": _overflow_in_one_shard,
        "strict": _strict_stop,
        "critic": _critic_overflow,
        "padding_free": _padding_free,
        "token_budget": _token_budget_lockstep,
        "rollout": _rollout_stop,
    }
    _run(rank, world_size, port, queue, scenarios)


# ---------------------------------------------------------------------- checkpoint scenarios


def _resume(rank: int, root: Path) -> dict:
    """fp16 (loss-scale state matters): 2 updates, save, 2 more; a fresh actor loads the save and does the same 2."""
    overrides = {"dtype": "float16", "optim": {"initial_loss_scale": 1024.0, "lr_scheduler": "cosine"}}
    actor = _actor(**overrides)
    batches = [_batch(actor, rank, seed_offset=i) for i in range(4)]
    for batch in batches[:2]:
        actor.update_policy(batch)
    saved = {"params": _local_bytes_of(actor.actor_module), "moments": _optimizer_bytes(actor.optimizer.optimizer)}
    actor.save_checkpoint(root / "actor")
    dist.barrier()
    straight = [actor.update_policy(b).metrics for b in batches[2:]]

    resumed = _actor(seed=1, **overrides)  # other initial weights: only the checkpoint can make them equal
    resumed.load_checkpoint(root / "actor")
    loaded = {"params": _local_bytes_of(resumed.actor_module), "moments": _optimizer_bytes(resumed.optimizer.optimizer)}
    state_after_load = (resumed.optimizer.get_loss_scale(), resumed.num_update_steps, resumed.lr_scheduler.last_epoch)
    again = [resumed.update_policy(b).metrics for b in batches[2:]]
    files = sorted(p.name for p in (root / "actor" / "sharded").iterdir())
    return {
        "round_trip": loaded == saved,
        "state_after_load": state_after_load,
        "metrics_equal": straight == again,
        "update_failed": [m["actor/update_failed"] for m in straight],
        "weights_equal": _full_bytes(actor.actor_module) == _full_bytes(resumed.actor_module),
        "files": files,
    }


def _hf_export(rank: int, root: Path) -> dict:
    """fp32: the export's log-probs, computed by plain transformers, against the FSDP2 actor's."""
    from transformers import AutoModelForCausalLM

    from tests.workers.actor.conftest import ppo_batch
    from verl.utils.torch_functional import compute_response_log_probs

    actor = _actor()
    actor.update_policy(_batch(actor, rank))
    actor.save_checkpoint(root / "export")
    dist.barrier()
    batch = ppo_batch(seed=rank)
    want, _ = actor.compute_log_prob(batch)
    model = AutoModelForCausalLM.from_pretrained(root / "export" / "huggingface", dtype=torch.float32).eval()
    b = batch.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    got, _ = compute_response_log_probs(logits.logits, b["input_ids"], b["responses"].shape[-1], 1.0, False)
    return {"max_abs_diff": (got.float() - want).abs().max().item(), "class": type(model).__name__}


def fsdp_checkpoint_scenarios(rank: int, world_size: int, port: int, queue, root: str) -> None:
    root = Path(root)
    scenarios = {"resume": lambda r: _resume(r, root), "hf_export": lambda r: _hf_export(r, root)}
    _run(rank, world_size, port, queue, scenarios)


# ---------------------------------------------------------------------- CUDA scenarios (NCCL + gloo for CPU tensors)


def _cuda_train_and_resume(rank: int, root: Path, name: str, **overrides) -> dict:
    """fp16 on CUDA: 2 updates, save, 1 more; a fresh actor loads the save and repeats that update."""
    from verl.utils.fsdp_utils import local_tensor

    overrides = {"dtype": "float16", "optim": {"initial_loss_scale": 1024.0}, **overrides}
    actor = _actor(device="cuda", **overrides)
    batches = [_batch(actor, rank, seed_offset=i, device="cuda") for i in range(3)]
    update_failed = [actor.update_policy(b).metrics["actor/update_failed"] for b in batches[:2]]
    actor.save_checkpoint(root / name)
    dist.barrier()
    update_failed.append(actor.update_policy(batches[2]).metrics["actor/update_failed"])
    resumed = _actor(seed=1, device="cuda", **overrides)
    resumed.load_checkpoint(root / name)
    resumed.update_policy(batches[2])
    params = list(actor.actor_module.parameters())
    states = [v for s in actor.optimizer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    return {
        "update_failed": update_failed,
        "param_device": local_tensor(params[0]).device.type,
        "grad_device": local_tensor(params[0].grad).device.type,
        "state_devices": sorted({local_tensor(v).device.type for v in states}),
        "weights_equal": _full_bytes(actor.actor_module) == _full_bytes(resumed.actor_module),
    }


def _cuda_rollout_stop(rank: int) -> dict:
    """The agreed stop with the flag on the GPU (NCCL): rank 0 ends at token 1, the others at token 3."""
    from verl.workers.rollout.naive_rollout import NaiveRollout

    calls = [0]

    def logits_fn(input_ids, attention_mask, position_ids):
        calls[0] += 1
        generated = input_ids.shape[1] - 3
        end = generated == (0 if rank == 0 else 2)
        logits = torch.full((*input_ids.shape, 8), -1e4, device=input_ids.device)
        logits[:, -1, 2 if end else 5] = 0.0
        return logits

    rollout = NaiveRollout(
        logits_fn, sampling_options(n=1, response_length=6, do_sample=False), pad_token_id=0, eos_token_id=2
    )
    rollout.synchronize_stop(dist.group.WORLD)
    ids = torch.full((2, 3), 4, device="cuda")
    rollout._generate_tokens(ids, torch.ones_like(ids), rollout.params)
    return {"calls": calls[0]}


def fsdp_cuda_scenarios(rank: int, world_size: int, port: int, queue, root: str) -> None:
    root = Path(root)
    scenarios = {
        "plain": lambda r: _cuda_train_and_resume(r, root, "plain"),
        "param_offload": lambda r: _cuda_train_and_resume(
            r, root, "param_offload", fsdp_config={"param_offload": True, "optimizer_offload": True}
        ),
        "optimizer_offload": lambda r: _cuda_train_and_resume(
            r, root, "optimizer_offload", fsdp_config={"optimizer_offload": True}
        ),
        "rollout": _cuda_rollout_stop,
    }
    _run(rank, world_size, port, queue, scenarios, backend="cpu:gloo,cuda:nccl")
