"""Tests for the shared post-processing: eos masking, positions, padding to the response length."""

import pytest
import torch

from verl.workers.rollout.postprocess import (
    as_eos_ids,
    build_rollout_output,
    check_prompts,
    compute_position_ids,
    mask_after_eos,
)

from .conftest import make_prompts

EOS = 2
PAD = 0


def test_mask_after_eos_keeps_first_eos():
    responses = torch.tensor([[4, 2, 5, 2], [4, 5, 6, 7], [2, 2, 2, 2]])
    # row 0: eos at 1 -> [1,1,0,0]; row 1: no eos -> all 1; row 2: eos at 0 -> [1,0,0,0]
    expected = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert torch.equal(mask_after_eos(responses, [EOS]), expected)


def test_mask_after_eos_with_several_eos_ids():
    responses = torch.tensor([[4, 9, 2, 5]])
    assert torch.equal(mask_after_eos(responses, [2, 9]), torch.tensor([[1, 1, 0, 0]]))


def test_compute_position_ids():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    # cumsum - 1 = [-1,-1,0,1,2,2] -> clamp -> [0,0,0,1,2,2]
    expected = torch.tensor([[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]])
    assert torch.equal(compute_position_ids(mask), expected)


def test_build_output_pads_to_length_and_masks_after_eos():
    prompts = make_prompts([[5], [6, 7]], num_prompt_tokens=2, non_tensors={"uid": ["a", "b"]}, meta={"k": 1})
    # generation stopped after 3 tokens because both rows ended; row 0 has junk after its eos
    raw = torch.tensor([[8, 2, 9], [8, 9, 2]])
    out = build_rollout_output(prompts, raw, response_length=5, pad_token_id=PAD, eos_token_id=EOS)
    assert torch.equal(out.batch["responses"], torch.tensor([[8, 2, 0, 0, 0], [8, 9, 2, 0, 0]]))
    assert torch.equal(out.batch["response_mask"], torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]))
    assert torch.equal(out.batch["prompts"], torch.tensor([[0, 5], [6, 7]]))
    assert torch.equal(out.batch["input_ids"], torch.tensor([[0, 5, 8, 2, 0, 0, 0], [6, 7, 8, 9, 2, 0, 0]]))
    assert torch.equal(out.batch["attention_mask"], torch.tensor([[0, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0]]))
    # row 0: cumsum-1 of [0,1,1,1,0,0,0] = [-1,0,1,2,2,2,2] -> clamp [0,0,1,2,2,2,2]
    assert torch.equal(out.batch["position_ids"], torch.tensor([[0, 0, 1, 2, 2, 2, 2], [0, 1, 2, 3, 4, 4, 4]]))
    assert list(out.non_tensor_batch["uid"]) == ["a", "b"] and out.meta_info == {"k": 1}


def test_build_output_cuts_longer_responses():
    prompts = make_prompts([[5]], num_prompt_tokens=1)
    out = build_rollout_output(
        prompts, torch.tensor([[3, 4, 5, 2]]), response_length=2, pad_token_id=PAD, eos_token_id=EOS
    )
    assert torch.equal(out.batch["responses"], torch.tensor([[3, 4]]))
    assert torch.equal(out.batch["response_mask"], torch.tensor([[1, 1]]))


def test_check_prompts_rejects_right_padding_and_missing_keys():
    prompts = make_prompts([[5, 6], [7]], num_prompt_tokens=2)
    prompts.batch["attention_mask"] = torch.tensor([[1, 1], [1, 0]])
    with pytest.raises(ValueError, match="LEFT-padded"):
        check_prompts(prompts)
    prompts.pop(batch_keys="position_ids")
    with pytest.raises(ValueError, match="position_ids"):
        check_prompts(prompts)


@pytest.mark.parametrize("bad", [None, [], "2", [1.5], True])
def test_eos_id_validation(bad):
    with pytest.raises(ValueError, match="eos_token_id"):
        as_eos_ids(bad)
