"""Tests for the rollouts' random state: a rollout loaded with another's state continues that one's stream."""

import io

import pytest
import torch

from verl.workers.rollout import BaseRollout, HFRollout, NaiveRollout

from .conftest import PAD_ID, build_tiny_model, hf_logits_fn, make_prompts, sampling_options

UNUSED_EOS = 31
# n=2 at temperature 1.5 over 3 prompts, 6 tokens: 36 draws over 32 tokens per call, so two different random
# streams giving identical responses is practically impossible
SAMPLING = {"response_length": 6, "n": 2, "temperature": 1.5, "seed": 11}


def _naive(model, **overrides):
    return NaiveRollout(hf_logits_fn(model), sampling_options(**{**SAMPLING, **overrides}), PAD_ID, UNUSED_EOS)


def _hf(model, **overrides):
    return HFRollout(model, sampling_options(**{**SAMPLING, **overrides}), PAD_ID, UNUSED_EOS)


def _responses(rollout, prompts):
    return rollout.generate_sequences(prompts).batch["responses"]


def _weights_only_round_trip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("build", [_naive, _hf], ids=["naive", "hf"])
@pytest.mark.parametrize("through_torch_save", [False, True], ids=["in_memory", "torch_save"])
def test_loaded_rollout_continues_the_saved_stream(tiny_model, prompts, build, through_torch_save):
    rollout_a = build(tiny_model)
    for _ in range(3):
        _responses(rollout_a, prompts)
    state = rollout_a.state_dict()
    if through_torch_save:
        state = _weights_only_round_trip(state)
    # A's 4th call runs before B loads: the saved state must be a snapshot, not a view of A's live generator
    fourth_of_a = _responses(rollout_a, prompts)
    rollout_b = build(tiny_model)
    rollout_b.load_state_dict(state)
    assert torch.equal(_responses(rollout_b, prompts), fourth_of_a)
    # without the state, a fresh rollout replays the stream from its first call, which differs from the 4th
    assert not torch.equal(_responses(build(tiny_model), prompts), fourth_of_a)


def test_naive_state_is_per_device_plain_tensors(tiny_model, prompts):
    rollout = _naive(tiny_model)
    # the generator is made at first use, so a rollout never called has no state yet
    assert rollout.state_dict() == {"generators": {}}
    _responses(rollout, prompts)
    state = rollout.state_dict()
    assert list(state["generators"]) == ["cpu"]
    assert state["generators"]["cpu"].dtype == torch.uint8


def test_unused_state_loads_as_a_fresh_start(tiny_model, prompts):
    rollout = _naive(tiny_model)
    rollout.load_state_dict(_naive(tiny_model).state_dict())
    assert torch.equal(_responses(rollout, prompts), _responses(_naive(tiny_model), prompts))


def test_greedy_calls_leave_the_hf_seed_stream_alone(tiny_model, prompts):
    # validation is greedy: it must not shift the training stream, or a resume would diverge at each test_freq
    with_validation = _hf(tiny_model)
    _responses(with_validation, make_prompts([[5, 6]], 2, meta={"do_sample": False}))
    assert torch.equal(_responses(with_validation, prompts), _responses(_hf(tiny_model), prompts))


def test_unseeded_rollouts_keep_no_random_state(tiny_model, prompts):
    naive, hf = _naive(tiny_model, seed=None), _hf(tiny_model, seed=None)
    _responses(naive, prompts)
    assert naive.state_dict() == {"generators": {}}
    assert hf.state_dict() == {"seed_source": None}
    naive.load_state_dict({"generators": {}})
    hf.load_state_dict({"seed_source": None})


@pytest.mark.parametrize(("target", "source"), [("naive", "hf"), ("hf", "naive")])
def test_state_of_another_rollout_is_rejected(tiny_model, target, source):
    builders = {"naive": _naive, "hf": _hf}
    state = builders[source](tiny_model).state_dict()
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name"):
        builders[target](tiny_model).load_state_dict(state)


def test_seeded_state_into_unseeded_rollout_is_rejected(tiny_model, prompts):
    seeded_naive = _naive(tiny_model)
    _responses(seeded_naive, prompts)
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.seed"):
        _naive(tiny_model, seed=None).load_state_dict(seeded_naive.state_dict())
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.seed"):
        _hf(tiny_model, seed=None).load_state_dict(_hf(tiny_model).state_dict())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_naive_cuda_generator_state_round_trips(prompts):
    model = build_tiny_model("qwen2").cuda()
    cuda_prompts = prompts.to("cuda")
    rollout_a = _naive(model)
    _responses(rollout_a, cuda_prompts)
    state = _weights_only_round_trip(rollout_a.state_dict())
    assert list(state["generators"]) == ["cuda:0"]
    fourth_of_a = _responses(rollout_a, cuda_prompts)
    rollout_b = _naive(model)
    rollout_b.load_state_dict(state)
    assert torch.equal(_responses(rollout_b, cuda_prompts), fourth_of_a)


def test_base_rollout_runs_the_shared_skeleton_around_the_hook():
    class CountingRollout(BaseRollout):
        """Emits 1, 2, 3, ... per row and records what the hook was given."""

        def __init__(self, config):
            super().__init__(config, pad_token_id=PAD_ID, eos_token_id=3)
            self.seen = None

        def _generate_tokens(self, input_ids, attention_mask, params):
            self.seen = (input_ids.clone(), attention_mask.clone(), params)
            return torch.arange(1, 5).expand(input_ids.shape[0], 4)

    rollout = CountingRollout(sampling_options(response_length=5, n=3))
    prompts = make_prompts([[5, 6], [7]], num_prompt_tokens=2, non_tensors={"uid": ["a", "b"]}, meta={"n": 2})
    out = rollout.generate_sequences(prompts)
    input_ids, attention_mask, params = rollout.seen
    # meta_info n=2 overrides the configured 3; rows repeated interleaved: [a, a, b, b]
    assert params.n == 2
    assert input_ids.tolist() == [[5, 6], [5, 6], [PAD_ID, 7], [PAD_ID, 7]]
    assert attention_mask.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    # tokens [1, 2, 3, 4] with eos 3: kept up to and including eos, then padded; the 4 tokens padded to R=5
    assert out.batch["responses"].tolist() == [[1, 2, 3, PAD_ID, PAD_ID]] * 4
    assert out.batch["response_mask"].tolist() == [[1, 1, 1, 0, 0]] * 4
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    # a rollout without random state of its own has an empty state and refuses another rollout's
    assert rollout.state_dict() == {}
    rollout.load_state_dict({})
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name"):
        rollout.load_state_dict({"generators": {}})


def test_base_skeleton_rejects_right_padded_prompts():
    class NeverCalled(BaseRollout):
        def _generate_tokens(self, input_ids, attention_mask, params):
            raise AssertionError("the prompts should be rejected before generation")

    prompts = make_prompts([[5, 6], [7]], num_prompt_tokens=2)
    prompts.batch["attention_mask"] = prompts.batch["attention_mask"].flip(-1)
    with pytest.raises(ValueError, match="LEFT-padded"):
        NeverCalled(sampling_options(n=1, response_length=2), PAD_ID, 3).generate_sequences(prompts)
