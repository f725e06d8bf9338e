"""verl's fsdp_config.model_dtype and fsdp_config.mixed_precision at start-up: the dtypes they give each FSDP2 model
(verl.workers.config.precision.fsdp_precision), verl's spellings and its "+key=value" form, and the combinations the
fp16 contract refuses, with the key named and the fix said."""

import pytest

from verl.workers.config import compose_ppo_config
from verl.workers.config.precision import FSDPPrecision, fsdp_precision

ACTOR = "actor_rollout_ref.actor.fsdp_config"
REF = "actor_rollout_ref.ref.fsdp_config"
CRITIC = "critic.model.fsdp_config"
KL = "actor_rollout_ref.actor.use_kl_loss=true"  # builds a reference
GAE = "algorithm.adv_estimator=gae"  # trains a critic


def actor_precision(*overrides: str) -> FSDPPrecision:
    actor = compose_ppo_config(list(overrides)).actor_rollout_ref.actor
    return fsdp_precision(actor.dtype, actor.fsdp_config, trainable=True, key=ACTOR)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_null_keys_keep_fp32_shards_gathered_in_the_compute_dtype_and_fp32_reductions(dtype):
    # the defaults are the behaviour before these keys existed: fp32 master shards, gathered in dtype, fp32 reduce,
    # fp32 buffers
    assert actor_precision(f"actor_rollout_ref.actor.dtype={dtype}") == FSDPPrecision(
        compute=dtype, model="float32", param=dtype, reduce="float32", buffer="float32"
    )


def test_verl_npu_scripts_mixed_precision_on_the_fp16_default():
    # run_qwen3-32b_npu.sh's three keys, with its "+" spelling; dtype stays float16 (this project's default): the
    # weights are gathered in bf16 and reduced in bf16, the compute stays fp16 under autocast, the shards fp32
    precision = actor_precision(
        f"+{ACTOR}.mixed_precision.param_dtype=bf16",
        f"+{ACTOR}.mixed_precision.reduce_dtype=bf16",
        f"+{ACTOR}.mixed_precision.buffer_dtype=fp32",
    )
    assert precision == FSDPPrecision(
        compute="float16", model="float32", param="bfloat16", reduce="bfloat16", buffer="float32"
    )
    assert precision.gathers_coarser_than_compute


def test_bf16_master_weights_with_bf16_training_in_both_spellings():
    # run_gptoss_20b.sh's "+...model_dtype=bfloat16", with the bf16 training verl's scripts run
    for spelling in ("bfloat16", "bf16"):
        precision = actor_precision(f"+{ACTOR}.model_dtype={spelling}", "actor_rollout_ref.actor.dtype=bfloat16")
        assert (precision.model, precision.compute, precision.param) == ("bfloat16", "bfloat16", "bfloat16")
    assert not precision.gathers_coarser_than_compute


def test_a_null_mixed_precision_section_is_verls_default():
    config = compose_ppo_config([f"{ACTOR}.mixed_precision=null"]).actor_rollout_ref.actor.fsdp_config
    assert (config.mixed_precision.param_dtype, config.mixed_precision.reduce_dtype) == (None, None)


@pytest.mark.parametrize(("model_dtype", "kept_in"), [("fp16", "float16"), ("bf16", "bfloat16"), ("fp32", "float32")])
def test_the_frozen_reference_may_be_kept_in_any_dtype(model_dtype, kept_in):
    config = compose_ppo_config([KL, f"{REF}.model_dtype={model_dtype}"])
    ref = fsdp_precision("float16", config.actor_rollout_ref.ref.fsdp_config, trainable=False, key=REF)
    # no optimizer, so no master copy to protect; it computes in the actor's dtype (fp16 here) whatever it is kept in
    assert (ref.model, ref.compute, ref.param) == (kept_in, "float16", "float16")


def test_the_critic_trains_bf16_master_weights_with_its_own_bf16_dtype():
    config = compose_ppo_config([GAE, f"{CRITIC}.model_dtype=bf16", "critic.dtype=bfloat16"])
    assert config.critic.model.fsdp_config.model_dtype == "bf16"


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        # gptoss's key on this project's fp16 default: the fp16 contract keeps fp32 master weights
        (
            [f"+{ACTOR}.model_dtype=bfloat16"],
            rf"{ACTOR}.model_dtype=bfloat16 with actor_rollout_ref.actor.dtype=float16 .*fp16 training keeps fp32 "
            rf"master weights.*Set {ACTOR}.model_dtype=fp32 \(or leave it null\), or actor_rollout_ref.actor.dtype="
            "bfloat16",
        ),
        # the brief's own example: fp16 master weights under the fp16 loss scale
        (
            [f"{ACTOR}.model_dtype=fp16"],
            rf"{ACTOR}.model_dtype=fp16 would keep the weights the optimizer updates \(the master copy\) in fp16.*"
            "loss scale of fp16 training exists so that the master weights can stay in fp32",
        ),
        (
            [f"{ACTOR}.model_dtype=float16", "actor_rollout_ref.actor.dtype=bfloat16"],
            "without a loss scale, small gradients and updates underflow in fp16",
        ),
        (
            [f"{ACTOR}.model_dtype=bf16", "actor_rollout_ref.actor.dtype=float32"],
            "float32 training keeps its weights in fp32",
        ),
        (
            [f"{ACTOR}.mixed_precision.param_dtype=fp16", "actor_rollout_ref.actor.dtype=bfloat16"],
            rf"param_dtype=fp16 with actor_rollout_ref.actor.dtype=bfloat16: the gradients would pass through fp16 "
            rf".*Set {ACTOR}.mixed_precision.param_dtype=bf16 \(or null\)",
        ),
        (
            [f"{ACTOR}.mixed_precision.reduce_dtype=float16", "actor_rollout_ref.actor.dtype=float32"],
            rf"Set {ACTOR}.mixed_precision.reduce_dtype=fp32 \(or null\)",
        ),
        (
            [f"{ACTOR}.mixed_precision.param_dtype=bf16", "actor_rollout_ref.actor.dtype=float32"],
            r"the model would compute in bfloat16, not in the fp32 the run asks for\. Set actor_rollout_ref.actor"
            r".dtype=bfloat16",
        ),
        ([KL, f"{REF}.mixed_precision.reduce_dtype=fp32"], "the frozen reference computes no gradients"),
        (
            [GAE, f"{CRITIC}.model_dtype=bf16"],
            rf"{CRITIC}.model_dtype=bf16 with critic.dtype=float16 .*Set {CRITIC}.model_dtype=fp32",
        ),
        ([f"{ACTOR}.model_dtype=half"], r"model_dtype='half' is not supported; use one of 'fp32', 'float32', 'bf16'"),
        ([f"{ACTOR}.mixed_precision.cast_forward_inputs=true"], r"Could not override|is not a known config key"),
    ],
)
def test_contradictions_are_refused_at_start_up_with_the_key_and_the_fix(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


def test_precision_keys_on_another_backend_are_refused_as_read_by_nothing():
    with pytest.raises(ValueError, match=rf"{ACTOR} is set, but nothing reads it: it applies with .*strategy=fsdp2"):
        compose_ppo_config(["actor_rollout_ref.actor.strategy=dp", f"{ACTOR}.model_dtype=fp32"])


def test_the_critics_keys_are_checked_only_when_it_trains():
    # no critic in a GRPO run: its precision keys are not read (as its other fsdp_config keys); with GAE the same
    # value is refused (above)
    config = compose_ppo_config([f"{CRITIC}.model_dtype=bf16"])
    assert not config.needs_critic and config.critic.model.fsdp_config.model_dtype == "bf16"
