"""The model-based reward (``reward_model.enable``) on a tiny sequence-classification model built here.

The scores must be what a plain Hugging Face forward of each unpadded sequence gives (the model's output at the last
token), on the response's last token; ``max_length`` must cut the sequence the model reads; micro-batching (by count,
by token budget, padding-free) must not change a score; the worker must score the same on dp and FSDP2; and the
config must refuse what it does not run.
"""

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

from tests.workers.actor.conftest import world_of_one  # noqa: F401  (FSDP2 needs a process group)
from verl.protocol import DataProto
from verl.workers.config import compose_ppo_config
from verl.workers.reward_model import (
    RewardModelScorer,
    RewardModelWorker,
    expand_to_token_level,
    load_reward_model,
    load_tokenizers,
)

PAD, EOS = 0, 2


def build_tiny_rm(path, head_std: float = 1.0) -> str:
    """A 2-layer Qwen2 reward model (vocabulary of the embedded tokenizer, one label), saved at ``path`` with that
    tokenizer; its head weights are drawn with ``head_std``, far from zero, so that sequences score visibly apart."""
    from verl.models.loading import load_tokenizer

    config = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=PAD,
        eos_token_id=EOS,
        num_labels=1,
    )
    torch.manual_seed(0)
    model = Qwen2ForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0.0, head_std)
    model.save_pretrained(path)
    load_tokenizer("default").save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory):
    return build_tiny_rm(tmp_path_factory.mktemp("tiny_rm"))


def rollout_batch(prompts: list[list[int]], responses: list[list[int]], prompt_width=6, response_width=5) -> DataProto:
    """A batch laid out as the rollout returns it: left-padded prompts, right-padded responses."""
    num_rows = len(prompts)
    prompt_ids = torch.full((num_rows, prompt_width), PAD)
    response_ids = torch.full((num_rows, response_width), PAD)
    mask = torch.zeros((num_rows, prompt_width + response_width), dtype=torch.long)
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids[i, prompt_width - len(prompt) :] = torch.tensor(prompt)
        response_ids[i, : len(response)] = torch.tensor(response)
        mask[i, prompt_width - len(prompt) : prompt_width + len(response)] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": response_ids,
            "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        }
    )


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14], [15, 16]]
RESPONSES = [[20, 21, EOS], [22], [23, 24, 25, 26, 27], [28, 29]]


def reward_config(tiny_rm: str, *overrides: str):
    return compose_ppo_config(
        [
            "reward_model.enable=true",
            f"reward_model.model.path={tiny_rm}",
            "reward_model.model.input_tokenizer=null",
            "reward_model.micro_batch_size_per_gpu=4",
            *overrides,
        ]
    ).reward_model


def scorer(tiny_rm: str, *overrides: str) -> RewardModelScorer:
    return RewardModelScorer(reward_config(tiny_rm, *overrides), load_reward_model(tiny_rm), "cpu")


@torch.no_grad()
def hf_score(tiny_rm: str, ids: list[int]) -> float:
    """A direct Hugging Face forward of one unpadded sequence: its pooled logit (the last token's)."""
    model = AutoModelForSequenceClassification.from_pretrained(tiny_rm, dtype=torch.float32).eval()
    return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_scores_equal_a_direct_hf_forward_on_the_last_response_token(tiny_rm):
    batch = rollout_batch(PROMPTS, RESPONSES)
    rm_scores = scorer(tiny_rm).compute_rm_score(batch).batch["rm_scores"]
    assert rm_scores.shape == (4, 5) and rm_scores.dtype == torch.float32
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        last = len(response) - 1  # the score sits on the response's last token, zeros elsewhere (verl's rm_scores)
        assert rm_scores[i, last].item() == pytest.approx(hf_score(tiny_rm, prompt + response), abs=1e-5)
        assert torch.count_nonzero(rm_scores[i]) == 1
    assert len(set(rm_scores.sum(-1).tolist())) == 4  # four sequences, four different scores


