"""The ``vllm`` rollout in a real actor worker (``dp`` backend, rank 0 of 1): weight sync, sampling, greedy parity.

One engine per (device, dtype), built once for the module (an engine start is the expensive part: tens of seconds
on 2 cores). The model is a head_dim-64 model the tests write (vLLM's CPU attention rejects the embedded tiny
model's head_dim 16). The engine's log-probs of fixed sequences are read with vLLM's prompt log-probs, which are
``log_softmax`` of its logits at temperature 1, the quantity the trainer's ``compute_log_prob`` computes.

The GPU variants (marked ``gpu``, run by tests/special_gpu/run_all.sh) repeat the checks on CUDA (fp16, and fp32
for the greedy parity) and add sleep/wake: the KV cache is given back between generations, and weights sent while
asleep arrive.
"""

import gc
import os

import pytest
import torch

from tests.workers.rollout.vllm_helpers import VLLM_TEST_OVERRIDES, needs_vllm, write_head_dim_64_model

needs_vllm()  # before the workers' import (and with it Ray's): a machine without vLLM skips this module

from tests.workers.built import built_worker  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.data_setup import build_data  # noqa: E402
from verl.workers.config import compose_ppo_config  # noqa: E402
from verl.workers.dp_workers import DPActorRolloutRefWorker  # noqa: E402
from verl.workers.rollout import NaiveRollout  # noqa: E402
from verl.workers.update_outcome import UpdateOutcomeHandler  # noqa: E402

# |engine - trainer| of one token's log-prob, per dtype: fp32 differs only by summation order; fp16 by the rounding
# of every activation in different kernels (vLLM's fused ones against torch autocast), growing through the layers.
# Measured on CPU with this model: fp32 2e-6, fp16 3e-3 to 7e-3; the bounds leave 4x or more.
TOLERANCE = {"float32": 1e-4, "float16": 3e-2}
# one update at lr 1e-2 moves the log-probs of the fixed sequences by about 3.8: far beyond every tolerance
UPDATE_SCALE = 10

SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one update per step: 4 prompts x 2 samples
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    # verl's defaults for a model of one's own leave these unset (null) and pick GAE: set what this test needs
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.optim.lr=1e-2",
    "actor_rollout_ref.actor.optim.initial_loss_scale=1024",
    "actor_rollout_ref.actor.update_failure_policy=fp16_warn_and_count",  # a skipped update is not fatal here
]
# the share of the GPU an engine of these tests takes (on CPU: VLLM_TEST_OVERRIDES' 1% of the RAM)
GPU_SHARE = 0.05
gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CPU_FP32 = pytest.param(("cpu", "float32"), id="cpu-fp32")
CUDA_FP16 = pytest.param(("cuda", "float16"), id="cuda-fp16", marks=gpu)
CASES = [CPU_FP32, pytest.param(("cpu", "float16"), id="cpu-fp16"), CUDA_FP16]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_head_dim_64_model(tmp_path_factory.mktemp("head_dim_64"))


@pytest.fixture(scope="module", autouse=True)
def vllm_process_state():
    """What vLLM leaves in the process is gone after this module: its process group and model-parallel groups
    (other tests expect none), and the environment variables it sets (LD_PRELOAD, LOCAL_WORLD_SIZE, ...), which
    the subprocesses of later tests would inherit."""
    environ = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(environ)
    gc.collect()
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


def build_worker(model_dir, device, dtype):
    overrides = [f"actor_rollout_ref.rollout.gpu_memory_utilization={GPU_SHARE}"] if device == "cuda" else []
    config = compose_ppo_config(
        [
            "actor_rollout_ref.rollout.name=vllm",
            f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.actor.dtype={dtype}",
            f"trainer.device={device}",
            *SMALL,
            *VLLM_TEST_OVERRIDES,
            *overrides,
        ]
    )
    worker = built_worker(DPActorRolloutRefWorker, config, 10)
    worker.init_model()
    return worker


def shut_down(worker):
    engine = worker.rollout.engine
    worker.rollout = None
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


@pytest.fixture(scope="module", params=CASES)
def worker(request, model_dir):
    device, dtype = request.param
    built = build_worker(model_dir, device, dtype)
    yield built
    shut_down(built)


def prompts_of(worker, **meta) -> DataProto:
    prompts = next(build_data(worker.run_config, 1).train_loader)
    prompts.meta_info.update(meta)
    return prompts


