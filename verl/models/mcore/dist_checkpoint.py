"""megatron-core distributed checkpoints (``torch_dist`` format) of a GPTModel: save, load, and convert from HF.

``megatron.use_dist_checkpointing=true`` with ``megatron.dist_checkpointing_path`` makes a worker take a model's
initial weights from such a checkpoint instead of converting the Hugging Face weights of ``model.path`` (what verl
does with the checkpoints its ``scripts/converter_hf_to_mcore.py`` writes: the model's ``sharded_state_dict`` at
the top level, which is also the layout written here, so either loads the other's). Each tensor-parallel rank
reads only its own shards, so a checkpoint written at one layout loads at another. With an optimizer, its state
is saved beside the model under ``optimizer`` (megatron-core's optimizer only).

On a GPU the writes go through megatron-core's own ``torch_dist`` save strategy. That strategy calls CUDA
(``torch.cuda.synchronize`` when staging tensors, ``torch.cuda.current_device`` when finishing), so without CUDA
:func:`cpu_save_strategy` writes the same format with ``torch.distributed.checkpoint``'s plain file writer: the
same translation of megatron-core's sharded tensors, the same save planner, one synchronous write. Loading needs
no CUDA. Convert a Hugging Face model once (on a GPU or on the CPU)::

    python -m verl.models.mcore.dist_checkpoint --hf_model_path Qwen/Qwen2.5-0.5B --output_path /ckpt/qwen-mcore
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verl.models.mcore.model import unwrap_model

logger = logging.getLogger(__name__)

OPTIMIZER_KEY = "optimizer"


def cpu_save_strategy() -> Any:
    """A ``TorchDistSaveShardedStrategy`` whose ``save`` writes through ``FileSystemWriter`` (no CUDA calls).

    The translation of megatron-core's sharded tensors (one key per shard, main replicas only) and the save planner
    are megatron-core's, so the files and ``metadata.json`` are those of its own strategy and load with its
    ``TorchDistLoadShardedStrategy``.
    """
    from megatron.core.dist_checkpointing.strategies import torch as torch_dist
    from torch.distributed import checkpoint as dcp

    class CpuTorchDistSave(torch_dist.TorchDistSaveShardedStrategy):
        def save(self, sharded_state_dict: dict[str, Any], checkpoint_dir: Path) -> None:
            sharded, _, _ = torch_dist._replace_state_dict_keys_with_sharded_keys(
                sharded_state_dict, self.keep_only_main_replica
            )
            planner = torch_dist.MCoreSavePlanner(
                dedup_replicated_tensors=not self.keep_only_main_replica, flatten_state_dict=False
            )
            dcp.save(
                torch_dist.mcore_to_pyt_state_dict(sharded, False),
                storage_writer=dcp.FileSystemWriter(checkpoint_dir, thread_count=1),
                planner=planner,
            )

    return CpuTorchDistSave("torch_dist", 1)


def _model_sharded_state_dict(model: torch.nn.Module, prefix: str, is_value_model: bool) -> dict[str, Any]:
    inner = unwrap_model(model)
    sharded = inner.sharded_state_dict(prefix=prefix)
    if _holds_a_copy_of_the_embedding(inner):
        # the last stage's copy of a tied embedding made off CUDA (verl.models.mcore.model): stored as megatron-core
        # stores its own copy, as a replica of the first stage's embedding
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

        inner.tie_embeddings_and_output_weights_state_dict(
            sharded,
            f"{prefix}output_layer.weight",
            f"{prefix}embedding.word_embeddings.weight",
            ensure_metadata_has_dp_cp_group(None),
        )
    if is_value_model:
        # a value model replaces the LM head with its own value head, which the checkpoint of an LM lacks
        sharded = {key: value for key, value in sharded.items() if "output_layer" not in key}
    return sharded


def _holds_a_copy_of_the_embedding(model: torch.nn.Module) -> bool:
    """A last pipeline stage whose output weight is a by-hand copy of a tied embedding (megatron-core's own copies
    are tied in its ``sharded_state_dict`` already)."""
    if not getattr(model, "post_process", False) or getattr(model, "pre_process", True):
        return False
    weight = getattr(getattr(model, "output_layer", None), "weight", None)
    return getattr(weight, "shared_embedding", False) and not model.share_embeddings_and_output_weights


def save_dist_checkpoint(
    model: torch.nn.Module, directory: str | Path, *, optimizer: Any = None, prefix: str = ""
) -> None:
    """Write ``model`` (and megatron-core ``optimizer``'s state) as a megatron-core distributed checkpoint.

    A collective: every rank of the model-parallel and data-parallel groups calls it; each writes its shards.

    Args:
        model: a GPTModel, optionally wrapped in megatron-core's DDP.
        directory: the checkpoint directory (created).
        optimizer: a megatron-core optimizer whose state to save beside the weights, or None.
        prefix: a prefix for the model's keys (NeMo 2 writes ``module.``).

    """
    from megatron.core import dist_checkpointing

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sharded = _model_sharded_state_dict(model, prefix, is_value_model=False)
    if optimizer is not None:
        sharded[OPTIMIZER_KEY] = optimizer.sharded_state_dict(dict(sharded))
    strategy = None if torch.cuda.is_available() else cpu_save_strategy()
    dist_checkpointing.save(sharded, str(directory), sharded_strategy=strategy, async_sharded_save=False)


def load_dist_checkpoint(
    model: torch.nn.Module,
    directory: str | Path,
    *,
    optimizer: Any = None,
    prefix: str = "",
    is_value_model: bool = False,
) -> None:
    """Load this rank's shards of ``model`` (and ``optimizer``'s state) from a megatron-core distributed checkpoint.

    Keys the checkpoint has and the model lacks are accepted (an optimizer's state when loading weights only);
    keys the model has and the checkpoint lacks are an error of megatron-core's.

    Args:
        model: a GPTModel (optionally wrapped) of the layout this rank holds.
        directory: a checkpoint written by :func:`save_dist_checkpoint` or verl's converter.
        optimizer: a megatron-core optimizer to restore too, or None.
        prefix: the prefix of the model's keys in the checkpoint.
        is_value_model: a critic: the checkpoint's LM head is skipped (the value head stays as built).

    Raises:
        ValueError: no checkpoint at ``directory``.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    directory = Path(directory)
    if not (directory / "metadata.json").is_file():
        raise ValueError(
            f"{directory} is not a megatron-core distributed checkpoint (no metadata.json); point "
            "megatron.dist_checkpointing_path at one (python -m verl.models.mcore.dist_checkpoint writes one)."
        )
    sharded = _model_sharded_state_dict(model, prefix, is_value_model)
    if optimizer is not None:
        sharded[OPTIMIZER_KEY] = optimizer.sharded_state_dict(dict(sharded), is_loading=True)
    loaded = dist_checkpointing.load(sharded, str(directory), strict=StrictHandling.ASSUME_OK_UNEXPECTED)
    optimizer_state = loaded.pop(OPTIMIZER_KEY, None)
    weights = {key[len(prefix) :]: value for key, value in loaded.items() if key.startswith(prefix)}
    missing, unexpected = unwrap_model(model).load_state_dict(weights, strict=False)
    missing = [key for key in missing if not key.endswith("_extra_state")]
    if is_value_model:
        missing = [key for key in missing if "output_layer" not in key]
    if missing or unexpected:
        raise ValueError(
            f"the megatron-core checkpoint {directory} does not fit the model: keys it lacks {missing}, keys the "
            f"model lacks {unexpected}. Convert the checkpoint from the model of actor_rollout_ref.model.path."
        )
    if optimizer is not None:
        optimizer.load_state_dict(optimizer_state)
    logger.info("loaded megatron-core distributed checkpoint %s", directory)


def convert_hf_to_dist_checkpoint(hf_model_path: str, output_path: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """Convert a Hugging Face Llama / Qwen2 model into a megatron-core distributed checkpoint (one process).

    Args:
        hf_model_path: a Hugging Face model directory (or hub name available offline).
        output_path: the checkpoint directory to write.
        dtype: the dtype of the saved weights.

    Raises:
        ValueError: an architecture the converter does not support.
    """
    from verl.models.loading import load_hf_causal_lm
    from verl.models.mcore import build_gpt_model, ensure_model_parallel_initialized, load_hf_weights_into_mcore

    ensure_model_parallel_initialized(tp=1, pp=1)
    hf_model = load_hf_causal_lm(hf_model_path, dtype=torch.float32, device="cpu")
    model = build_gpt_model(hf_model.config, dtype, "cuda" if torch.cuda.is_available() else "cpu")
    load_hf_weights_into_mcore(model, hf_model.state_dict(), hf_model.config)
    save_dist_checkpoint(model, output_path)
    logger.info("wrote %s from %s", output_path, hf_model_path)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--hf_model_path`` to ``--output_path`` (verl's converter_hf_to_mcore.py arguments)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf_model_path", required=True, help="Hugging Face model directory")
    parser.add_argument("--output_path", required=True, help="directory of the megatron-core checkpoint to write")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    convert_hf_to_dist_checkpoint(args.hf_model_path, args.output_path, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