def test_max_length_cuts_what_the_model_reads(tiny_rm):
    batch = rollout_batch(PROMPTS, RESPONSES)
    rm_scores = scorer(tiny_rm, "reward_model.max_length=4").compute_rm_score(batch).batch["rm_scores"]
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        # the model reads the first 4 tokens of prompt + response; the score stays on the response's last token
        expected = hf_score(tiny_rm, (prompt + response)[:4])
        assert rm_scores[i, len(response) - 1].item() == pytest.approx(expected, abs=1e-5)
    # row 1: 6 prompt tokens, so the model saw the prompt's first 4 only, and its score is not the whole sequence's
    assert rm_scores[1, 0].item() != pytest.approx(hf_score(tiny_rm, PROMPTS[1] + RESPONSES[1]), abs=1e-4)


@pytest.mark.parametrize(
    "overrides",
    [
        ("reward_model.micro_batch_size_per_gpu=1",),
        ("reward_model.micro_batch_size_per_gpu=3",),
        ("reward_model.micro_batch_size_per_gpu=null", "reward_model.micro_batch_size=2"),
        ("reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=9"),
        ("reward_model.model.use_remove_padding=true", "reward_model.micro_batch_size_per_gpu=2"),
    ],
)
def test_micro_batching_gives_the_same_scores(tiny_rm, overrides):
    batch = rollout_batch(PROMPTS, RESPONSES)
    whole = scorer(tiny_rm).compute_rm_score(batch).batch["rm_scores"]
    split = scorer(tiny_rm, *overrides).compute_rm_score(batch).batch["rm_scores"]
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=0)


def test_a_sharded_scorer_runs_as_many_forwards_as_the_busiest_rank(tiny_rm, monkeypatch):
    # Every forward of an FSDP2 model is a collective. Rows of 6, 7, 6 and 4 real tokens with a budget of 13 tokens
    # make 2 micro-batches here (sorted 4, 6 | 6, 7); a rank that cut 3 makes this one cut its first micro-batch in
    # two, so that both run 3 forwards, and no row is scored twice or left out.
    from verl.utils import micro_batching

    monkeypatch.setattr(micro_batching.dist, "all_reduce", lambda tensor, op=None, group=None: tensor.fill_(3))
    config = reward_config(
        tiny_rm, "reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=13"
    )
    sharded = RewardModelScorer(config, load_reward_model(tiny_rm), "cpu", process_group=object())
    forwards = []
    real_score = sharded.score_micro_batch
    monkeypatch.setattr(sharded, "score_micro_batch", lambda micro: forwards.append(len(micro)) or real_score(micro))
    batch = rollout_batch(PROMPTS, RESPONSES)
    scores = sharded.compute_rm_score(batch).batch["rm_scores"]
    assert forwards == [1, 1, 2]
    torch.testing.assert_close(scores, scorer(tiny_rm).compute_rm_score(batch).batch["rm_scores"], atol=1e-5, rtol=0)


def test_the_global_micro_batch_size_is_split_over_the_ranks(tiny_rm):
    config = reward_config(tiny_rm, "reward_model.micro_batch_size_per_gpu=null", "reward_model.micro_batch_size=8")
    assert config.micro_batching(num_ranks=4).size == 2  # 8 samples over 4 ranks
    with pytest.raises(ValueError, match="micro_batch_size=8 is less than one sample for each of the 16 ranks"):
        config.micro_batching(num_ranks=16)


def test_an_empty_response_gets_no_score():
    # verl places the score on the sequence's last token; with no response token it falls outside the response
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    assert expand_to_token_level(torch.tensor([3.0, 5.0]), mask, 2).tolist() == [[0.0, 0.0], [0.0, 5.0]]


def test_retokenising_with_the_reward_models_tokenizer_scores_the_same_text(tiny_rm):
    # same tokenizer both sides: decoding and re-tokenising "prompt text + response text" must give the same score as
    # tokenising that text directly
    from verl.models.loading import load_tokenizer

    tokenizer = load_tokenizer("default")
    prompts = [tokenizer("3+4=")["input_ids"], tokenizer("12+1=")["input_ids"]]
    responses = [tokenizer("7", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]]
    responses.append(tokenizer("13", add_special_tokens=False)["input_ids"])
    batch = rollout_batch(prompts, responses, prompt_width=8, response_width=4)
    batch.non_tensor_batch["raw_prompt"] = np.array(["3+4=", "12+1="], dtype=object)
    rm = reward_config(tiny_rm, "reward_model.model.input_tokenizer=default")
    scored = RewardModelScorer(rm, load_reward_model(tiny_rm), "cpu", tokenizers=load_tokenizers(rm))
    rm_scores = scored.compute_rm_score(batch).batch["rm_scores"]
    for i, text in enumerate(["3+4=7", "12+1=13"]):
        expected = hf_score(tiny_rm, tokenizer(text)["input_ids"])  # the eos is a special token: decoded away
        assert rm_scores[i, len(responses[i]) - 1].item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.usefixtures("world_of_one")
