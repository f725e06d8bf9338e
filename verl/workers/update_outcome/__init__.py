"""What happens when an optimizer update fails: a policy, chosen by name from a registry.

Backends report an :class:`UpdateOutcome` after every optimizer step; the handler built from
``update_failure_policy`` turns it into metrics or stops training with :class:`UpdateFailedError`. Register a
policy of your own with :func:`register_update_outcome_handler` and select it by name (with ``module:`` so every
worker process imports it). A training step of a model returns an :class:`UpdateResult` (its outcomes and the run's
counts, read by code; its metrics, read by people). See docs/advance/update_failure_policy.md.
"""

from verl.workers.update_outcome.base import (
    UPDATE_OUTCOME_HANDLER_REGISTRY,
    UpdateOutcomeHandler,
    get_update_outcome_handler_cls,
    list_update_outcome_handlers,
    register_update_outcome_handler,
)
from verl.workers.update_outcome.builder import build_update_outcome_handler, is_fp16, resolve_policy_name
from verl.workers.update_outcome.handlers import FP16WarnAndCountHandler, StrictHandler
from verl.workers.update_outcome.outcome import (
    UNSCALABLE_CAUSES,
    FailureCause,
    UpdateFailedError,
    UpdateOutcome,
    policy_config_key,
)
from verl.workers.update_outcome.result import UpdateResult, merge_rank_results

__all__ = [
    "UNSCALABLE_CAUSES",
    "UPDATE_OUTCOME_HANDLER_REGISTRY",
    "FailureCause",
    "FP16WarnAndCountHandler",
    "StrictHandler",
    "UpdateFailedError",
    "UpdateOutcome",
    "UpdateOutcomeHandler",
    "UpdateResult",
    "build_update_outcome_handler",
    "get_update_outcome_handler_cls",
    "is_fp16",
    "list_update_outcome_handlers",
    "merge_rank_results",
    "policy_config_key",
    "register_update_outcome_handler",
    "resolve_policy_name",
]
