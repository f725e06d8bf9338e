"""Peak memory of the log-prob + entropy forward and backward, with the whole logits vs. chunked from hidden states.

Each variant runs in its own process and reports the growth of the process's peak resident memory (``ru_maxrss``)
over what it held before the pass, so the figure is the pass's own working set: the (tokens, vocab) logits and
their softmax copies for the plain path, a few (chunk, vocab) buffers for ``model.use_fused_kernels``.

Run: ``OMP_NUM_THREADS=2 python benchmarks/bench_fused_logprobs.py --tokens 2048 --vocab 151936 --hidden 256``
"""

from __future__ import annotations

import argparse
import logging
import resource
import subprocess
import sys

import torch

logger = logging.getLogger(__name__)


def run_variant(variant: str, tokens: int, vocab: int, hidden_size: int) -> float:
    """Peak-memory growth (MiB) of one forward + backward of ``variant`` (plain | fused)."""
    from verl.utils.kernel import linear_log_probs_and_entropy
    from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(tokens, hidden_size, generator=gen, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size, generator=gen) / hidden_size**0.5).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=gen)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if variant == "plain":
        logits = hidden @ weight.T
        log_probs, entropy = logprobs_from_logits(logits, labels), entropy_from_logits(logits)
    else:
        log_probs, entropy = linear_log_probs_and_entropy(hidden, weight, labels, 1.0, True)
    (log_probs.sum() + 0.01 * entropy.sum()).backward()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--variant", choices=["plain", "fused"], default=None, help="internal: run one variant")
    args = parser.parse_args()
    if args.variant is not None:
        sys.stdout.write(f"{run_variant(args.variant, args.tokens, args.vocab, args.hidden):.0f}\n")
        return
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    header = f"tokens={args.tokens} vocab={args.vocab} hidden={args.hidden}: fp32 logits {logits_mib:.0f} MiB"
    sys.stdout.write(header + "\n")
    for variant in ("plain", "fused"):
        argv = [sys.executable, __file__, "--variant", variant]
        argv += ["--tokens", str(args.tokens), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
        peak = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()
        sys.stdout.write(f"  {variant:5s} forward+backward peak growth: {peak} MiB\n")


if __name__ == "__main__":
    main()
