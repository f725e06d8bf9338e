"""Tests for verl.utils.dataset: file datasets, the embedded task, prompt collation and the resumable loader."""

import json

import pandas as pd
import pytest
import torch

from verl.models.loading import load_tokenizer
from verl.utils.dataset import PromptCollator, RLHFDataset, StatefulPromptLoader, make_tiny_task_dataset
from verl.utils.reward_score import tiny_task

ROWS = [
    {"prompt": "12=", "ground_truth": "21", "data_source": "tiny_task"},
    {"prompt": "what is 2+2?", "ground_truth": "4", "data_source": "openai/gsm8k"},
    {"prompt": "345=", "ground_truth": "543", "data_source": "tiny_task"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_and_parquet_read_the_same(tmp_path):
    jsonl = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    parquet = tmp_path / "train.parquet"
    pd.DataFrame(ROWS).to_parquet(parquet)
    for dataset in (RLHFDataset(jsonl), RLHFDataset(str(parquet))):
        assert len(dataset) == 3
        assert dataset[1] == {
            "raw_prompt": "what is 2+2?",
            "ground_truth": "4",
            "data_source": "openai/gsm8k",
            "raw_chat": None,  # a plain-string prompt
            "extra_info": None,
            "index": 1,
        }
    both = RLHFDataset([jsonl, parquet])
    assert len(both) == 6 and both[4]["raw_prompt"] == "what is 2+2?"


def test_optional_data_source_and_nested_ground_truth(tmp_path):
    path = _write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "1=", "ground_truth": 7}, {"prompt": "2=", "reward_model": {"ground_truth": "x"}}],
    )
    dataset = RLHFDataset(path, default_data_source="tiny_task")
    assert dataset[0]["data_source"] == "tiny_task"
    assert dataset[0]["ground_truth"] == "7"  # non-string answers become strings
    assert dataset[1]["ground_truth"] == "x"


def test_file_errors(tmp_path):
    csv = tmp_path / "data.csv"
    csv.write_text("prompt,ground_truth\n1=,1\n")
    with pytest.raises(ValueError, match=r"unknown extension '\.csv'.*\.parquet, \.jsonl"):
        RLHFDataset(csv)
    with pytest.raises(ValueError, match="does not exist"):
        RLHFDataset(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="missing column 'ground_truth'"):
        RLHFDataset(_write_jsonl(tmp_path / "a.jsonl", [{"prompt": "1="}]))
    with pytest.raises(ValueError, match="missing column 'prompt'"):
        RLHFDataset(_write_jsonl(tmp_path / "b.jsonl", [{"question": "1=", "ground_truth": "1"}]))
    with pytest.raises(ValueError, match="must hold strings"):
        RLHFDataset(_write_jsonl(tmp_path / "c.jsonl", [{"prompt": 5, "ground_truth": "1"}]))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1=", "ground_truth": "1"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2 \(row 1\): not valid JSON"):
        RLHFDataset(bad)


def test_tiny_task_dataset_is_deterministic():
    first, again, other = (
        make_tiny_task_dataset(50, seed=3),
        make_tiny_task_dataset(50, seed=3),
        make_tiny_task_dataset(50, 4),
    )
    assert [first[i] for i in range(50)] == [again[i] for i in range(50)]
    assert [first[i] for i in range(50)] != [other[i] for i in range(50)]
    row = first[0]
    assert row["data_source"] == "tiny_task"
    assert tiny_task.compute_score(row["ground_truth"], row["ground_truth"]) == 1.0
    assert row["ground_truth"] == row["raw_prompt"][:-1][::-1]
    with pytest.raises(ValueError, match="positive"):
        make_tiny_task_dataset(0)


