"""Partial rollouts on CUDA: a weight switch after 3 tokens, on the lean key/value-cached decoder of the rollout
workers, continues each unfinished response with the new weights (``verl.workers.rollout.partial``).

The checks are those of ``tests/workers/rollout/test_partial.py`` (greedy tokens are the argmax of the model that
produced them, per-token versions, the rollout's log-probs of the new model after the cut); on CUDA the decoder keeps
its projections unfused and SDPA runs CUDA kernels, and the switch loads the new weights into a model on the GPU.
"""

import pytest

from tests.special_gpu.checks import NEEDS_CUDA
from tests.workers.rollout.test_partial import check_a_switch_after_3_tokens, two_models


@pytest.mark.gpu
@NEEDS_CUDA
def test_a_switch_after_3_tokens_continues_with_the_new_weights_on_cuda():
    check_a_switch_after_3_tokens(two_models("cuda"), "cuda")
