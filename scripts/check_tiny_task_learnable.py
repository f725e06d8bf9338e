"""Check that the embedded tiny model visibly learns the embedded task under a short GRPO-style loop.

Standalone (no trainer, no Ray): fp32, sample ``--num-samples`` responses per prompt at temperature 1, score them
with the tiny-task scorer, normalise rewards within each prompt group (GRPO), and take one policy-gradient step
with Adam per batch. It prints the mean sampled reward per step and a greedy score on held-out prompts before and
after, so the rise is visible. Run from the repo root::

    .venv/bin/python scripts/check_tiny_task_learnable.py --num-steps 30
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from verl.models.loading import DEFAULT_MODEL_PATH, load_hf_causal_lm, load_tokenizer
from verl.utils.reward_score import tiny_task


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and attention mask, each (B, P)."""
    encoded = tokenizer(prompts, padding=True, return_tensors="pt")
    return encoded["input_ids"], encoded["attention_mask"]


@torch.no_grad()
def generate(model, tokenizer, input_ids, attention_mask, max_new_tokens: int, greedy: bool):
    """Sample (or argmax) up to ``max_new_tokens``; returns responses (B, R) right-padded after the first eos."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    sequence, mask = input_ids, attention_mask
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    responses = []
    for _ in range(max_new_tokens):
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=sequence, attention_mask=mask, position_ids=position_ids).logits[:, -1]
        token = logits.argmax(-1) if greedy else torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
        token = torch.where(done, torch.full_like(token, pad), token)
        responses.append(token)
        sequence = torch.cat([sequence, token[:, None]], dim=1)
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        done = done | (token == eos)
        if done.all():
            break
    return torch.stack(responses, dim=1)


def response_log_probs(model, prompt_ids, prompt_mask, responses, response_mask) -> torch.Tensor:
    """Log-prob of each response token, (B, R); logits at position P + t - 1 predict response token t."""
    input_ids = torch.cat([prompt_ids, responses], dim=1)
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits
    num_prompt = prompt_ids.shape[1]
    logits = logits[:, num_prompt - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, responses[:, :, None]).squeeze(-1)


def score(tokenizer, responses: torch.Tensor, answers: list[str]) -> torch.Tensor:
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    return torch.tensor([tiny_task.compute_score(t, a) for t, a in zip(texts, answers)])


def greedy_eval(model, tokenizer, prompts, answers, max_new_tokens: int) -> float:
    ids, mask = encode_prompts(tokenizer, prompts)
    return score(tokenizer, generate(model, tokenizer, ids, mask, max_new_tokens, greedy=True), answers).mean().item()


def grpo_step(model, optimizer, tokenizer, prompts, answers, args) -> float:
    """One rollout + one policy-gradient update; returns the batch's mean sampled reward."""
    prompts = [p for p in prompts for _ in range(args.num_samples)]
    answers = [a for a in answers for _ in range(args.num_samples)]
    ids, mask = encode_prompts(tokenizer, prompts)
    responses = generate(model, tokenizer, ids, mask, args.max_response_length, greedy=False)
    eos = tokenizer.eos_token_id
    # A token is in the response up to and including the first eos.
    response_mask = (torch.cumsum((responses == eos).long(), dim=1) - (responses == eos).long() == 0).long()
    rewards = score(tokenizer, responses, answers)
    grouped = rewards.view(-1, args.num_samples)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
    log_probs = response_log_probs(model, ids, mask, responses, response_mask)
    per_token = -advantages[:, None] * log_probs * response_mask
    loss = per_token.sum() / response_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return rewards.mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL_PATH))
    parser.add_argument("--num-steps", type=int, default=30)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--max-response-length", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    tokenizer = load_tokenizer(args.model)
    model = load_hf_causal_lm(args.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    rng = random.Random(args.seed)
    held_out = [tiny_task.make_example(random.Random(10_000 + i)) for i in range(256)]
    eval_prompts, eval_answers = [p for p, _ in held_out], [a for _, a in held_out]
    before = greedy_eval(model, tokenizer, eval_prompts, eval_answers, args.max_response_length)
    start = time.time()
    rewards = []
    for step in range(1, args.num_steps + 1):
        batch = [tiny_task.make_example(rng) for _ in range(args.num_prompts)]
        rewards.append(grpo_step(model, optimizer, tokenizer, [p for p, _ in batch], [a for _, a in batch], args))
        print(f"step {step:3d}  mean sampled reward {rewards[-1]:.3f}")
    after = greedy_eval(model, tokenizer, eval_prompts, eval_answers, args.max_response_length)
    window = max(1, min(5, args.num_steps // 3))
    first, last = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
    print(f"sampled reward: first {window} steps {first:.3f} -> last {window} steps {last:.3f}")
    print(f"greedy held-out score: before {before:.3f} -> after {after:.3f}")
    print(f"wall time {time.time() - start:.1f}s for {args.num_steps} steps")


if __name__ == "__main__":
    main()