def test_collate_left_padding_layout(tokenizer):
    collate = PromptCollator(tokenizer, max_prompt_length=6)
    rows = [
        {"raw_prompt": "12=", "ground_truth": "21", "data_source": "tiny_task", "index": 4},
        {"raw_prompt": "3456=", "ground_truth": "6543", "data_source": "tiny_task", "index": 9},
    ]
    batch = collate(rows)
    # "12=" -> <s>=1, '1'=5, '2'=6, '='=14: four tokens, two pads on the left.
    assert batch["input_ids"].tolist() == [[0, 0, 1, 5, 6, 14], [1, 7, 8, 9, 10, 14]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    # clamp(cumsum(mask) - 1, min=0): the pads sit at 0, the first real token too.
    assert batch["position_ids"].tolist() == [[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert batch["input_ids"].dtype == torch.int64 and batch["attention_mask"].dtype == torch.int64
    assert batch["raw_prompt"].dtype == object and list(batch["ground_truth"]) == ["21", "6543"]
    assert list(batch["data_source"]) == ["tiny_task", "tiny_task"]
    assert batch["index"].tolist() == [4, 9]


def test_collate_truncation(tokenizer):
    row = {"raw_prompt": "12345=", "ground_truth": "54321", "data_source": "tiny_task", "index": 0}
    # Seven tokens: <s> 1 2 3 4 5 = -> ids 1, 5, 6, 7, 8, 9, 14; the width is 4.
    with pytest.raises(ValueError, match=r"7 tokens, longer than data.max_prompt_length=4.*'left' or 'right'"):
        PromptCollator(tokenizer, 4)([row])
    assert PromptCollator(tokenizer, 4, truncation="left")([row])["input_ids"].tolist() == [[7, 8, 9, 14]]
    assert PromptCollator(tokenizer, 4, truncation="right")([row])["input_ids"].tolist() == [[1, 5, 6, 7]]
    with pytest.raises(ValueError, match="error, left, right"):
        PromptCollator(tokenizer, 4, truncation="middle")


def _indices(batch_rows):
    return [row["index"] for row in batch_rows]


def test_loader_epochs_and_shuffle():
    dataset = make_tiny_task_dataset(10, seed=0)
    loader = StatefulPromptLoader(dataset, batch_size=3, seed=5)
    assert len(loader) == 3  # 10 // 3 with drop_last
    epoch0 = [_indices(loader.next_batch()) for _ in range(3)]
    assert loader.epoch == 0
    epoch1 = [_indices(loader.next_batch()) for _ in range(3)]
    assert loader.epoch == 1
    flat0 = sum(epoch0, [])
    assert len(set(flat0)) == 9 and set(flat0) <= set(range(10))  # no repeats within an epoch
    assert epoch0 != epoch1  # a fresh order each epoch
    same = StatefulPromptLoader(dataset, batch_size=3, seed=5)
    assert [_indices(b) for b, _ in zip(same, range(3))] == epoch0
    in_order = StatefulPromptLoader(dataset, batch_size=4, shuffle=False, drop_last=False)
    assert len(in_order) == 3 and [_indices(b) for b, _ in zip(in_order, range(3))][2] == [8, 9]


def test_loader_shuffles_once_per_epoch_not_once_per_batch(monkeypatch):
    # the shuffle costs O(rows): on a large dataset, once per batch would dominate the step
    from verl.utils.dataset import loader as dataset_module

    shuffles = []
    real_randperm = torch.randperm

    def counting_randperm(*args, **kwargs):
        shuffles.append(args[0])
        return real_randperm(*args, **kwargs)

    monkeypatch.setattr(dataset_module.torch, "randperm", counting_randperm)
    loader = StatefulPromptLoader(make_tiny_task_dataset(10, seed=0), batch_size=3, seed=5)
    batches = [_indices(loader.next_batch()) for _ in range(7)]  # 3 batches per epoch: epochs 0, 1 and 2
    assert shuffles == [10, 10, 10]
    # and the order is still the seed's and the epoch's alone: a fresh loader moved to epoch 1 hands out the same
    resumed = StatefulPromptLoader(make_tiny_task_dataset(10, seed=0), batch_size=3, seed=5)
    resumed.load_state_dict({"epoch": 1, "batch_index": 0, "seed": 5})
    assert [_indices(resumed.next_batch()) for _ in range(3)] == batches[3:6]


def test_loader_resume_gives_identical_order(tokenizer):
    dataset = make_tiny_task_dataset(20, seed=1)
    collate = PromptCollator(tokenizer, max_prompt_length=8)
    reference = StatefulPromptLoader(dataset, batch_size=4, seed=11, collate_fn=collate)
    full = [reference.next_batch()["index"].tolist() for _ in range(12)]  # 2.4 epochs of 5 batches
    interrupted = StatefulPromptLoader(dataset, batch_size=4, seed=11, collate_fn=collate)
    head = [interrupted.next_batch()["index"].tolist() for _ in range(7)]
    state = json.loads(json.dumps(interrupted.state_dict()))  # survives a round trip through a checkpoint file
    assert state == {"epoch": 1, "batch_index": 2, "seed": 11}
    resumed = StatefulPromptLoader(dataset, batch_size=4, seed=11, collate_fn=collate)
    resumed.load_state_dict(state)
    tail = [resumed.next_batch()["index"].tolist() for _ in range(5)]
    assert head + tail == full
    other_seed = StatefulPromptLoader(dataset, batch_size=4, seed=12)
    with pytest.raises(ValueError, match="data.seed=11"):
        other_seed.load_state_dict(state)
    with pytest.raises(ValueError, match="lacks"):
        resumed.load_state_dict({"epoch": 0})


def test_loader_errors():
    with pytest.raises(ValueError, match="fewer than one batch of 8"):
        StatefulPromptLoader(make_tiny_task_dataset(5), batch_size=8)
    with pytest.raises(ValueError, match="positive"):
        StatefulPromptLoader(make_tiny_task_dataset(5), batch_size=0)
    assert isinstance(make_tiny_task_dataset(2)[0]["index"], int)


class JoinTokenizer:
    """Stands in for a tokenizer: one token per character; a chat template only when given one."""

    pad_token_id = 0

    def __init__(self, chat_template=None):
        self.chat_template = chat_template

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 50 + 1 for c in text]}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


VERL_ROWS = [  # as verl's preprocessing writes them: a chat prompt, the answer under reward_model, extra_info
    {
        "question_text": [{"role": "user", "content": "2+2?"}],
        "source": "openai/gsm8k",
        "reward_model": {"ground_truth": "4", "style": "rule"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "question_text": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a very long one?"}],
        "source": "openai/gsm8k",
        "reward_model": {"ground_truth": "1", "style": "rule"},
        "extra_info": {"split": "train", "index": 1},
    },
]


def test_verl_style_rows_with_chat_prompts_and_renamed_columns(tmp_path):
    from verl.utils.dataset import chat_renderer

    parquet = tmp_path / "verl.parquet"
    pd.DataFrame(VERL_ROWS).to_parquet(parquet)
    with_template = RLHFDataset(
        parquet, prompt_key="question_text", data_source_key="source", render_chat=chat_renderer(JoinTokenizer("t"))
    )
    assert with_template[0]["raw_prompt"] == "<user>2+2?<assistant>"  # the tokenizer's template, turn opened
    assert with_template[0]["raw_chat"] == [{"role": "user", "content": "2+2?"}]
    assert with_template[0]["data_source"] == "openai/gsm8k" and with_template[0]["ground_truth"] == "4"
    assert with_template[1]["extra_info"] == {"split": "train", "index": 1}
    # without a template the contents are joined by newlines
    plain = RLHFDataset(parquet, prompt_key="question_text", render_chat=chat_renderer(JoinTokenizer()))
    assert plain[1]["raw_prompt"] == "be brief\na very long one?"
    with pytest.raises(ValueError, match="holds chats, but no chat renderer"):
        RLHFDataset(parquet, prompt_key="question_text")


def test_collator_reports_lengths_and_returns_raw_chats_when_asked(tmp_path):
    from verl.utils.dataset import chat_renderer

    parquet = tmp_path / "verl.parquet"
    pd.DataFrame(VERL_ROWS).to_parquet(parquet)
    dataset = RLHFDataset(parquet, prompt_key="question_text", render_chat=chat_renderer(JoinTokenizer()))
    collate = PromptCollator(JoinTokenizer(), max_prompt_length=8, truncation="left", return_raw_chat=True)
    # "2+2?" is 4 characters = 4 tokens; "be brief\na very long one?" is 25
    assert [collate.num_tokens(dataset[i]) for i in range(2)] == [4, 25]
    kept = dataset.filter(lambda row: collate.num_tokens(row) <= 8)
    assert len(kept) == 1 and kept[0]["ground_truth"] == "4"
    batch = collate([dataset[0], dataset[1]])
    assert batch["raw_chat"][0] == [{"role": "user", "content": "2+2?"}]
    assert batch["extra_info"][1] == {"split": "train", "index": 1}
    assert "raw_chat" not in PromptCollator(JoinTokenizer(), max_prompt_length=8, truncation="left")([dataset[0]])


def test_a_chat_template_that_writes_the_bos_gets_one_bos():
    # the tiny tokenizer adds its BOS (<s>, id 1) to what it encodes; a template that writes {{ bos_token }} itself
    # (as Llama 3's, Gemma's and Mistral's do) must not get a second one; a plain prompt keeps the tokenizer's
    from verl.models.loading import load_tokenizer
    from verl.utils.dataset import chat_renderer

    tokenizer = load_tokenizer("default")
    tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chat = [{"role": "user", "content": "12="}]
    collate = PromptCollator(tokenizer, max_prompt_length=8, truncation="error")
    templated = {"raw_prompt": chat_renderer(tokenizer)(chat), "raw_chat": chat}
    plain = {"raw_prompt": "12=", "raw_chat": None}
    bos = tokenizer.bos_token_id
    assert collate.token_ids(templated) == collate.token_ids(plain) == tokenizer("12=")["input_ids"]
    assert collate.token_ids(templated).count(bos) == 1 and collate.num_tokens(templated) == 4
    # the overlong filter's batched count: the same per row, rendered chats and plain prompts mixed
    longer = {"raw_prompt": "123+45=", "raw_chat": None}
    assert collate.token_counts([templated, longer, plain]) == [4, collate.num_tokens(longer), 4]
