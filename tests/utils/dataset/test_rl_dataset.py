"""verl's import path of the prompt dataset: ``verl.utils.dataset.rl_dataset`` with ``collate_fn`` and verl's
``RLHFDataset(data_files, tokenizer, config, processor=None, max_samples=-1)`` constructor."""

import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from verl.utils import dataset as package
from verl.utils.dataset import loader, rl_dataset
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn


class CharTokenizer:
    """One token per character; no chat template (so a chat renders as its contents joined by newlines)."""

    chat_template = None

    def __call__(self, text):
        return {"input_ids": list(range(len(text)))}


def _write(tmp_path, rows):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def _rows(count):
    # prompt i is "q" followed by i "x": i + 1 characters
    return [
        {
            "prompt": [{"role": "user", "content": "q" + "x" * i}],
            "data_source": "toy",
            "reward_model": {"ground_truth": str(i), "style": "rule"},
            "extra_info": {"index": 100 + i, "tools_kwargs": {"calc": {"n": i}}},
        }
        for i in range(count)
    ]


def test_package_keeps_every_old_name_and_adds_verls():
    assert package.RLHFDataset is RLHFDataset and package.collate_fn is collate_fn
    assert package.PromptCollator is loader.PromptCollator
    assert package.StatefulPromptLoader is loader.StatefulPromptLoader
    assert package.make_tiny_task_dataset is rl_dataset.make_tiny_task_dataset
    assert package.chat_renderer is rl_dataset.chat_renderer and package.TRUNCATION_MODES == ("error", "left", "right")


def test_collate_fn_stacks_tensors_and_keeps_other_values_whole():
    items = [
        {"ids": torch.tensor([1, 2]), "chat": [{"role": "user", "content": "a"}], "meta": {}, "n": [1, 2, 3]},
        {"ids": torch.tensor([3, 4]), "chat": [{"role": "user", "content": "b"}], "meta": {"k": 1}, "n": [4]},
    ]
    batch = collate_fn(items)
    assert torch.equal(batch["ids"], torch.tensor([[1, 2], [3, 4]]))
    for key in ("chat", "meta", "n"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (2,)
    # lists of the same length stay lists (numpy would otherwise make a 2-D array of them)
    assert batch["chat"][1] == [{"role": "user", "content": "b"}] and batch["n"][0] == [1, 2, 3]
    with pytest.raises(ValueError, match="missing"):
        collate_fn([{"a": 1}, {"b": 2}])


def test_verl_constructor_gives_verls_items(tmp_path):
    path = _write(tmp_path, _rows(3))
    dataset = RLHFDataset(path, CharTokenizer(), OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 64}))
    assert len(dataset) == 3
    item = dataset[2]
    assert item["raw_prompt"] == [{"role": "user", "content": "qxx"}]
    assert item["index"] == 102 and item["tools_kwargs"] == {"calc": {"n": 2}} and item["interaction_kwargs"] == {}
    assert item["reward_model"] == {"ground_truth": "2", "style": "rule"} and item["data_source"] == "toy"
    assert torch.equal(item["dummy_tensor"], torch.tensor([0], dtype=torch.uint8))
    batch = next(iter(DataLoader(dataset, batch_size=2, collate_fn=collate_fn)))
    assert batch["dummy_tensor"].shape == (2, 1) and batch["index"].tolist() == [100, 101]


def test_verl_constructor_filters_long_prompts_and_takes_max_samples(tmp_path):
    path = _write(tmp_path, _rows(6))
    # prompt i has i + 1 characters = tokens: a limit of 3 keeps i = 0, 1, 2
    short = RLHFDataset(path, CharTokenizer(), {"max_prompt_length": 3, "filter_overlong_prompts": True})
    assert [item["index"] for item in short] == [100, 101, 102]
    kept = RLHFDataset(path, CharTokenizer(), {"max_prompt_length": 3, "filter_overlong_prompts": False})
    assert len(kept) == 6
    first = RLHFDataset(path, CharTokenizer(), {"filter_overlong_prompts": False}, max_samples=2)
    assert [item["index"] for item in first] == [100, 101]
    config = {"filter_overlong_prompts": False, "shuffle": True, "seed": 3}
    sample = [item["index"] for item in RLHFDataset(path, CharTokenizer(), config, max_samples=4)]
    assert sample == [item["index"] for item in RLHFDataset(path, CharTokenizer(), config, max_samples=4)]
    assert len(set(sample)) == 4 and set(sample) <= set(range(100, 106))


def test_verl_constructor_refuses_processor_and_media(tmp_path):
    path = _write(tmp_path, _rows(1))
    with pytest.raises(ValueError, match="multimodal"):
        RLHFDataset(path, CharTokenizer(), {}, processor=object())
    with_images = _write(tmp_path, [{**_rows(1)[0], "images": ["a.png"]}])
    with pytest.raises(ValueError, match="multimodal"):
        RLHFDataset(with_images, CharTokenizer(), {"filter_overlong_prompts": False})
    with pytest.raises(TypeError, match="config"):
        RLHFDataset(path, CharTokenizer())
    with pytest.raises(ValueError, match="tool_config_path"):
        RLHFDataset(path, CharTokenizer(), {"tool_config_path": "tools.yaml"})


def test_package_constructor_still_gives_its_own_items(tmp_path):
    path = _write(tmp_path, [{"prompt": "2+2=", "ground_truth": "4"}])
    item = RLHFDataset(path)[0]
    assert item["raw_prompt"] == "2+2=" and item["ground_truth"] == "4" and item["index"] == 0
    assert "dummy_tensor" not in item
