"""Process entry points of the megatron tensor-parallel gloo tests (importable, so that spawned processes find them).

Each process builds the same tiny Qwen2 (tied embeddings) from the same seed, so the Hugging Face weights every rank
converts its shards from are the same, and trains the megatron actor on the same batch: the ranks of one
tensor-parallel group share their data.
"""

import functools
import os
import time
import traceback

import torch
import torch.distributed as dist


def _sizes(layout) -> tuple[int, int]:
    """(tensor-parallel size, pipeline stages) of a layout: a tensor-parallel size, or the pair."""
    return layout if isinstance(layout, tuple) else (layout, 1)


def _init(rank: int, world_size: int, port: int, layout) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from verl.models.mcore import ensure_model_parallel_initialized

    tp, pp = _sizes(layout)
    ensure_model_parallel_initialized(tp=tp, pp=pp)


def _rank_process(body):
    """A spawned rank's entry point from ``body(rank, tp, *args) -> dict``: join the gloo group and megatron-core's
    groups, run the body, and put ``(rank, result, error)`` on the queue (the last argument) — the traceback as the
    error, so that the test fails with the real cause instead of a timeout. ``tp`` is a tensor-parallel size or a
    (tensor-parallel size, pipeline stages) pair."""

    @functools.wraps(body)
    def entry(rank: int, world_size: int, port: int, tp: int, *args) -> None:
        *args, result_queue = args
        result, error = {}, None
        try:
            _init(rank, world_size, port, tp)
            result = body(rank, tp, *args)
        except Exception:
            error = traceback.format_exc()
        result_queue.put((rank, result, error))
        if dist.is_initialized():
            dist.destroy_process_group()

    return entry


def _actor(layout, rank: int, hf_model, lora=None, megatron=None, **overrides):
    from tests.workers.actor.conftest import actor_config
    from verl.workers.actor.megatron_builder import build_megatron_actor

    tp, pp = _sizes(layout)
    megatron = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "use_megatron_optimizer": "auto",
        **(megatron or {}),
    }
    # checkpoints with the huggingface/ export, which the round trips compare with the gathered weights
    overrides.setdefault("checkpoint", {"save_contents": ["model", "optimizer", "extra", "hf_model"]})
    cfg = actor_config(strategy="megatron", megatron=megatron, seed=1, **overrides)
    return build_megatron_actor(
        hf_model.config,
        cfg,
        device="cpu",
        total_training_steps=10,
        hf_state_dict=hf_model.state_dict(),
        rank=rank,
        process_group=dist.group.WORLD,
        lora=lora,
    )


@_rank_process
def lora_update(rank: int, tp: int, ckpt_dir: str) -> dict:
    """LoRA on the megatron actor: log-probs, one update, its grad norm, the merged weights, the adapters-off
    log-probs after the update; then a checkpoint round trip (shards with adapters, merged Hugging Face export)."""
    from tests.workers.actor.conftest import megatron_lora, ppo_batch, tiny_qwen2

    hf_model = tiny_qwen2(seed=0)
    actor = _actor(tp, rank, hf_model, lora=megatron_lora(lora_B_init_method="normal"))
    batch = ppo_batch(seed=0)
    log_probs, _ = actor.compute_log_prob(batch)
    with actor.adapters_off()():
        base, _ = actor.compute_log_prob(batch)
    batch.batch["old_log_probs"] = log_probs
    metrics = actor.update_policy(batch).metrics
    with actor.adapters_off()():
        base_after, _ = actor.compute_log_prob(batch)
    result = {
        "log_probs": log_probs.numpy().tobytes(),
        "base_moved": float((base_after - base).abs().max()),
        "grad_norm": metrics["actor/grad_norm"],
        "weights": _hf_bytes(actor, hf_model.config),
        "after": actor.compute_log_prob(batch)[0].numpy().tobytes(),
    }
    if ckpt_dir:
        lora = megatron_lora(lora_B_init_method="normal")
        result.update(_round_trip(actor, lambda: _actor(tp, rank, hf_model, lora=lora), ckpt_dir, batch, rank))
    return result