@pytest.mark.parametrize("strategy", ["dp", "fsdp"])
def test_the_worker_scores_as_the_scorer_does(tiny_rm, strategy):
    config = compose_ppo_config(
        [
            "reward_model.enable=true",
            f"reward_model.strategy={strategy}",
            f"reward_model.model.path={tiny_rm}",
            "reward_model.model.input_tokenizer=null",
            "reward_model.micro_batch_size_per_gpu=2",
            "trainer.device=cpu",
        ]
    )
    worker = RewardModelWorker.from_config(config)
    assert strategy in worker.init_model()
    batch = rollout_batch(PROMPTS, RESPONSES)
    expected = scorer(tiny_rm).compute_rm_score(batch).batch["rm_scores"]
    torch.testing.assert_close(worker.compute_rm_score(batch).batch["rm_scores"], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward_model.micro_batch_size_per_gpu=null"], "micro_batch_size_per_gpu is null"),
        (["reward_model.micro_batch_size=8"], "micro_batch_size and reward_model.micro_batch_size_per_gpu are both"),
        (["reward_model.strategy=megatron"], "strategy=megatron: the reward model runs on Hugging Face models"),
        (["reward_model.model.path=null"], "model.path is empty"),
        (["reward_model.rollout.name=sglang"], "rollout.name='sglang': the reward loop's engines other than vLLM"),
        (["reward_model.rollout.gpu_memory_utilization=1.5"], "rollout.gpu_memory_utilization must be a number"),
        (["reward_model.launch_reward_fn_async=true"], "launch_reward_fn_async=true asks for a verl feature"),
        (["reward_model.sandbox_fusion.url=http://sandbox"], "sandbox_fusion.url='http://sandbox' asks for verl's"),
        (["reward_model.model.fsdp_config.fsdp_size=2"], "fsdp_size=2: the reward model is sharded over all ranks"),
    ],
)
def test_the_config_refuses_what_it_does_not_run(tiny_rm, overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("?", r"\?")):
        reward_config(tiny_rm, *overrides)


def test_a_run_without_a_reward_model_needs_none_of_its_keys():
    rm = compose_ppo_config([]).reward_model
    assert not rm.enable and rm.model.path is None and rm.micro_batch_size_per_gpu is None


def test_the_reward_loop_reads_the_engines_context_and_batches_by_tokens(tiny_rm):
    # verl's reward-loop script keys: no micro-batch size, an engine of prompt 3 + response 1 = 4 tokens
    loop = (
        "reward_model.micro_batch_size_per_gpu=null",
        "reward_model.use_reward_loop=true",
        "reward_model.num_workers=8",
        "reward_model.rollout.name=vllm",
        "reward_model.rollout.tensor_model_parallel_size=1",
        "reward_model.rollout.prompt_length=3",
        "reward_model.rollout.response_length=1",
    )
    config = reward_config(tiny_rm, *loop)
    assert config.input_max_length == 4 and config.scores_by_token_budget
    assert reward_config(tiny_rm, *loop, "reward_model.max_length=5").input_max_length == 5  # an explicit one wins
    batch = rollout_batch(PROMPTS, RESPONSES)
    by_loop = scorer(tiny_rm, *loop).compute_rm_score(batch).batch["rm_scores"]
    # the same scores as max_length=4 in fixed micro-batches of 4: the budget changes the batching, not the result
    by_length = scorer(tiny_rm, "reward_model.max_length=4").compute_rm_score(batch).batch["rm_scores"]
    torch.testing.assert_close(by_loop, by_length, atol=1e-5, rtol=0)
    assert not reward_config(tiny_rm).scores_by_token_budget  # without the loop, the micro-batch size decides
