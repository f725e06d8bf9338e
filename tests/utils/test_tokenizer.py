"""verl's tokenizer helpers: hf_tokenizer's pad and gemma-2 corrections, hf_processor's text-only answer, and
normalize_token_ids over the shapes apply_chat_template returns."""

import pytest
import torch
import transformers

from verl.models.loading import DEFAULT_MODEL_PATH
from verl.utils import hf_processor, hf_tokenizer, normalize_token_ids
from verl.utils.tokenizer import set_pad_token_id


def test_hf_tokenizer_loads_and_pads_with_eos_when_there_is_no_pad_token():
    tokenizer = hf_tokenizer(str(DEFAULT_MODEL_PATH))
    assert tokenizer("hello")["input_ids"]
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    set_pad_token_id(tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.pad_token_id == tokenizer.eos_token_id


def test_hf_tokenizer_passes_gemma2s_end_of_turn_as_eos(monkeypatch):
    seen = {}

    def from_pretrained(name, **kwargs):
        seen.update(kwargs, name=name)
        raise OSError("not downloaded in tests")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    with pytest.raises(OSError):
        hf_tokenizer("google/gemma-2-2b-it", trust_remote_code=True)
    assert seen == {
        "name": "google/gemma-2-2b-it",
        "trust_remote_code": True,
        "eos_token": "<end_of_turn>",
        "eos_token_id": 107,
    }


def test_hf_processor_is_none_for_a_text_model_and_refuses_a_multimodal_one(monkeypatch, tmp_path):
    assert hf_processor(str(DEFAULT_MODEL_PATH)) is None  # AutoProcessor gives the tokenizer: text-only
    assert hf_processor(str(tmp_path / "absent")) is None  # nothing to load: text-only, as verl answers

    class FakeVLProcessor:
        pass

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", lambda name, **kwargs: FakeVLProcessor())
    with pytest.raises(ValueError, match="FakeVLProcessor.*multimodal training"):
        hf_processor("some/vl-model")


def test_normalize_token_ids_flattens_what_chat_templates_return():
    assert normalize_token_ids([1, 2]) == [1, 2]
    assert normalize_token_ids([[3, 4]]) == [3, 4]  # one row of a batch
    assert normalize_token_ids({"input_ids": torch.tensor([[5, 6]])}) == [5, 6]
    assert normalize_token_ids(transformers.BatchEncoding({"input_ids": [7, 8]})) == [7, 8]
    assert normalize_token_ids((torch.tensor(9),)) == [9]
    with pytest.raises(TypeError, match="list-like"):
        normalize_token_ids("10")
    with pytest.raises(TypeError, match="integer"):
        normalize_token_ids([1, "x"])