def _round_trip(actor, make_actor, ckpt_dir: str, batch, rank: int) -> dict:
    """Save ``actor``, build the initial one again (``make_actor``) and load: its log-probs and update count after
    the resume, and on rank 0 the checkpoint's Hugging Face export."""
    from verl.utils.checkpoint import load_weights

    actor.save_checkpoint(ckpt_dir)
    dist.barrier()
    fresh = make_actor()
    fresh.load_checkpoint(ckpt_dir)
    result = {
        "after_resume": fresh.compute_log_prob(batch)[0].numpy().tobytes(),
        "steps_after_resume": fresh.num_update_steps,
    }
    if rank == 0:
        exported = load_weights(os.path.join(ckpt_dir, "huggingface", "model.safetensors"))
        result["exported"] = {k: v.float().numpy().tobytes() for k, v in exported.items()}
    return result


def _hf_bytes(actor, hf_config) -> dict[str, bytes]:
    """The actor's whole weights under Hugging Face names (gathered over the tensor-parallel group)."""
    from verl.models.mcore import export_mcore_to_hf

    return {k: v.float().numpy().tobytes() for k, v in export_mcore_to_hf(actor.model_module(), hf_config).items()}


@_rank_process
def update_and_checkpoint(rank: int, tp: int, ckpt_dir: str) -> dict:
    """Log-probs and entropy, one update, its grad norm and the updated weights; then a checkpoint round trip."""
    from tests.workers.actor.conftest import ppo_batch, tiny_qwen2

    hf_model = tiny_qwen2(seed=0)
    actor = _actor(tp, rank, hf_model)
    batch = ppo_batch(seed=0)
    log_probs, entropy = actor.compute_log_prob(batch, calculate_entropy=True)
    batch.batch["old_log_probs"] = log_probs
    metrics = actor.update_policy(batch).metrics
    after, _ = actor.compute_log_prob(batch)
    result = {
        "log_probs": log_probs.numpy().tobytes(),
        "entropy": entropy.numpy().tobytes(),
        "grad_norm": metrics["actor/grad_norm"],
        "weights": _hf_bytes(actor, hf_model.config),
        "after": after.numpy().tobytes(),
    }
    if ckpt_dir:
        result.update(_round_trip(actor, lambda: _actor(tp, rank, hf_model), ckpt_dir, batch, rank))
    return result


@_rank_process
def fused_update(rank: int, tp: int) -> dict:
    """``model.use_fused_kernels``: log-probs and entropy from the fused output layer, one update, its grad norm and
    the updated weights (no checkpoint)."""
    from tests.workers.actor.conftest import ppo_batch, tiny_qwen2

    hf_model = tiny_qwen2(seed=0)
    actor = _actor(tp, rank, hf_model, use_fused_kernels=True)
    batch = ppo_batch(seed=0)
    log_probs, entropy = actor.compute_log_prob(batch, calculate_entropy=True)
    batch.batch["old_log_probs"] = log_probs
    metrics = actor.update_policy(batch).metrics
    return {
        "log_probs": log_probs.numpy().tobytes(),
        "entropy": entropy.numpy().tobytes(),
        "grad_norm": metrics["actor/grad_norm"],
        "weights": _hf_bytes(actor, hf_model.config),
        "after": actor.compute_log_prob(batch)[0].numpy().tobytes(),
    }


def nan_on_one_rank(rank: int, world_size: int, port: int, tp: int, result_queue) -> None:
    """Poison the gradients of tensor-parallel rank 1 only at update 2; report each rank's verdicts and weights."""
    seen, error, weights = [], None, None
    try:
        _init(rank, world_size, port, tp)
        from tests.workers.actor.conftest import ppo_batch, tiny_qwen2

        hf_model = tiny_qwen2(seed=0)
        actor = _actor(
            tp,
            rank,
            hf_model,
            update_failure_policy={"name": "fp16_warn_and_count", "max_consecutive_failures": 5},
            fault_injection={"nonfinite_grad_steps": [2], "ranks": [1]},
        )
        batch = ppo_batch(seed=0)
        batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
        before_step_2 = None
        for step in range(1, 4):
            if step == 2:
                before_step_2 = _hf_bytes(actor, hf_model.config)
            metrics = actor.update_policy(batch).metrics
            seen.append((actor.num_update_steps, metrics["actor/update_failed"]))
            if step == 2:
                weights = (before_step_2, _hf_bytes(actor, hf_model.config))
    except Exception:
        error = traceback.format_exc()
    result_queue.put((rank, seen, weights, error))
    if dist.is_initialized():
        dist.destroy_process_group()