def update_batch(worker, poisoned=False) -> DataProto:
    """One step's batch from the engine's own samples: old log-probs, advantages +1 / -1 on alternate rows."""
    samples = worker.generate_sequences(prompts_of(worker))
    samples.meta_info["temperature"] = 1.0
    samples = samples.union(worker.compute_log_prob(samples))
    sign = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(len(samples))])
    samples.batch["advantages"] = sign[:, None] * samples.batch["response_mask"].float()
    if poisoned:
        samples.batch["advantages"][:] = float("nan")  # non-finite inputs: the update is not taken
    return samples


def fixed_sequences(num_rows=6, prompt_length=5, response_length=6) -> DataProto:
    """Seeded token rows, the first prompts left-padded; responses without padding (every token is scored)."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 50, (num_rows, prompt_length), generator=gen)
    responses = torch.randint(3, 50, (num_rows, response_length), generator=gen)
    attention_mask = torch.ones(num_rows, prompt_length + response_length, dtype=torch.long)
    attention_mask[0, :2] = 0
    attention_mask[1, :1] = 0
    prompts[0, :2] = 0
    prompts[1, :1] = 0
    tensors = {
        "input_ids": torch.cat([prompts, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses,
    }
    return DataProto.from_dict(tensors, meta_info={"temperature": 1.0})


def engine_log_probs(worker, batch: DataProto) -> torch.Tensor:
    """(B, R) the engine's log-probs of the response tokens given everything before them (prompt log-probs)."""
    from vllm import SamplingParams

    response_length = batch.batch["responses"].shape[1]
    rows = [ids[mask.bool()].tolist() for ids, mask in zip(batch.batch["input_ids"], batch.batch["attention_mask"])]
    worker.rollout.wake_up()
    outputs = worker.rollout.engine.generate(
        [{"prompt_token_ids": row} for row in rows],
        SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )
    worker.rollout.sleep()
    # prompt_logprobs[i] holds token i's log-prob given tokens < i, keyed by token i itself
    return torch.tensor(
        [
            [step[token].logprob for step, token in zip(out.prompt_logprobs[-response_length:], row[-response_length:])]
            for out, row in zip(outputs, rows)
        ]
    )


def trainer_log_probs(worker, batch: DataProto) -> torch.Tensor:
    return worker.compute_log_prob(batch).batch["old_log_probs"]


def gap(worker, batch) -> float:
    return (engine_log_probs(worker, batch) - trainer_log_probs(worker, batch)).abs().max().item()


class _SkipEveryFailure(UpdateOutcomeHandler):
    """A policy that skips whatever failed (the built-in ones stop at once on non-finite inputs)."""

    def on_failure(self, outcome):
        pass


def test_a_skipped_update_sends_nothing(worker, monkeypatch):
    sequences = fixed_sequences()
    before = engine_log_probs(worker, sequences)
    loads = []
    monkeypatch.setattr(worker.rollout, "load_weights", lambda weights: loads.append(weights))
    monkeypatch.setattr(worker.actor, "update_outcome_handler", _SkipEveryFailure())
    metrics = worker.update_actor(update_batch(worker, poisoned=True)).metrics
    assert metrics["actor/num_updates_successful"] == 0.0
    assert loads == [] and metrics["timing_s/weight_sync"] == 0.0
    assert metrics["rollout/weight_syncs"] == worker.num_weight_syncs
    assert torch.equal(engine_log_probs(worker, sequences), before)  # the engine was not touched


def test_the_engine_matches_the_trainer_after_a_sync_and_not_before(worker):
    tolerance = TOLERANCE[worker.config.actor.dtype]
    sequences = fixed_sequences()
    worker._sync_rollout_weights()  # engine and trainer start from the same weights, whatever ran before
    assert gap(worker, sequences) < tolerance
    trainer_before = trainer_log_probs(worker, sequences)

    # an update without the sync: the trainer moves, the engine does not
    metrics = worker.actor.update_policy(update_batch(worker)).metrics
    assert metrics["actor/num_updates_successful"] == 1.0
    assert (trainer_log_probs(worker, sequences) - trainer_before).abs().max() > UPDATE_SCALE * tolerance
    assert gap(worker, sequences) > UPDATE_SCALE * tolerance

    worker._sync_rollout_weights()
    assert gap(worker, sequences) < tolerance

    # the worker's own step: update, then sync, both reported (a step's sync counts; the one above was by hand)
    syncs = worker.num_weight_syncs
    metrics = worker.update_actor(update_batch(worker)).metrics
    assert metrics["actor/num_updates_successful"] == 1.0
    assert metrics["rollout/weight_syncs"] == syncs + 1 and metrics["timing_s/weight_sync"] > 0.0
    assert gap(worker, sequences) < tolerance


