"""verl's ``agent_name`` column (which agent loop runs a row) survives from the data file into the prompt batch."""

from verl.models.loading import load_tokenizer
from verl.utils.dataset import PromptCollator
from verl.utils.dataset.rl_dataset import RLHFDataset


def test_agent_name_is_kept_per_row_and_absent_rows_get_none():
    records = [
        {"prompt": "1+1?", "ground_truth": "2", "data_source": "calc", "agent_name": "tool_agent"},
        {"prompt": "2+2?", "ground_truth": "4", "data_source": "calc"},
    ]
    dataset = RLHFDataset.from_records(records)
    assert dataset[0]["agent_name"] == "tool_agent" and "agent_name" not in dataset[1]
    collate = PromptCollator(load_tokenizer("default"), max_prompt_length=32)
    batch = collate([dataset[0], dataset[1]])
    # the second row runs rollout.agent.default_agent_loop (None here)
    assert list(batch["agent_name"]) == ["tool_agent", None]
    # a batch without any agent_name has no such column (every row then runs the default loop)
    assert "agent_name" not in collate([dataset[1]])
