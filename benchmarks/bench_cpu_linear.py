"""fp32 linear layers on CPU: torch's ``F.linear`` (MKL) against :func:`verl.utils.cpu_linear.onednn_linear`.

For each shape (rows x in -> out) the two are timed interleaved, forward alone (no gradients: the rollout's
case) and forward + backward (input and weight gradients: the update's case), with outputs and gradients checked
against each other. The shapes are those of the benchmarks' models: the ~10M Qwen2 shape of
``bench_vs_trl.py`` (hidden 384, MLP 1024, 640 = fused q/k/v) at a decode batch (8..64 rows) and at a training
micro-batch (512 rows), and the embedded tiny model (hidden 64, MLP 192) at its sizes, down to products small
enough that oneDNN's fixed cost per call loses; the smallest shape where oneDNN wins sets
``verl.utils.cpu_linear.MIN_FLOPS``.

The onednn column times :func:`onednn_linear` with ``MIN_FLOPS`` set to 0, so every shape goes through oneDNN.

Run: ``.venv/bin/python benchmarks/bench_cpu_linear.py`` (about a minute; ``--repeats`` for more).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

from verl.utils import cpu_linear  # noqa: E402

SHAPES = [  # (rows, in, out)
    (512, 384, 1024),
    (512, 1024, 384),
    (512, 384, 640),
    (64, 384, 2048),
    (64, 1024, 384),
    (32, 384, 2048),
    (8, 384, 2048),
    (8, 1024, 384),
    (1318, 64, 192),
    (1318, 192, 64),
    (256, 64, 192),
    (128, 64, 192),
    (64, 64, 192),
    (16, 64, 192),
    (4, 64, 192),
]


def loop(fn, calls: int):
    def run():
        for _ in range(calls):
            fn()

    return run


def bench_shape(rows: int, fan_in: int, fan_out: int, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(rows * 7 + fan_in)
    x = torch.randn(rows, fan_in, generator=gen)
    w = torch.randn(fan_out, fan_in, generator=gen) / fan_in**0.5
    b = torch.randn(fan_out, generator=gen)
    grad = torch.randn(rows, fan_out, generator=gen)
    flops = rows * fan_in * fan_out
    calls = max(1, int(2e8 // flops))  # each timing runs about 0.2 GFLOP so that small shapes are measurable

    def forward(fn):
        with torch.no_grad():
            return fn(x, w, b)

    def train(fn):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        fn(xg, wg, b).backward(grad)
        return xg.grad, wg.grad

    ref_out, ref_grads = forward(F.linear), train(F.linear)
    out, grads = forward(cpu_linear.onednn_linear), train(cpu_linear.onednn_linear)
    max_error = max(float((out - ref_out).abs().max()), *(float((g - r).abs().max()) for g, r in zip(grads, ref_grads)))
    times = common.alternate(
        {
            "torch_fwd": loop(lambda: forward(F.linear), calls),
            "onednn_fwd": loop(lambda: forward(cpu_linear.onednn_linear), calls),
            "torch_train": loop(lambda: train(F.linear), calls),
            "onednn_train": loop(lambda: train(cpu_linear.onednn_linear), calls),
        },
        num_repeats=repeats,
    )
    us = {name: common.median(values) / calls * 1e6 for name, values in times.items()}
    return {
        "shape": f"{rows}x{fan_in}->{fan_out}",
        "multiply_adds": flops,
        "torch_fwd_us": us["torch_fwd"],
        "onednn_fwd_us": us["onednn_fwd"],
        "fwd_speedup": us["torch_fwd"] / us["onednn_fwd"],
        "torch_train_us": us["torch_train"],
        "onednn_train_us": us["onednn_train"],
        "train_speedup": us["torch_train"] / us["onednn_train"],
        "torch_fwd_gflops": 2 * flops / us["torch_fwd"] / 1e3,
        "onednn_fwd_gflops": 2 * flops / us["onednn_fwd"] / 1e3,
        "max_abs_difference": max_error,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timings per variant and shape")
    args = parser.parse_args(argv)
    if not cpu_linear.onednn_available():
        print("this torch build has no oneDNN linear kernel; nothing to compare")
        return 1
    torch.manual_seed(0)
    cpu_linear.MIN_FLOPS = 0  # time oneDNN at every shape, the small ones included
    rows = [bench_shape(*shape, repeats=args.repeats) for shape in SHAPES]
    columns = ["shape", "multiply_adds", "torch_fwd_us", "onednn_fwd_us", "fwd_speedup", "torch_train_us"]
    columns += ["onednn_train_us", "train_speedup", "torch_fwd_gflops", "onednn_fwd_gflops", "max_abs_difference"]
    print(common.format_table(rows, columns))
    mm_rate = common.matmul_flops_per_second()
    onednn_rate = common.matmul_flops_per_second(kernel="onednn")
    print(f"1024^3 product: torch.mm {mm_rate / 1e9:.0f} GFLOP/s, oneDNN {onednn_rate / 1e9:.0f} GFLOP/s")
    path = common.write_results(
        "bench_cpu_linear",
        {
            "settings": {"repeats": args.repeats},
            "matmul_flops_per_second": mm_rate,
            "matmul_flops_per_second_onednn": onednn_rate,
            "rows": rows,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
