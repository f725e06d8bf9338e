"""A tiny model of megatron-core's DynamicGradScaler, to drive handlers with realistic outcome sequences.

On an overflow the hysteresis tracker drops by one and the scale halves once the tracker reaches zero (never
below the floor); ``growth_interval`` clean steps in a row double the scale and reset the tracker.
"""

from verl.workers.update_outcome import UpdateOutcome


class SimulatedScaler:
    def __init__(self, initial=2.0**32, min_scale=1.0, hysteresis=2, growth_interval=1000):
        self.scale = initial
        self.min_scale = min_scale
        self.hysteresis = hysteresis
        self.growth_interval = growth_interval
        self._hysteresis_left = hysteresis
        self._clean_steps = 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._clean_steps = 0
            self._hysteresis_left -= 1
            if self._hysteresis_left <= 0:
                self.scale = max(self.scale * 0.5, self.min_scale)
        else:
            self._clean_steps += 1
            if self._clean_steps == self.growth_interval:
                self._clean_steps = 0
                self._hysteresis_left = self.hysteresis
                self.scale *= 2.0


def simulate(overflows, num_steps, scaler=None, role="actor"):
    """Yield the outcome of each step; ``overflows(step, scale)`` says whether that step's gradients overflow."""
    scaler = scaler or SimulatedScaler()
    for step in range(1, num_steps + 1):
        used_scale = scaler.scale
        found_inf = overflows(step, used_scale)
        scaler.update(found_inf)
        yield UpdateOutcome(
            successful=not found_inf,
            grad_norm=None if found_inf else 1.0,
            num_zeros_in_grad=None,
            loss_scale=used_scale,
            min_loss_scale=scaler.min_scale,
            step=step,
            role=role,
        )
