"""A user-style module that registers its own handler at import time (imported by the builder via `module:`)."""

from verl.workers.update_outcome import UpdateFailedError, UpdateOutcomeHandler, register_update_outcome_handler


@register_update_outcome_handler("test_every_other")
class EveryOtherHandler(UpdateOutcomeHandler):
    """Tolerates one failure, raises on the second failure in total."""

    def __init__(self, tolerance: int = 1):
        super().__init__()
        self.tolerance = tolerance

    def on_failure(self, outcome):
        if self.num_total_failures > self.tolerance:
            raise UpdateFailedError(f"{outcome.role} step {outcome.step}: too many failures", outcome)


class NotAHandler:
    pass
