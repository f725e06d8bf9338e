"""Check that the tiny tool model learns to use its calculator under a short GRPO-style loop.

Standalone (no trainer, no Ray, no agent-loop server): each step samples ``--num-samples`` multi-turn trajectories
per prompt at temperature 1. A turn is generated until ``<|im_end|>`` (the eos; a hermes tool call ends
``</tool_call><|im_end|>``, as verl's hermes parser expects); a turn with a ``calculator`` call gets the tool's
answer appended, rendered by the tokenizer's chat template, with response mask 0, and the model continues. The
final answers are scored with :mod:`verl.utils.reward_score.tiny_calc`, rewards are normalised within each prompt
group (GRPO), and one policy-gradient step over the model's own tokens is taken with Adam. ``--fp16`` samples and
computes the loss in fp16 (fp32 master weights, a static loss scale, a step with a non-finite gradient skipped).
It prints the mean sampled reward and the tool-call success rate per step. Run from the repo root::

    .venv/bin/python scripts/check_tiny_tool_task_learnable.py --num-steps 30 [--fp16]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import time
from pathlib import Path

import torch

from verl.models.loading import load_hf_causal_lm, load_tokenizer
from verl.tools.calculator_tool import CALCULATOR_SCHEMA
from verl.utils.dataset.make_tiny_tool_data import TOOL_NAME, tool_trajectory
from verl.utils.reward_score import tiny_calc

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "verl" / "models" / "tiny_tool"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_EXPRESSION = re.compile(r"^\s*\d+(\s*[-+*]\s*\d+)*\s*$")


def calculate(expression: str) -> str:
    """The calculator: an integer expression of ``+ - *`` (usual precedence); raises ValueError on anything else."""
    if not isinstance(expression, str) or not _EXPRESSION.match(expression) or len(expression) > 40:
        raise ValueError(f"not an integer expression of + - *: {expression!r}")
    total = 0
    for sign, term in re.findall(r"([-+]?)([^-+]+)", expression.replace(" ", "")):
        product = 1
        for factor in term.split("*"):
            product *= int(factor)
        total += -product if sign == "-" else product
    return str(total)


def run_tool_calls(text: str) -> tuple[str | None, bool]:
    """The tool message for one assistant turn's text, or None when the turn has no call; and whether it succeeded.

    A call that is not JSON, names another tool or carries a bad expression gets an error message (a failed call).
    """
    calls = _TOOL_CALL.findall(text)
    if not calls:
        return None, False
    try:
        call = json.loads(calls[0])
        if call["name"] != TOOL_NAME:
            raise ValueError(f"unknown tool {call['name']!r}")
        return calculate(call["arguments"]["expression"]), True
    except (ValueError, KeyError, TypeError) as err:
        return f"Error: {err}", False


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, S) ids and attention mask of left-padded rows."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return ids, mask


@torch.no_grad()
def generate_turn(model, contexts: list[list[int]], max_new: int, eos: int, pad: int) -> list[list[int]]:
    """Sample one assistant turn per context at temperature 1 with a KV cache; each ends at its first eos."""
    ids, mask = left_pad(contexts, pad)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True)
    done = torch.zeros(len(contexts), dtype=torch.bool)
    turns: list[list[int]] = [[] for _ in contexts]
    for _ in range(max_new):
        probs = torch.softmax(out.logits[:, -1].float(), -1)
        token = torch.multinomial(probs, 1).squeeze(-1)
        for i in torch.nonzero(~done).flatten().tolist():
            turns[i].append(int(token[i]))
        done = done | (token == eos)
        if done.all():
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        position_ids = position_ids[:, -1:] + 1
        out = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
    return turns


def rollout(model, tokenizer, prompts: list[list[int]], args) -> list[dict]:
    """Multi-turn trajectories: response ids, a mask that is 1 on the model's tokens, and tool-call outcomes."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    trajs = [{"ids": [], "mask": [], "called": False, "success": False} for _ in prompts]
    active = list(range(len(prompts)))
    for turn_index in range(args.max_turns):
        turns = generate_turn(model, [prompts[i] + trajs[i]["ids"] for i in active], args.max_turn_tokens, eos, pad)
        still_active = []
        for i, turn in zip(active, turns):
            traj = trajs[i]
            traj["ids"] += turn
            traj["mask"] += [1] * len(turn)
            result, ok = run_tool_calls(tokenizer.decode(turn))
            traj["called"] = traj["called"] or result is not None
            if result is None or turn[-1] != eos or turn_index + 1 == args.max_turns:
                continue
            traj["success"] = traj["success"] or ok
            tool_text = tokenizer.apply_chat_template(
                [{"role": "tool", "content": result}], add_generation_prompt=True, tokenize=False
            )
            tool_ids = tokenizer(tool_text, add_special_tokens=False)["input_ids"]
            traj["ids"] += tool_ids
            traj["mask"] += [0] * len(tool_ids)
            if len(traj["ids"]) < args.max_response_length:
                still_active.append(i)
        active = still_active
        if not active:
            break
    for traj in trajs:
        traj["ids"], traj["mask"] = traj["ids"][: args.max_response_length], traj["mask"][: args.max_response_length]
    return trajs


