"""verl's ``actor_rollout_ref.rollout`` keys (and ``hybrid_engine``, ``nccl_timeout``): what each accepts, what it
refuses and how the refusal names the key, as verl's example scripts set them."""

import pytest

from verl.workers.config import RolloutConfig, compose_ppo_config, load_section
from verl.workers.rollout.vllm_engine import engine_index

R = "actor_rollout_ref.rollout"


def test_the_default_section_builds_with_verls_keys():
    rollout = load_section(RolloutConfig)
    assert (rollout.mode, rollout.multi_turn.enable, rollout.calculate_log_probs) == ("sync", False, True)
    assert (rollout.data_parallel_size, rollout.expert_parallel_size, rollout.pipeline_model_parallel_size) == (1, 1, 1)
    assert rollout.val_kwargs.as_overrides() == {
        "n": 1,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "do_sample": False,
    }


def test_what_verls_scripts_set_is_accepted():
    # the rollout keys of examples/grpo_trainer and examples/ppo_trainer, with this machine's sizes (one rank)
    config = compose_ppo_config(
        [
            f"{R}.name=vllm",
            f"{R}.mode=async",
            f"{R}.calculate_log_probs=True",
            f"{R}.multi_turn.format=hermes",
            f"{R}.load_format=safetensors",
            f"{R}.layered_summon=True",
            f"{R}.multi_stage_wake_up=True",
            f"{R}.enable_chunked_prefill=False",
            f"{R}.enforce_eager=False",
            f"{R}.free_cache_engine=True",
            f"{R}.max_num_batched_tokens=10240",
            f"{R}.cudagraph_capture_sizes=[1,2,4,8,16,32]",
            f"{R}.checkpoint_engine.update_weights_bucket_megabytes=4096",
            f"{R}.data_parallel_size=1",
            f"{R}.expert_parallel_size=1",
            f"{R}.val_kwargs.top_p=0.7",
            f"{R}.val_kwargs.top_k=-1",
            f"{R}.val_kwargs.temperature=0.6",
            f"{R}.val_kwargs.n=4",
            f"{R}.val_kwargs.do_sample=True",
            "actor_rollout_ref.hybrid_engine=True",
            "actor_rollout_ref.hybrid_engine=False",
            "rollout.n_gpus_per_node=2",
            "actor_rollout_ref.nccl_timeout=1200",
        ]
    )
    arr = config.actor_rollout_ref
    assert (arr.rollout.mode, arr.rollout.load_format, arr.nccl_timeout) == ("async", "safetensors", 1200.0)
    assert arr.rollout.val_kwargs.as_overrides() == {
        "n": 4,
        "temperature": 0.6,
        "top_k": -1,
        "top_p": 0.7,
        "do_sample": True,
    }


def test_verls_agent_workers_and_tokenizer_switch_are_accepted():
    # grpo_qwen35_35b_megatron_async.sh and run_qwen3_30b_a3b_megatron.sh: no agent-loop processes exist here (any
    # count gives the same rollouts); skip_tokenizer_init is the vLLM engine's (tests/workers/rollout/test_vllm_engine)
    rollout = compose_ppo_config(
        [f"{R}.name=vllm", f"{R}.mode=async", f"{R}.agent.num_workers=2", f"{R}.skip_tokenizer_init=True"]
    ).actor_rollout_ref.rollout
    assert (rollout.agent.num_workers, rollout.skip_tokenizer_init) == (2, True)
    with pytest.raises(ValueError, match=rf"{R}.agent.num_workers"):
        compose_ppo_config([f"{R}.agent.num_workers=0"])
    # the engine's switch, with another rollout: nothing would read it
    with pytest.raises(ValueError, match=rf"{R}.skip_tokenizer_init is set, but nothing reads it"):
        compose_ppo_config([f"{R}.skip_tokenizer_init=false"])


