"""The workers give the GPU memory their offload freed back to the driver, once per pass of an offloading model:
the fsdp2 actor and critic workers (``param_offload``/``offload_policy``, ``optimizer_offload``), the reward model
under ``param_offload``, and the vLLM rollout after it sleeps. The CUDA calls are recorded
(:mod:`tests.utils.device_calls`); what the releases give back on a GPU is checked by
tests/special_gpu/test_offload_release_gpu.py.
"""

import types

import pytest
import torch

from tests.utils.device_calls import num_releases, record_device_calls
from tests.workers.actor.conftest import world_of_one  # noqa: F401  (FSDP2 needs a process group)
from tests.workers.built import built_worker
from tests.workers.test_reward_model import PROMPTS, RESPONSES, build_tiny_rm, rollout_batch
from verl.protocol import DataProto
from verl.workers.config import compose_ppo_config
from verl.workers.fsdp_workers import FSDPActorRolloutRefWorker, FSDPCriticWorker
from verl.workers.reward_model import RewardModelWorker
from verl.workers.rollout.vllm_rollout import VLLMRollout

ACTOR, CRITIC = "actor_rollout_ref.actor.fsdp_config", "critic.model.fsdp_config"


@pytest.fixture
def device_calls(monkeypatch) -> list[str]:
    return record_device_calls(monkeypatch)


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    return build_tiny_rm(tmp_path_factory.mktemp("tiny_rm"))


def fsdp_workers(*overrides: str):
    config = compose_ppo_config(["actor_rollout_ref.actor.strategy=fsdp", "algorithm.adv_estimator=gae", *overrides])
    workers = [built_worker(cls, config, 4) for cls in (FSDPActorRolloutRefWorker, FSDPCriticWorker)]
    for worker in workers:
        worker.init_model()
    return workers


def prompts(num_prompts: int = 16, width: int = 6):
    """A batch of left-padded prompts of the tiny model's vocabulary (ids 3..49; 0 pads): the config's
    train_batch_size, whose n=4 responses each make one mini-batch of the actor and the critic."""
    ids = torch.arange(num_prompts * width).reshape(num_prompts, width) % 47 + 3
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    ids = ids * mask
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": position_ids})


def releases_per_pass(actor, critic, calls) -> dict[str, int]:
    """Run every pass of one PPO step (generation, log-probs, values, both updates) and count the releases each made."""
    counts, batch = {}, None

    def counted(name, run):
        before = num_releases(calls)
        result = run()
        counts[name] = num_releases(calls) - before
        return result

    batch = counted("gen", lambda: actor.generate_sequences(prompts()))
    batch.batch["old_log_probs"] = counted("old_log_prob", lambda: actor.compute_log_prob(batch)).batch["old_log_probs"]
    values = counted("values", lambda: critic.compute_values(batch)).batch["values"]
    sign = torch.where(torch.arange(len(batch))[:, None] % 2 == 0, 1.0, -1.0)
    batch.batch["advantages"] = sign * batch.batch["response_mask"]
    batch.batch["values"], batch.batch["returns"] = values, values + batch.batch["advantages"]
    counted("update_actor", lambda: actor.update_actor(batch))
    counted("update_critic", lambda: critic.update_critic(batch))
    return counts


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize(
    ("overrides", "actor_releases", "critic_releases"),
    [
        ([], 0, 0),  # nothing offloaded: never a sync for it
        ([f"{ACTOR}.param_offload=true"], 1, 0),
        ([f"{ACTOR}.offload_policy=true", f"{CRITIC}.optimizer_offload=true"], 1, 1),
    ],
)
def test_each_pass_of_an_offloading_fsdp_model_releases_once(device_calls, overrides, actor_releases, critic_releases):
    actor, critic = fsdp_workers(*overrides)
    counts = releases_per_pass(actor, critic, device_calls)
    # once per pass of the model that offloads, whatever its micro-batches and optimizer steps (no sync per step)
    expected = {name: actor_releases for name in ("gen", "old_log_prob", "update_actor")}
    expected |= {name: critic_releases for name in ("values", "update_critic")}
    assert counts == expected


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize(("ref_offload", "actor_offload", "releases"), [(True, False, 1), (False, True, 1), (0, 0, 0)])
def test_the_reference_pass_releases_when_its_model_offloads(device_calls, ref_offload, actor_offload, releases):
    # the reference's pass may run on the actor's model (LoRA's adapters-off reference): either one offloading counts
    actor, _ = fsdp_workers(
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.ref.fsdp_config.param_offload={bool(ref_offload)}",
        f"{ACTOR}.optimizer_offload={bool(actor_offload)}",
    )
    samples = actor.generate_sequences(prompts())
    before = num_releases(device_calls)
    actor.compute_ref_log_prob(samples)
    assert num_releases(device_calls) - before == releases


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize(("strategy", "offload", "releases"), [("fsdp", True, 1), ("fsdp", False, 0), ("dp", False, 0)])
def test_the_reward_model_releases_after_each_scoring_call_under_param_offload(
    tiny_rm, device_calls, strategy, offload, releases
):
    config = compose_ppo_config(
        [
            "reward_model.enable=true",
            f"reward_model.strategy={strategy}",
            f"reward_model.model.path={tiny_rm}",
            "reward_model.model.input_tokenizer=null",
            "reward_model.micro_batch_size_per_gpu=2",  # two forward passes per call: still one release
            f"reward_model.model.fsdp_config.param_offload={offload}",
            "trainer.device=cpu",
        ]
    )
    worker = RewardModelWorker.from_config(config)
    worker.init_model()
    scores = worker.compute_rm_score(rollout_batch(PROMPTS, RESPONSES)).batch["rm_scores"]
    assert scores.shape == (len(PROMPTS), 5)
    assert num_releases(device_calls) == releases


class SleepyEngine:
    """The parts of a ``vllm.LLM`` that VLLMRollout's sleep and wake use, recording their calls."""

    def __init__(self, calls: list[str], enable_sleep_mode: bool = True):
        self.calls = calls
        self.model_config = types.SimpleNamespace(enable_sleep_mode=enable_sleep_mode)

    def generate(self, *args, **kwargs):
        raise AssertionError("not generating here")

    def collective_rpc(self, *args, **kwargs):
        raise AssertionError("not loading weights here")

    def sleep(self, level: int):
        self.calls.append(f"engine.sleep({level})")

    def wake_up(self, tags=None):
        self.calls.append("engine.wake_up")


@pytest.mark.parametrize("enable_sleep_mode", [True, False])
def test_the_vllm_rollout_releases_after_the_engine_sleeps(device_calls, enable_sleep_mode):
    sampling = compose_ppo_config([]).actor_rollout_ref.rollout.sampling_options()
    rollout = VLLMRollout(SleepyEngine(device_calls, enable_sleep_mode), sampling, pad_token_id=0, eos_token_id=2)
    rollout.sleep()
    rollout.sleep()  # asleep already: nothing more
    rollout.wake_up()
    # the engine's own pool first, then what this process's allocator cached; nothing without sleep mode (CPU)
    expected = ["engine.sleep(1)", "synchronize", "empty_cache", "engine.wake_up"] if enable_sleep_mode else []
    assert device_calls == expected