@_rank_process
def nonfinite_inputs(rank: int, layout) -> dict:
    """NaN advantages on 2 tokens of the rows both ranks of one model-parallel group take: the failure each rank
    reports (fp16_warn_and_count stops at once on it) and the loss scale after it."""
    from tests.workers.actor.conftest import ppo_batch, tiny_qwen2
    from verl.workers.update_outcome import UpdateFailedError

    actor = _actor(layout, rank, tiny_qwen2(seed=0), dtype="float16", optim={"initial_loss_scale": 1024.0})
    batch = ppo_batch(seed=0)
    batch.batch["old_log_probs"], _ = actor.compute_log_prob(batch)
    batch.batch["advantages"][3, :2] = float("nan")
    try:
        actor.update_policy(batch)
    except UpdateFailedError as err:
        return {
            "cause": str(err.outcome.cause),
            "inputs": err.outcome.nonfinite_inputs,
            "scale": err.outcome.loss_scale,
        }
    return {"cause": None}


def a_peer_that_never_joins(rank: int, world_size: int, port: int, timeout_s: float, result_queue) -> None:
    """Tensor parallel over 2 ranks with ``VERL_COLLECTIVE_TIMEOUT_S=timeout_s`` (the worker group sets it from
    ``trainer.collective_timeout_s``): rank 0 all-reduces on the tensor-parallel group, rank 1 never joins it. Rank
    0 reports whether its wait ended in the timeout the trainer recognises (``is_collective_timeout``)."""
    result, error = {}, None
    try:
        os.environ["VERL_COLLECTIVE_TIMEOUT_S"] = str(timeout_s)
        _init(rank, world_size, port, 2)
        from megatron.core import parallel_state

        from verl.single_controller.worker import is_collective_timeout

        dist.barrier()  # the world group's default timeout (30 minutes): both ranks are past their start-up here
        if rank == 0:
            try:
                dist.all_reduce(torch.ones(1), group=parallel_state.get_tensor_model_parallel_group())
                result = {"timed_out": False}
            except RuntimeError as err:
                result = {"timed_out": is_collective_timeout(err), "error": str(err).splitlines()[0]}
        else:
            time.sleep(2 * timeout_s)  # hung, as long as rank 0 would wait with the timeout applied, twice
        dist.barrier()
    except Exception:
        error = traceback.format_exc()
    result_queue.put((rank, result, error))
    if dist.is_initialized():
        dist.destroy_process_group()


@_rank_process
def dist_checkpoint_layouts(rank: int, tp: int, save_dir: str, load_dir: str) -> dict:
    """megatron-core distributed checkpoints across layouts: the actor converted from the Hugging Face weights writes
    its shards to ``save_dir`` (``save_dist_checkpoint``); an actor started with ``use_dist_checkpointing=true`` from
    ``load_dir`` (written at another tensor-parallel size, or empty) reports its log-probs and its gathered weights."""
    from tests.workers.actor.conftest import ppo_batch, tiny_qwen2
    from verl.models.mcore.dist_checkpoint import save_dist_checkpoint

    hf_model = tiny_qwen2(seed=0)
    batch = ppo_batch(seed=0)
    converted = _actor(tp, rank, hf_model)
    save_dist_checkpoint(converted.model_module(), save_dir)
    result = {"converted": converted.compute_log_prob(batch)[0].numpy().tobytes()}
    if load_dir:
        megatron = {"use_dist_checkpointing": True, "dist_checkpointing_path": load_dir}
        loaded = _actor(tp, rank, tiny_qwen2(seed=1), megatron=megatron)  # other weights unless the load works
        result["loaded"] = loaded.compute_log_prob(batch)[0].numpy().tobytes()
        result["weights"] = _hf_bytes(loaded, hf_model.config)
        result["want_weights"] = _hf_bytes(converted, hf_model.config)
    return result


