"""Log-prob and entropy kernels that never hold a whole (tokens, vocab) logits tensor (``model.use_fused_kernels``).

See :mod:`verl.utils.kernel.linear_cross_entropy`.
"""

from verl.utils.kernel.linear_cross_entropy import (
    FUSED_KERNEL_BACKENDS,
    chunk_rows_for_vocab,
    linear_log_probs_and_entropy,
    response_log_probs_from_hidden,
)

__all__ = [
    "FUSED_KERNEL_BACKENDS",
    "chunk_rows_for_vocab",
    "linear_log_probs_and_entropy",
    "response_log_probs_from_hidden",
]
