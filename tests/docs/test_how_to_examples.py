"""The code example of docs/advance/add_rollout.md runs as printed and samples what its comments say.

The page's first ``python`` block is executed inside a scoped rollout registry (its ``greedy_demo`` registration is
undone afterwards), and the rollout it builds is checked against the responses and log-probs derived by hand.
"""

import math
import re
from pathlib import Path

import torch

from verl.workers.rollout import ROLLOUT_REGISTRY

PAGE = Path(__file__).resolve().parents[2] / "docs/advance/add_rollout.md"


def first_python_block(text: str) -> str:
    match = re.search(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert match is not None, f"{PAGE.name} has no python code block"
    return match.group(1)


def test_the_rollout_example_runs_and_samples_greedily():
    namespace: dict = {}
    with ROLLOUT_REGISTRY.scoped():
        exec(compile(first_python_block(PAGE.read_text(encoding="utf-8")), str(PAGE), "exec"), namespace)
        assert ROLLOUT_REGISTRY.get("greedy_demo") is namespace["GreedyRollout"]
    assert "greedy_demo" not in ROLLOUT_REGISTRY
    out = namespace["out"]
    # the toy model favours (last token + 1) % 8 and eos is 7: prompt [., 3, 4] -> 5, 6, 7 then padding; prompt
    # [1, 2, 5] -> 6, 7 then padding; n=2 repeats each prompt interleaved
    expected = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 0], [6, 7, 0, 0], [6, 7, 0, 0]])
    assert torch.equal(out.batch["responses"], expected)
    assert torch.equal(out.batch["response_mask"], (expected != 0).long())
    # logits 5 on one token of 8, 0 on the others: log_softmax = -log(1 + 7 e^-5) = -0.04613 on every real token
    expected_log_prob = -math.log(1 + 7 * math.exp(-5))
    log_probs = out.batch["rollout_log_probs"]
    assert torch.allclose(log_probs[expected != 0], torch.full((10,), expected_log_prob), atol=1e-5)