@_rank_process
def critic_update(rank: int, layout, ckpt_dir: str) -> dict:
    """The megatron critic split over ``layout``'s ranks: values, one update, its grad norm, the gathered weights (the
    value head included) and the values after it; then a checkpoint round trip into a critic of other weights."""
    from tests.workers.actor.conftest import tiny_qwen2
    from tests.workers.critic.conftest import critic_config, value_batch
    from verl.models.mcore.weight_converter import gather_model_parallel_state_dict
    from verl.workers.critic.megatron_critic import build_megatron_critic

    hf_model = tiny_qwen2(seed=0)
    tp, pp = _sizes(layout)

    def make(seed):
        megatron = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
        cfg = critic_config(strategy="megatron", megatron=megatron, seed=seed, optim={"lr": 1e-2})
        state = tiny_qwen2(seed=seed).state_dict()  # seed 0: the LM both layouts start from
        return build_megatron_critic(
            hf_model.config,
            cfg,
            total_training_steps=10,
            hf_state_dict=state,
            rank=rank,
            process_group=dist.group.WORLD,
        )

    critic = make(0)
    batch = value_batch(seed=0)
    values = critic.compute_values(batch)
    metrics = critic.update_critic(batch).metrics
    state = {k: v for k, v in critic.model_module().state_dict().items() if torch.is_tensor(v)}
    whole = gather_model_parallel_state_dict(critic.model_module(), state)
    result = {
        "values": values.numpy().tobytes(),
        "grad_norm": metrics["critic/grad_norm"],
        "weights": {k: v.float().numpy().tobytes() for k, v in whole.items()},
        "shapes": {k: tuple(v.shape) for k, v in whole.items()},
        "after": critic.compute_values(batch).numpy().tobytes(),
    }
    critic.save_checkpoint(ckpt_dir)
    dist.barrier()
    fresh = make(5)
    fresh.load_checkpoint(ckpt_dir)
    result["after_resume"] = fresh.compute_values(batch).numpy().tobytes()
    return result


@_rank_process
def sequence_parallel_step(rank: int, tp: int) -> dict:
    """One AmpOptimizer step (SGD, lr 1, no clipping) on a tensor-parallel group of 2: a layer-norm-like weight
    megatron marks ``sequence_parallel`` whose gradient is rank + 1 per element (each rank saw part of the
    sequence), a split weight whose gradient is 1 per element, a replicated one with gradient 2 per element."""
    from megatron.core import parallel_state

    from verl.utils.amp_optimizer import AmpOptimizer

    norm_weight = torch.nn.Parameter(torch.zeros(3))
    norm_weight.sequence_parallel = True
    split = torch.nn.Parameter(torch.zeros(2))
    split.tensor_model_parallel = True
    replicated = torch.nn.Parameter(torch.zeros(4))
    optimizer = AmpOptimizer(
        torch.optim.SGD([norm_weight, split, replicated], lr=1.0),
        clip_grad=0.0,
        process_group=parallel_state.get_data_parallel_group(),
        tensor_parallel_group=parallel_state.get_tensor_model_parallel_group(),
    )
    norm_weight.grad = torch.full((3,), float(rank + 1))
    split.grad = torch.ones(2)
    replicated.grad = torch.full((4,), 2.0)
    ok, grad_norm, _ = optimizer.step()
    return {"ok": ok, "grad_norm": grad_norm, "norm_weight": norm_weight.detach().tolist()}


@_rank_process
def pipeline_decode(rank: int, layout) -> dict:
    """The megatron actor's cached decoder: the first prefill's last logits, then 6 greedy tokens per row."""
    from tests.workers.actor.conftest import ppo_batch, tiny_qwen2

    hf_model = tiny_qwen2(seed=0)
    actor = _actor(layout, rank, hf_model)
    actor.model_module().eval()
    decoder = actor.incremental_decoder()
    batch = ppo_batch(seed=0).batch
    ids, mask, pos = batch["prompts"], batch["attention_mask"][:, : batch["prompts"].shape[1]], None
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    tokens = []
    with torch.no_grad():
        logits = decoder.prefill(ids, mask, pos, max_new_tokens=6)
        first = logits.clone()
        for _ in range(6):
            token = logits.argmax(-1)
            tokens.append(token.tolist())
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
            pos = pos[:, -1:] + 1
            logits = decoder.decode(token, mask, pos[:, 0])
    return {"tokens": tokens, "logits": first.float().numpy().tobytes()}
