"""The ``dapo`` reward manager: naive scores plus DAPO's overlong penalty, with hand-derived numbers."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.errors import ValidationError
from verl.workers.reward_manager import DAPORewardManager, get_reward_manager_cls
from verl.workers.reward_manager.dapo import overlong_penalty


class DigitTokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i) for i in ids)


def half(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5


def batch(lengths, max_len=8):
    mask = torch.tensor([[1] * n + [0] * (max_len - n) for n in lengths])
    return DataProto.from_dict(
        tensors={"responses": torch.ones(len(lengths), max_len, dtype=torch.long), "response_mask": mask},
        non_tensors={
            "ground_truth": np.array(["1"] * len(lengths), dtype=object),
            "data_source": np.array(["unit"] * len(lengths), dtype=object),
        },
    )


def buffer(enable=True, length=2, factor=1.0, log=True):
    return SimpleNamespace(enable=enable, len=length, penalty_factor=factor, log=log)


def test_penalty_grows_linearly_over_the_buffer():
    # max 8, buffer 2: no penalty up to 6 tokens; 7 tokens: -(7 - 6) / 2 = -0.5; 8 tokens: -1.0; factor 0.5 halves it
    assert overlong_penalty(torch.tensor([5, 6, 7, 8]), 8, 2, 1.0).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(torch.tensor([8]), 8, 2, 0.5).tolist() == [-0.5]


def test_scores_get_the_penalty_on_their_last_token_and_report_it():
    manager = DAPORewardManager(DigitTokenizer(), compute_score=half, max_resp_len=8, overlong_buffer_cfg=buffer())
    assert get_reward_manager_cls("dapo") is DAPORewardManager
    result = manager(batch([4, 7, 8]), return_dict=True)
    rewards = result["reward_tensor"]
    # 0.5 each, on the last valid token, minus 0, 0.5, 1.0
    assert rewards.sum(-1).tolist() == pytest.approx([0.5, 0.0, -0.5])
    assert rewards[1, 6] == pytest.approx(0.0) and rewards[2, 7] == pytest.approx(-0.5)
    extra = result["reward_extra_info"]
    assert extra["acc"] == [0.5, 0.5, 0.5]  # a plain-number score is also reported as acc, as in verl
    assert extra["overlong_reward"] == pytest.approx([0.0, -0.5, -1.0]) and extra["overlong"] == [False, True, True]


def test_without_the_buffer_it_scores_as_naive():
    manager = DAPORewardManager(DigitTokenizer(), compute_score=half, overlong_buffer_cfg=buffer(enable=False))
    assert manager(batch([8])).sum().item() == pytest.approx(0.5)  # no max_resp_len needed when off


@pytest.mark.parametrize(
    "max_resp_len, cfg, match",
    [
        (None, buffer(), "needs max_resp_len"),
        (8, buffer(length=0), "len must be > 0"),
        (1, buffer(length=2), "max_resp_len must be larger than overlong_buffer.len"),
    ],
)
def test_bad_buffers_are_refused_as_verl_asserts(max_resp_len, cfg, match):
    with pytest.raises(AssertionError, match=match):  # ValidationError: a ValueError and an AssertionError
        DAPORewardManager(DigitTokenizer(), compute_score=half, max_resp_len=max_resp_len, overlong_buffer_cfg=cfg)
    with pytest.raises(ValidationError):
        DAPORewardManager(DigitTokenizer(), compute_score=half, max_resp_len=max_resp_len, overlong_buffer_cfg=cfg)
