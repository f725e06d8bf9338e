"""Weight sync across processes (the rollout group of its own): a dict of tensors against buckets, through Ray.

The path of ``actor_rollout_ref.hybrid_engine=false``: the actor worker's ``export_weights`` returns the weights to
the driver (``ray.get``), the driver puts them into the object store once (``ray.put``) and the rollout worker loads
them into its model. Three Ray processes here, as there: a sender actor holding a random fp32 Qwen2 of
``--model-size`` (the shapes of ``bench_weight_sync.py``), the driver, and a receiver actor holding the same model with
other weights, which takes them as the rollout worker without an engine does (``load_state_dict``). Variants:

- ``dict``: ``{name: CPU copy}``, the path before buckets (a torch tensor pickles through ``torch.save``);
- ``bucket-<MiB>``: :func:`verl.utils.weight_buckets.pack_buckets` of that size, unpacked on the receiver with
  :func:`~verl.utils.weight_buckets.named_tensors` (a bucket's bytes travel as a numpy array, out of band);
- ``bucket-<MiB>-torch``: the same buckets sent as torch tensors (each trimmed buffer cloned: torch pickles a
  tensor's whole storage, the capacity), to split the gain between fewer objects and the out-of-band bytes.

Per variant: the median seconds of a sync, end to end from the export call to the receiver's return (interleaved
rounds after a warm-up round, order flipped every round), and the memory each process adds during its part of a
warm sync (peak RSS minus RSS before; shared object-store pages count in the process that touches them). After each
variant the receiver's weights must equal the sender's bit for bit.

    .venv/bin/python benchmarks/bench_weight_transfer.py --model-size 10m
    .venv/bin/python benchmarks/bench_weight_transfer.py --model-size 100m
"""

from __future__ import annotations

import sys
from pathlib import Path

import ray
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common  # noqa: E402
from bench_weight_sync import MODEL_SIZES, VOCAB, parse_bench_args  # noqa: E402

from verl.utils.weight_buckets import MIB, WeightBucket, named_tensors, pack_buckets  # noqa: E402


def make_model(size: str, seed: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=False,
                         **MODEL_SIZES[size])  # fmt: skip
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).float().eval()


def _as_torch(buckets: list[WeightBucket]) -> list[tuple[torch.Tensor, list]]:
    # a trimmed buffer is a slice of a capacity-sized storage, and torch pickles a tensor's whole storage: clone
    return [(bucket.buffer.clone(), bucket.entries) for bucket in buckets]


def export(module: torch.nn.Module, variant: str):
    """What the sender returns for ``variant`` (the actor's ``export_weights``)."""
    with torch.no_grad():
        weights = iter(module.state_dict().items())
        if variant == "dict":
            return {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        buckets = pack_buckets(weights, int(variant.split("-")[1]) * MIB)
        return _as_torch(buckets) if variant.endswith("-torch") else buckets


def received(weights, variant: str):
    if variant.endswith("-torch"):
        weights = [WeightBucket(buffer, entries) for buffer, entries in weights]
    return named_tensors(weights)


@ray.remote(num_cpus=0)
class Side:
    """A process holding a model: the sender exports its weights, the receiver loads them."""

    def __init__(self, size: str, seed: int):
        common.quiet_libraries()
        self.module = make_model(size, seed)

    def export(self, variant: str):
        return export(self.module, variant)

    def load(self, weights, variant: str) -> None:
        with torch.no_grad():
            self.module.load_state_dict(dict(received(weights, variant)), strict=True)

    def state(self) -> dict:
        return {name: tensor.clone() for name, tensor in self.module.state_dict().items()}

    def mark(self) -> int | None:
        return mark()

    def peak(self) -> int | None:
        return peak()


def mark() -> int | None:
    """Reset this process's peak resident set; returns the resident KiB now (None where Linux cannot say)."""
    return common._proc_status_kib("VmRSS") if common._reset_peak_rss() else None


def peak() -> int | None:
    return common._proc_status_kib("VmHWM")


def sync(sender, receiver, variant: str) -> None:
    """One sync as the driver runs it (``RolloutSource._send_weights``, then the rollout worker's load)."""
    weights = ray.get(sender.export.remote(variant))
    ray.get(receiver.load.remote(ray.put(weights), variant))
    del weights


def sync_peaks(sender, receiver, variant: str) -> dict[str, float]:
    """One sync; the MiB each process's resident set rose above its level before the sync, at its peak (the
    serialisation and deserialisation at both ends included)."""
    before = {"sender": ray.get(sender.mark.remote()), "receiver": ray.get(receiver.mark.remote()), "driver": mark()}
    sync(sender, receiver, variant)
    after = {"sender": ray.get(sender.peak.remote()), "receiver": ray.get(receiver.peak.remote()), "driver": peak()}
    return {f"{k}_peak_mib": max(after[k] - before[k], 0) / 1024 for k in before if before[k] is not None}


def main(argv=None) -> int:
    args, mbs = parse_bench_args(__doc__, argv)
    names = ["dict", *[f"bucket-{mb}" for mb in mbs], f"bucket-{max(mbs)}-torch"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    sender, receiver = Side.remote(args.model_size, 1), Side.remote(args.model_size, 0)
    expected = ray.get(sender.state.remote())
    variants = {name: (lambda name=name: sync(sender, receiver, name)) for name in names}
    timings = common.alternate(variants, args.rounds)
    rows = []
    for name in names:
        ray.get(receiver.load.remote(ray.put({k: torch.zeros_like(v) for k, v in expected.items()}), "dict"))
        peaks = sync_peaks(sender, receiver, name)
        got = ray.get(receiver.state.remote())
        same = all(torch.equal(got[k], v) for k, v in expected.items())
        rows.append({"variant": name, "sync_s_median": common.median(timings[name]),
                     "sync_s_spread": common.spread(timings[name]), **peaks,
                     "same_weights": same})  # fmt: skip
    ray.shutdown()
    params = sum(v.numel() for v in expected.values())
    print(f"model {args.model_size}: {params / 1e6:.1f}M parameters, {params * 4 / MIB:.0f} MiB in fp32")
    columns = ["variant", "sync_s_median", "sync_s_spread", "sender_peak_mib", "driver_peak_mib",
               "receiver_peak_mib", "same_weights"]  # fmt: skip
    print(common.format_table(rows, columns))
    payload = {"model_size": args.model_size, "parameters": params, "rounds": args.rounds, "rows": rows}
    print(common.write_results(f"weight_transfer_{args.model_size}", payload))
    return 0 if all(row["same_weights"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