def test_a_sync_streams_the_trainers_own_tensors_into_the_engine(worker, monkeypatch):
    # in one process nothing is packed: every tensor vLLM's reload reads is the memory of one of the trainer's
    # parameters (the dp backend yields its state dict, detached views of the parameters), not a copy in a bucket
    sequences = fixed_sequences()
    assert worker.actor.update_policy(update_batch(worker)).metrics["actor/num_updates_successful"] == 1.0
    param_memory = {param.data_ptr() for param in worker.actor.model_module().parameters()}
    seen, real_rpc = [], worker.rollout.engine.collective_rpc

    def spy(method, *args, kwargs=None, **rest):
        if method == "reload_weights":
            pairs = list(kwargs["weights_iterator"])
            seen.extend(pairs)
            kwargs = {**kwargs, "weights_iterator": iter(pairs)}
        return real_rpc(method, *args, kwargs=kwargs, **rest)

    monkeypatch.setattr(worker.rollout.engine, "collective_rpc", spy)
    worker._sync_rollout_weights()
    assert seen and all(tensor.data_ptr() in param_memory for _, tensor in seen)
    assert gap(worker, sequences) < TOLERANCE[worker.config.actor.dtype]  # and the engine got them


def test_sampled_log_probs_are_the_trainers_at_the_sampling_temperature(worker):
    worker._sync_rollout_weights()
    # temperature 0.7 without top-k/top-p: vLLM's processed log-probs are log_softmax(logits / 0.7)
    output = worker.generate_sequences(prompts_of(worker, temperature=0.7))
    assert output.batch["responses"].shape == (8, worker.config.rollout.response_length)
    output.meta_info["temperature"] = 0.7
    mask = output.batch["response_mask"].bool()
    engine, trainer = output.batch["rollout_log_probs"], trainer_log_probs(worker, output)
    assert (engine - trainer).abs()[mask].max() < TOLERANCE[worker.config.actor.dtype]
    assert (engine[~mask] == 0).all()


def test_sampling_continues_from_the_saved_rollout_state(worker):
    prompts = prompts_of(worker)
    state = worker.rollout.state_dict()
    first = worker.generate_sequences(prompts).batch["responses"]
    worker.rollout.load_state_dict(state)
    again = worker.generate_sequences(prompts).batch["responses"]
    after = worker.generate_sequences(prompts).batch["responses"]
    # the same per-request seeds give the same samples; the stream then moves on (8 rows x 8 tokens of 46 choices)
    assert torch.equal(first, again) and not torch.equal(first, after)


@pytest.mark.parametrize(
    "worker", [CPU_FP32, pytest.param(("cuda", "float32"), id="cuda-fp32", marks=gpu)], indirect=True
)
def test_greedy_responses_equal_the_naive_rollouts_in_fp32(worker):
    worker._sync_rollout_weights()
    actor = worker.actor

    def logits_fn(input_ids, attention_mask, position_ids):
        return actor.forward_logits(input_ids, attention_mask, position_ids).float()

    rollout_config = worker.config.rollout
    naive = NaiveRollout(
        logits_fn, rollout_config.sampling_options(), worker.rollout.pad_token_id, worker.rollout.eos_ids
    )
    prompts = prompts_of(worker, do_sample=False)
    vllm_out = worker.generate_sequences(prompts)
    with torch.no_grad():
        naive_out = naive.generate_sequences(prompts.to(worker._device())).to("cpu")
    assert torch.equal(vllm_out.batch["responses"], naive_out.batch["responses"])
    assert torch.equal(vllm_out.batch["response_mask"], naive_out.batch["response_mask"])
    # both log-probs are at temperature 1 for greedy calls
    assert torch.allclose(vllm_out.batch["rollout_log_probs"], naive_out.batch["rollout_log_probs"], atol=1e-4)


