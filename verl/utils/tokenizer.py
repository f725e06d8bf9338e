"""verl's tokenizer helpers (``verl.utils.tokenizer``, also ``from verl.utils import hf_tokenizer, hf_processor``).

:func:`hf_tokenizer` loads a Hugging Face tokenizer and gives it a pad token when it has none (its eos token, as
verl does), so that batches can be padded. :func:`hf_processor` is verl's loader of a multimodal processor; since
multimodal training is out of scope here, it returns None for a text-only model (what verl returns too, and what
``RLHFDataset(processor=None)`` takes) and refuses a model whose processor handles images, video or audio.
:func:`normalize_token_ids` turns what ``apply_chat_template(tokenize=True)`` returns (a list, a nested list, a
``BatchEncoding``, a tensor) into a flat ``list[int]``.

``transformers`` is imported inside the functions: this module sits in the bottom layer and stays light to import.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["hf_processor", "hf_tokenizer", "normalize_token_ids", "set_pad_token_id"]

logger = logging.getLogger(__name__)

# gemma-2-2b-it's eos token is ambiguous; verl replaces it by the end-of-turn token (its id in that vocabulary)
_GEMMA2_NAME = "gemma-2-2b-it"
_GEMMA2_EOS = {"eos_token": "<end_of_turn>", "eos_token_id": 107}


def set_pad_token_id(tokenizer: Any) -> None:
    """Give ``tokenizer`` its eos token as pad token (and id) where it has none; logs a warning when it does."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = tokenizer.eos_token_id
        logger.warning("tokenizer.pad_token_id is None; set to the eos token id %s.", tokenizer.eos_token_id)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer.pad_token is None; set to the eos token %r.", tokenizer.eos_token)


def hf_tokenizer(name_or_path: Any, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs: Any):
    """A tokenizer from ``AutoTokenizer.from_pretrained(name_or_path, **kwargs)``, as verl's ``hf_tokenizer``.

    Args:
        name_or_path: a local directory or a hub name.
        correct_pad_token: give a tokenizer without a pad token its eos token as pad (:func:`set_pad_token_id`).
        correct_gemma2: for gemma-2-2b-it, use ``<end_of_turn>`` (id 107) as the eos token, as verl does.
        kwargs: passed to ``from_pretrained`` (``trust_remote_code``, ``use_fast``...).

    Raises:
        OSError: transformers finds no tokenizer there (its own message).
    """
    from transformers import AutoTokenizer

    if correct_gemma2 and isinstance(name_or_path, str) and _GEMMA2_NAME in name_or_path:
        logger.warning("gemma-2-2b-it tokenizer: eos token set to %s (id %s).", *_GEMMA2_EOS.values())
        kwargs.update(_GEMMA2_EOS)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token:
        set_pad_token_id(tokenizer)
    return tokenizer


def hf_processor(name_or_path: Any, **kwargs: Any) -> None:
    """verl's multimodal processor of a model: None for a text-only model, as in verl.

    A model whose ``AutoProcessor`` is only its tokenizer (or that has no processor transformers can load, which
    verl also answers with None and a warning) is text-only.

    Raises:
        ValueError: the model has a multimodal processor (images, video, audio): multimodal training is out of
            scope here.
    """
    from transformers import AutoProcessor, PreTrainedTokenizerBase

    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except Exception as err:  # noqa: BLE001 - verl answers any loading failure with None (text-only)
        logger.warning("No processor loaded from %s (%s); treating the model as text-only.", name_or_path, err)
        return None
    if isinstance(processor, PreTrainedTokenizerBase) or "Processor" not in type(processor).__name__:
        return None
    raise ValueError(
        f"{name_or_path} has a multimodal processor ({type(processor).__name__}): multimodal training (images, "
        "video, audio) is out of scope here. Train a text-only model; its processor is None."
    )


def normalize_token_ids(tokenized: Any) -> list[int]:
    """Token ids as a flat ``list[int]``, from a list, a single-row nested list, a mapping or object with
    ``input_ids``, or a tensor / array; each id goes through ``int()``.

    Raises:
        TypeError: not list-like, or an id ``int()`` refuses.
    """
    if isinstance(tokenized, dict):
        ids = tokenized.get("input_ids", tokenized)
    else:
        ids = getattr(tokenized, "input_ids", tokenized)  # a BatchEncoding
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, tuple):
        ids = list(ids)
    if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list | tuple):
        ids = list(ids[0])
    if not isinstance(ids, list):
        raise TypeError(f"token ids must be list-like, got {type(ids).__name__}: {ids!r}")
    normalized = []
    for token_id in ids:
        try:
            normalized.append(int(token_id.item() if hasattr(token_id, "item") else token_id))
        except (TypeError, ValueError) as err:
            raise TypeError(f"a token id must be an integer, got {type(token_id).__name__}: {token_id!r}") from err
    return normalized
