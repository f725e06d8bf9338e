"""verl's fsdp_config.model_dtype and fsdp_config.mixed_precision at start-up: the dtypes they give each FSDP2 model
(verl.workers.config.precision.fsdp_precision), verl's spellings and its "+key=value" form, verl's defaults per role,
and the combinations that cannot train, refused with the key named and the fix said."""

import pytest

from verl.workers.config import compose_ppo_config
from verl.workers.config.precision import FSDPPrecision, fsdp_precision, model_dtype_of

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


def test_verls_yaml_default_is_fp32_for_every_role_and_null_takes_verls_default_per_role():
    config = compose_ppo_config([KL, GAE])
    arr = config.actor_rollout_ref
    sections = (arr.actor.fsdp_config, arr.ref.fsdp_config, config.critic.model.fsdp_config)
    assert [section.model_dtype for section in sections] == ["fp32", "fp32", "fp32"]  # verl's engine/fsdp.yaml
    # null: what verl's engine code takes for an absent key: fp32 to train, bf16 for a forward-only model
    nulled = compose_ppo_config([KL, f"{ACTOR}.model_dtype=null", f"{REF}.model_dtype=null"]).actor_rollout_ref
    assert model_dtype_of(nulled.actor.fsdp_config, trainable=True) == "float32"
    assert model_dtype_of(nulled.ref.fsdp_config, trainable=False) == "bfloat16"
    ref = fsdp_precision("float16", nulled.ref.fsdp_config, trainable=False, key=REF)
    assert (ref.model, ref.param) == ("bfloat16", "float16")  # kept in bf16, gathered for the fp16 compute


def test_bf16_master_weights_on_the_fp16_default_keep_the_fp16_compute_and_its_loss_scale():
    # run_qwen3_next_80b_a3b_fsdp.sh: model_dtype=bfloat16 and "+...reduce_dtype=bf16" with dtype left at this
    # project's float16: the shards (and AdamW's moments) are bf16, FSDP2 still gathers in fp16 for the fp16 compute
    # (whose loss scale the optimizer keeps, since it is built from dtype), gradients reduced in bf16
    precision = actor_precision(f"{ACTOR}.model_dtype=bfloat16", f"+{ACTOR}.mixed_precision.reduce_dtype=bf16")
    assert precision == FSDPPrecision(
        compute="float16", model="bfloat16", param="float16", reduce="bfloat16", buffer="float32"
    )
    assert precision.master_coarser_than_compute and not precision.gathers_coarser_than_compute
    # bf16 training (verl's meaning of the key) rounds nothing more than the compute does: no warning
    assert not actor_precision(
        f"{ACTOR}.model_dtype=bf16", "actor_rollout_ref.actor.dtype=bfloat16"
    ).master_coarser_than_compute
    fp32 = actor_precision(f"{ACTOR}.model_dtype=bf16", "actor_rollout_ref.actor.dtype=float32")
    assert (fp32.model, fp32.param) == ("bfloat16", "float32") and fp32.master_coarser_than_compute


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
    # run_qwen3_8b_merge_fsdp.sh's "model_dtype=bf16", with the bf16 training verl's scripts run
    for spelling in ("bfloat16", "bf16"):
        precision = actor_precision(f"{ACTOR}.model_dtype={spelling}", "actor_rollout_ref.actor.dtype=bfloat16")
        assert (precision.model, precision.compute, precision.param) == ("bfloat16", "bfloat16", "bfloat16")
    assert not precision.gathers_coarser_than_compute


def test_the_plus_spelling_is_refused_as_verls_hydra_refuses_it():
    # run_gpt_oss_20b_fsdp.sh's "+...model_dtype=bfloat16" does not compose in verl 1dda039 either: verl's
    # engine/fsdp.yaml defines model_dtype (fp32), and Hydra's "+" adds only keys a config lacks
    with pytest.raises(ValueError, match=rf"^\+{ACTOR}.model_dtype=\.\.\.: {ACTOR}.model_dtype is a key of the config"):
        compose_ppo_config([f"+{ACTOR}.model_dtype=bfloat16"])


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
        # fp16 master weights (and AdamW moments) cannot train, under the fp16 loss scale or without one
        (
            [f"{ACTOR}.model_dtype=fp16"],
            rf"{ACTOR}.model_dtype=fp16 would keep the weights the optimizer updates \(the master copy\), and with "
            rf"them AdamW's moments, in fp16 \(actor_rollout_ref.actor.dtype=float16\).*It cannot train\. Set "
            rf"{ACTOR}.model_dtype=fp32",
        ),
        (
            [f"{ACTOR}.model_dtype=float16", "actor_rollout_ref.actor.dtype=bfloat16"],
            "second moment, a gradient squared, underflows to zero in fp16",
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
        ([GAE, f"{CRITIC}.model_dtype=fp16"], rf"{CRITIC}.model_dtype=fp16 .*\(critic.dtype=float16\)"),
        ([f"{ACTOR}.model_dtype=half"], r"model_dtype='half' is not supported; use one of 'fp32', 'float32', 'bf16'"),
        ([f"{ACTOR}.mixed_precision.cast_forward_inputs=true"], r"Could not override|is not a known config key"),
    ],
)
def test_contradictions_are_refused_at_start_up_with_the_key_and_the_fix(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


def test_precision_keys_on_another_backend_are_refused_as_read_by_nothing():
    with pytest.raises(ValueError, match=rf"{ACTOR} is set, but nothing reads it: it applies with .*strategy=fsdp2"):
        compose_ppo_config(["actor_rollout_ref.actor.strategy=dp", f"{ACTOR}.model_dtype=bf16"])


def test_the_critics_keys_are_checked_only_when_it_trains():
    # no critic in a GRPO run: its precision keys are not read (as its other fsdp_config keys); with GAE the same
    # value is refused (above)
    config = compose_ppo_config([f"{CRITIC}.model_dtype=fp16"])
    assert not config.needs_critic and config.critic.model.fsdp_config.model_dtype == "fp16"