@pytest.mark.parametrize(
    "overrides, match",
    [
        ([f"{R}.name=sglang"], rf"{R}\.name=sglang: SGLang rollouts are out of scope"),
        ([f"{R}.name=trtllm"], rf"{R}\.name=trtllm: TensorRT-LLM rollouts are out of scope"),
        (
            ["+" + f"{R}.engine_kwargs.sglang.attention_backend=triton"],
            rf"{R}\.engine_kwargs\.sglang is set, but SGLang",
        ),
        (
            [f"{R}.multi_turn.interaction_config_path=chat.yaml"],
            rf"{R}\.multi_turn\.interaction_config_path is set, but verl's interactions",
        ),
        (
            [f"{R}.multi_turn.enable=true", f"{R}.multi_turn.format=llama3_json"],
            rf"{R}\.multi_turn\.format.*registered tool parsers",
        ),
        ([f"{R}.data_parallel_size=2"], rf"{R}\.data_parallel_size=2: the colocated engines are data parallel already"),
        ([f"{R}.expert_parallel_size=2"], rf"{R}\.expert_parallel_size=2: expert parallelism"),
        ([f"{R}.pipeline_model_parallel_size=2"], rf"{R}\.pipeline_model_parallel_size=2: the colocated vLLM engine"),
        ([f"{R}.mode=streaming"], rf"{R}\.mode"),
        ([f"{R}.checkpoint_engine.backend=nccl"], rf"{R}\.checkpoint_engine\.backend"),
        (
            [f"{R}.name=hf", "actor_rollout_ref.actor.strategy=dp", f"{R}.ignore_eos=true"],
            rf"{R}\.ignore_eos=true is not",
        ),
        (
            ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=3"],
            r"data\.train_batch_size=16 must be a multiple of the 3 rollout workers",
        ),
        (["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=0"], r"rollout\.nnodes must be an integer >= 1"),
        # the rollout group's keys with the rollout in the actor workers: nothing reads them
        (["async_training.staleness_threshold=0.5"], r"async_training\.staleness_threshold is set, but nothing reads"),
        (
            ["rollout.n_gpus_per_node=2"],
            r"rollout\.n_gpus_per_node is set, but nothing reads it: .*hybrid_engine=false",
        ),
        (["data.gen_batch_size=4"], r"data\.gen_batch_size is set, but nothing reads it"),
        (
            [
                "actor_rollout_ref.hybrid_engine=false",
                "async_training.partial_rollout=true",
                f"{R}.name=hf",
                "actor_rollout_ref.actor.strategy=dp",
            ],
            r"partial_rollout=true with actor_rollout_ref\.rollout\.name=hf",
        ),
        (
            ["actor_rollout_ref.hybrid_engine=false", "async_training.use_trainer_do_validate=true"],
            r"async_training\.use_trainer_do_validate=true validates on the trainer's workers",
        ),
        (["actor_rollout_ref.hybrid_engine=false", "async_training.staleness_threshold=-1"], r"must be a number >= 0"),
        (["actor_rollout_ref.nccl_timeout=0"], r"actor_rollout_ref\.nccl_timeout must be a number > 0"),
        ([f"{R}.val_kwargs.top_p=0"], rf"{R}\.val_kwargs\.top_p must be a number > 0"),
        ([f"{R}.prompt_length=4"], rf"{R}\.prompt_length=4 is shorter than data\.max_prompt_length"),
        # verl's calculate_log_probs=false leaves the rollout's log-probs out; correction needs them
        (
            [f"{R}.calculate_log_probs=false", "algorithm.rollout_correction.rollout_is=token"],
            rf"{R}\.calculate_log_probs=false leaves the rollout's log-probs out of the batch",
        ),
        # the vLLM-only keys do nothing with the naive rollout (which samples from the training model)
        (
            [f"{R}.load_format=safetensors"],
            rf"{R}\.load_format is set, but nothing reads it: it applies with {R}\.name=vllm",
        ),
    ],
)
def test_refused_values_name_their_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        compose_ppo_config(overrides)


@pytest.mark.parametrize("name", ["naive", "vllm"])
def test_partial_rollouts_take_the_naive_and_vllm_rollouts(name):
    # naive stops between two tokens for new weights, vllm between two engine calls of at most 32 tokens each (the
    # hf rollout, which finishes with the weights it started with, is refused: see test_refused_values_name_their_key)
    config = compose_ppo_config(
        ["actor_rollout_ref.hybrid_engine=false", "async_training.partial_rollout=true", f"{R}.name={name}"]
    )
    assert config.async_training.partial_rollout and config.actor_rollout_ref.rollout.name == name


def test_a_megatron_actor_feeds_a_rollout_group_of_its_own():
    # verl's dapo_7b_math_megatron_4_12 layout (4 actor ranks: 2 tensor-parallel x 2 stages, vLLM on a group of its
    # own): the actor gathers its shards and stages into Hugging Face weights for the group
    config = compose_ppo_config(
        [
            "actor_rollout_ref.hybrid_engine=false",
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
            "trainer.n_gpus_per_node=4",
            f"{R}.name=vllm",
            "rollout.n_gpus_per_node=2",
        ]
    )
    assert config.separate_rollout and config.rollout.world_size == 2


@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_naive_rollout_tensor_parallel_needs_a_model_split_that_way(strategy):
    overrides = [
        f"actor_rollout_ref.actor.strategy={strategy}",
        f"{R}.tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    ]
    with pytest.raises(ValueError, match=rf"{R}\.tensor_model_parallel_size=2 with {R}\.name=naive: .* must be 1 with"):
        compose_ppo_config(overrides)


def test_naive_rollout_tensor_parallel_must_match_the_megatron_actors():
    overrides = [
        "actor_rollout_ref.actor.strategy=megatron",
        f"{R}.tensor_model_parallel_size=2",
        "trainer.n_gpus_per_node=2",
    ]
    with pytest.raises(
        ValueError, match=r"must be the megatron actor's actor_rollout_ref\.actor\.megatron\.tensor_model_"
    ):
        compose_ppo_config(overrides)


def test_vllm_tensor_parallel_must_divide_the_ranks_and_groups_consecutive_ranks():
    with pytest.raises(ValueError, match=rf"{R}\.tensor_model_parallel_size=2 does not divide the actor's 3 ranks"):
        compose_ppo_config([f"{R}.name=vllm", f"{R}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=3"])
    rollout = compose_ppo_config(
        [f"{R}.name=vllm", f"{R}.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"]
    ).actor_rollout_ref.rollout
    # ranks 0, 1 share engine 0 (and its seeds), ranks 2, 3 (on a second node, say) engine 1
    assert [engine_index(rollout, rank) for rank in range(4)] == [0, 0, 1, 1]
    naive = load_section(RolloutConfig)
    assert [engine_index(naive, rank) for rank in range(4)] == [0, 1, 2, 3]


def test_switching_to_another_rollout_names_every_vllm_key_to_drop_in_one_message():
    # issue 51: a verl script moved to the naive rollout used to hear of these one start-up at a time
    overrides = [f"{R}.gpu_memory_utilization=0.3", f"{R}.load_format=safetensors", f"{R}.layered_summon=true"]
    with pytest.raises(ValueError) as info:
        compose_ppo_config(overrides)
    message = str(info.value)
    assert message.startswith("3 settings are set, but nothing reads them")
    for name in ("gpu_memory_utilization", "load_format", "layered_summon"):
        assert f"  - {R}.{name}: applies with {R}.name=vllm (the rollout is naive)" in message