@pytest.mark.parametrize("worker", [CUDA_FP16], indirect=True)
def test_the_engine_sleeps_between_generations_and_takes_weights_asleep(worker):
    # free_cache_engine (on by default) builds the engine with sleep mode on CUDA
    rollout, total = worker.rollout, torch.cuda.mem_get_info()[1]
    assert rollout.can_sleep
    worker.generate_sequences(prompts_of(worker))  # sleeps after generating
    asleep_free = torch.cuda.mem_get_info()[0]
    rollout.wake_up()
    awake_free = torch.cuda.mem_get_info()[0]
    # the KV cache of a 300k-parameter model is nearly all of the engine's share of the device
    assert asleep_free - awake_free > GPU_SHARE / 2 * total
    rollout.sleep()
    # weights sent while asleep arrive (only the weights wake; the KV cache stays released until generation)
    worker.actor.update_policy(update_batch(worker))
    worker._sync_rollout_weights()
    assert torch.cuda.mem_get_info()[0] - awake_free > GPU_SHARE / 2 * total
    assert gap(worker, fixed_sequences()) < TOLERANCE["float16"]
    assert worker.generate_sequences(prompts_of(worker)).batch["responses"].shape[0] == 8


@pytest.mark.slow
@pytest.mark.parametrize("worker", [CPU_FP32], indirect=True)
def test_a_partial_rollout_switches_weights_between_two_chunks(worker, monkeypatch, tmp_path):
    from transformers import Qwen2ForCausalLM

    from verl.workers.rollout import vllm_rollout
    from verl.workers.rollout.partial import WEIGHT_VERSION_KEY, WeightSwitch

    worker._sync_rollout_weights()  # version 0: the engine holds the actor's weights
    rollout, chunk = worker.rollout, 3
    response_length = worker.config.rollout.response_length  # 8: a chunk of 3, then the 5 others
    monkeypatch.setattr(vllm_rollout, "PARTIAL_CHUNK_TOKENS", chunk)
    # version 1: another seeded model of the same shape, whose greedy continuations differ from version 0's
    new_model = Qwen2ForCausalLM.from_pretrained(write_head_dim_64_model(tmp_path / "v1", seed=1)).float().eval()
    new_weights = dict(new_model.state_dict())
    prompts = prompts_of(worker, do_sample=False)
    old = rollout.generate_sequences(prompts)  # no switch: one call, version 0 throughout

    switch = WeightSwitch(lambda weights: rollout.load_weights(iter(weights.items())), version=0)
    generate_tokens = rollout._generate_tokens

    def stage_after_the_first_call(*args):
        out = generate_tokens(*args)
        if switch.version == 0:  # the trainer's next weights arrive while the first chunk is generated
            switch.stage(new_weights, 1)
        return out

    monkeypatch.setattr(rollout, "_generate_tokens", stage_after_the_first_call)
    monkeypatch.setattr(rollout, "weight_switch", switch)
    try:
        out = rollout.generate_sequences(prompts)
    finally:
        monkeypatch.undo()
        worker._sync_rollout_weights()  # the module's later tests expect the actor's weights
    responses, mask = out.batch["responses"], out.batch["response_mask"].bool()
    # the first chunk came from version 0 (the greedy tokens of the call without a switch), the rest from version 1
    expected_versions = torch.tensor([0] * chunk + [1] * (response_length - chunk)).expand(len(out), -1)
    assert torch.equal(out.batch[WEIGHT_VERSION_KEY], expected_versions)
    first = mask[:, :chunk]
    assert torch.equal(responses[:, :chunk][first], old.batch["responses"][:, :chunk][first])
    # version 1's greedy continuation of each row's prompt and first chunk, token by token with transformers
    continued = mask[:, chunk].nonzero(as_tuple=True)[0]
    assert continued.numel() > 0  # some rows had not ended after the first chunk
    with torch.no_grad():
        for row in continued.tolist():
            ids = out.batch["prompts"][row][out.batch["attention_mask"][row, :-response_length].bool()].tolist()
            ids += responses[row, :chunk].tolist()
            for _ in range(response_length - chunk):
                ids.append(int(new_model(torch.tensor([ids])).logits[0, -1].argmax()))
            tail = torch.tensor(ids[-(response_length - chunk) :])
            row_mask = mask[row, chunk:]
            assert torch.equal(responses[row, chunk:][row_mask], tail[row_mask])
    # and version 1 changed what was sampled: the rows continued differ from the call without a switch
    assert not torch.equal(responses[continued, chunk:], old.batch["responses"][continued, chunk:])