def sequence_log_probs(model, prompts: list[list[int]], trajs: list[dict], pad: int):
    """Log-probs of the response tokens under ``model`` and the response mask, each (B, R), right-padded."""
    width = max(len(t["ids"]) for t in trajs)
    rows = [p + t["ids"] + [pad] * (width - len(t["ids"])) for p, t in zip(prompts, trajs)]
    ids, mask = left_pad(rows, pad)
    for i, t in enumerate(trajs):
        mask[i, ids.shape[1] - (width - len(t["ids"])) :] = 0
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, -width - 1 : -1]
    responses = ids[:, -width:]
    log_probs = torch.log_softmax(logits.float(), -1).gather(-1, responses[:, :, None]).squeeze(-1)
    response_mask = torch.tensor([t["mask"] + [0] * (width - len(t["mask"])) for t in trajs], dtype=torch.float32)
    return log_probs, response_mask


def grpo_loss(model, prompts, trajs, rewards: torch.Tensor, num_samples: int, pad: int) -> torch.Tensor:
    """Token-mean policy-gradient loss over the model's tokens with group-normalised advantages."""
    grouped = rewards.view(-1, num_samples)
    advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
    log_probs, response_mask = sequence_log_probs(model, prompts, trajs, pad)
    return (-advantages[:, None] * log_probs * response_mask).sum() / response_mask.sum().clamp(min=1)


class Policy:
    """fp32 weights and Adam; with fp16, a half-precision copy samples and computes the loss (static loss scale)."""

    def __init__(self, model, lr: float, fp16: bool, loss_scale: float = 1024.0):
        self.master, self.fp16, self.loss_scale = model, fp16, loss_scale
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.runner = copy.deepcopy(model).half() if fp16 else model
        self.skipped = 0

    def step(self, loss_fn) -> None:
        """Backward ``loss_fn(runner)``, move the gradients to the master weights, clip and step (or skip)."""
        self.runner.zero_grad(set_to_none=True)
        (loss_fn(self.runner) * (self.loss_scale if self.fp16 else 1.0)).backward()
        if self.fp16:
            for master, half in zip(self.master.parameters(), self.runner.parameters()):
                master.grad = None if half.grad is None else half.grad.float() / self.loss_scale
        norm = torch.nn.utils.clip_grad_norm_(self.master.parameters(), 1.0)
        if not torch.isfinite(norm):
            self.skipped += 1
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.fp16:
            with torch.no_grad():
                for master, half in zip(self.master.parameters(), self.runner.parameters()):
                    half.copy_(master)


def encode_prompts(tokenizer, batch: list[tuple[str, str]]) -> list[list[int]]:
    """The rendered chat prompt (calculator schema in ``tools``, generation prompt) of each task instance."""
    prompts = []
    for expression, answer in batch:
        text = tokenizer.apply_chat_template(
            tool_trajectory(expression, answer)[:1],
            tools=[CALCULATOR_SCHEMA],
            add_generation_prompt=True,
            tokenize=False,
        )
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def train_step(policy: Policy, tokenizer, batch: list[tuple[str, str]], args) -> dict[str, float]:
    """One rollout + one update; returns the batch's mean reward, tool-call rate and tool-call success rate."""
    batch = [example for example in batch for _ in range(args.num_samples)]
    prompts = encode_prompts(tokenizer, batch)
    policy.runner.eval()
    trajs = rollout(policy.runner, tokenizer, prompts, args)
    texts = [tokenizer.decode(t["ids"], skip_special_tokens=True) for t in trajs]
    rewards = torch.tensor([tiny_calc.compute_score(text, answer) for text, (_, answer) in zip(texts, batch)])
    pad = tokenizer.pad_token_id
    policy.step(lambda model: grpo_loss(model, prompts, trajs, rewards, args.num_samples, pad))
    return {
        "reward": rewards.mean().item(),
        "exact": (rewards == 1).float().mean().item(),
        "call": sum(t["called"] for t in trajs) / len(trajs),
        "success": sum(t["success"] for t in trajs) / len(trajs),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--num-steps", type=int, default=30)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3, help="assistant turns per trajectory")
    parser.add_argument("--max-turn-tokens", type=int, default=32)
    parser.add_argument("--max-response-length", type=int, default=96)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (2 spin badly on a busy 2-core box)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    policy = Policy(load_hf_causal_lm(args.model), args.lr, args.fp16)
    rng = random.Random(args.seed)
    start, history = time.time(), []
    for step in range(1, args.num_steps + 1):
        batch = [tiny_calc.make_example(rng) for _ in range(args.num_prompts)]
        history.append(train_step(policy, tokenizer, batch, args))
        stats = "  ".join(f"{key} {value:.3f}" for key, value in history[-1].items())
        print(f"step {step:3d}  {stats}", flush=True)
    window = max(1, min(5, args.num_steps // 3))
    for key in history[0]:
        first = sum(h[key] for h in history[:window]) / window
        last = sum(h[key] for h in history[-window:]) / window
        print(f"{key}: first {window} steps {first:.3f} -> last {window} steps {last:.3f}")
    print(f"skipped updates {policy.skipped}; wall time {time.time() - start:.1f}s for {args.num_steps} steps")


if __name__ == "__main__":
    sys.exit(main())
