"""What verl's rollout keys do: ``val_kwargs`` drives validation sampling, ``calculate_log_probs`` decides whether the
rollout's log-probs reach the batch, ``ignore_eos`` makes an eos token an ordinary one."""

from types import SimpleNamespace

import torch

from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.rollout_source import ColocatedRollout
from verl.workers.config import RolloutConfig, load_section
from verl.workers.roles.rollout import RolloutRole
from verl.workers.rollout import NaiveRollout

from .conftest import PAD_ID, build_tiny_model, hf_logits_fn, make_prompts, sampling_options

RESPONSE_LENGTH = 5
PROMPT_ROWS = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]


class RecordingActorGroup:
    """The actor worker group as validation uses it: generate with a real rollout, recording each call's meta_info."""

    def __init__(self, rollout):
        self.rollout = rollout
        self.meta_infos: list[dict] = []

    def generate_sequences(self, prompts):
        self.meta_infos.append(dict(prompts.meta_info))
        return self.rollout.generate_sequences(prompts)


def validate_with(val_kwargs: dict):
    """Run the trainer's validation over 3 prompts with ``val_kwargs``; the recording group and the output rows."""
    rollout_config = load_section(RolloutConfig, {"val_kwargs": val_kwargs})
    # the training options sample (n 4, temperature 1): validation must not use them
    rollout = NaiveRollout(
        hf_logits_fn(build_tiny_model()),
        sampling_options(response_length=RESPONSE_LENGTH, n=4, do_sample=True, seed=3),
        PAD_ID,
        eos_token_id=31,
    )
    group = RecordingActorGroup(rollout)
    outputs = []

    def score(output, validation=False):
        outputs.append(output)
        return torch.zeros(len(output), RESPONSE_LENGTH)

    trainer = SimpleNamespace(
        config=SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout_config)),
        val_batches=[make_prompts(PROMPT_ROWS, num_prompt_tokens=4)],
        rollout_source=ColocatedRollout(group, train_loader=None),  # the rollout lives in the actor workers
        score=score,
        tokenizer=None,  # no validation samples logged (trainer.log_val_generations)
        tracker=None,
    )
    metrics = RayPPOTrainer.validate(trainer)
    return group, outputs[0], metrics


def test_val_kwargs_are_the_options_of_every_validation_call():
    group, output, _ = validate_with({"n": 2, "do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9})
    assert group.meta_infos == [{"n": 2, "do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9}]
    assert len(output) == 3 * 2  # val_kwargs.n responses per prompt, not the training n (4)


def test_val_kwargs_decide_between_greedy_and_sampled_answers():
    _, greedy, _ = validate_with({"n": 2, "do_sample": False})
    responses = greedy.batch["responses"]
    assert torch.equal(responses[0::2], responses[1::2])  # greedy: a prompt's two answers are the same
    # top_k 1 keeps only the most likely token: sampling then gives the greedy answers
    _, top1, _ = validate_with({"n": 2, "do_sample": True, "temperature": 1.0, "top_k": 1})
    assert torch.equal(top1.batch["responses"], responses)
    # at temperature 5 without filters (seeded), some answer differs from the greedy one
    _, hot, _ = validate_with({"n": 2, "do_sample": True, "temperature": 5.0, "top_k": -1})
    assert not torch.equal(hot.batch["responses"], responses)


def generate_in_worker(calculate_log_probs: bool):
    """The workers' generation step (the rollout role's ``generate``) over a naive rollout."""
    model = build_tiny_model()
    rollout_config = load_section(RolloutConfig, {"calculate_log_probs": calculate_log_probs})
    engine = NaiveRollout(hf_logits_fn(model), sampling_options(response_length=3, n=1, seed=0), PAD_ID, 31)
    role = RolloutRole(rollout_config, engine, model, "cpu")
    return role.generate(make_prompts(PROMPT_ROWS, num_prompt_tokens=4))


def test_calculate_log_probs_puts_the_rollouts_log_probs_in_the_batch():
    with_log_probs = generate_in_worker(calculate_log_probs=True)
    assert with_log_probs.batch["rollout_log_probs"].shape == (3, 3)
    assert (with_log_probs.batch["rollout_log_probs"] < 0).all()  # log-probs of sampled tokens of a real model
    assert "rollout_log_probs" not in generate_in_worker(calculate_log_probs=False).batch.keys()


def test_ignore_eos_keeps_generating_past_an_eos_token():
    model = build_tiny_model()
    prompts = make_prompts(PROMPT_ROWS, num_prompt_tokens=4)
    greedy = {"response_length": RESPONSE_LENGTH, "n": 1, "do_sample": False}
    free = NaiveRollout(hf_logits_fn(model), sampling_options(**greedy, ignore_eos=True), PAD_ID, 31)
    tokens = free.generate_sequences(prompts).batch["responses"]
    eos = int(tokens[0, 1])  # a token row 0 generates second: as the eos id it would end row 0 after 2 tokens
    stopping = NaiveRollout(hf_logits_fn(model), sampling_options(**greedy), PAD_ID, eos)
    assert stopping.generate_sequences(prompts).batch["response_mask"][0].sum() <= 2
    ignoring = NaiveRollout(hf_logits_fn(model), sampling_options(**greedy, ignore_eos=True), PAD_ID, eos)
    output = ignoring.generate_sequences(prompts)
    assert output.batch["response_mask"].sum(-1).tolist() == [RESPONSE_LENGTH] * 3  # every token counts
    assert torch.equal(output.batch["responses"], tokens)
