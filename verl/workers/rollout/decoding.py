"""Old home of the incremental decoders, kept so that ``verl.workers.rollout.decoding`` imports keep working.

The decoders moved to :mod:`verl.models.decoding`: the actor (for its rollout-side log-probs) and the megatron model
code use them as well as the rollout engines, and a module they all import lives below all of them.
"""

from verl.models.decoding import (  # noqa: F401  (re-exported under the old path)
    GROUPED_QUERY_SDPA,
    AutocastFactory,
    HFCachedDecoder,
    IncrementalDecoder,
    LogitsFn,
    PreallocatedCacheLayer,
    RecomputeDecoder,
    grouped_query_sdpa_attention,
    last_logits,
)
