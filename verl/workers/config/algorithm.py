"""Algorithm sections beyond the estimator: rollout correction (with verl's presets) and DAPO's two pieces.

:class:`RolloutCorrectionConfig` is ``algorithm.rollout_correction``; its class methods are the presets verl
documents (``RolloutCorrectionConfig.decoupled_seq_is()``, ``.bypass_pg_is()``, ...), each the YAML defaults with a
few keys changed. :class:`FilterGroupsConfig` is ``algorithm.filter_groups``, DAPO's dynamic sampling, and
:class:`OverlongBufferConfig` is ``reward_model.overlong_buffer``, DAPO's overlong reward shaping;
:class:`KLControlConfig` is ``algorithm.kl_ctrl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from verl.workers.config.schema import BaseConfig, FieldError, build_config, check_int, check_number


@dataclasses.dataclass(frozen=True)
class KLControlConfig(BaseConfig):
    """``algorithm.kl_ctrl``: the coefficient of the KL penalty in the reward, fixed or adaptive."""

    type: Literal["fixed", "adaptive"]
    kl_coef: float
    target_kl: float
    horizon: int

    def check(self) -> None:
        check_number(self, "kl_coef", 0.0)
        check_number(self, "target_kl", 0.0, exclusive_min=True)
        check_int(self, "horizon", 1)


@dataclasses.dataclass(frozen=True)
class RolloutCorrectionConfig(BaseConfig):
    """``algorithm.rollout_correction``: importance weights and rejection for the rollout/trainer mismatch.

    ``rollout_rs`` is built in its canonical form (:meth:`from_shorthand`, from the YAML and the presets): criteria
    comma separated, each once, this project's earlier names ``token`` / ``sequence`` replaced by the verl options
    they equal (``token_k1`` / ``seq_sum_k1``). Readers parse it again, so a hand-built section may spell it freely.
    """

    KEY: ClassVar[str] = "algorithm.rollout_correction"

    rollout_is: Literal["token", "sequence"] | None
    # null: no importance weights (verl computes them only with a threshold); then rollout_is must be null too
    rollout_is_threshold: float | str | None
    rollout_is_batch_normalize: bool
    rollout_rs: str | None
    rollout_rs_threshold: float | str | None
    bypass_mode: bool
    loss_type: Literal["ppo_clip", "reinforce"]

    @classmethod
    def from_shorthand(cls, value: Any, key: str) -> Any:
        """``rollout_rs`` in its canonical form while the section is built (a spelling that does not parse is left
        as written, for :meth:`check` to name)."""
        from verl.algorithms.rollout_corr_thresholds import parse_rs_options

        if not isinstance(value, Mapping) or not isinstance(value.get("rollout_rs"), str):
            return value
        try:
            return {**value, "rollout_rs": ",".join(parse_rs_options(value["rollout_rs"]))}
        except ValueError:
            return value

    def check(self) -> None:
        from verl.algorithms.rollout_corr_thresholds import (
            parse_is_threshold,
            parse_rs_options,
            parse_rs_thresholds,
        )

        if self.rollout_is_threshold is None:
            if self.rollout_is is not None:
                raise FieldError(
                    "rollout_is_threshold",
                    f"=null with rollout_is={self.rollout_is}: verl computes no importance weights without a "
                    "threshold, so the weights rollout_is asks for would silently not apply. Give a threshold (e.g. "
                    "2.0, or '0.5_5.0' for IcePop), or set algorithm.rollout_correction.rollout_is=null.",
                )
        else:
            try:
                parse_is_threshold(self.rollout_is_threshold)
            except (TypeError, ValueError) as err:
                raise FieldError("rollout_is_threshold", f"={self.rollout_is_threshold!r}: {err}") from None
        if self.rollout_rs is not None:
            try:
                options = parse_rs_options(self.rollout_rs)
            except ValueError as err:
                raise FieldError("rollout_rs", f"={self.rollout_rs!r}: {err}") from None
            try:
                parse_rs_thresholds(options, self.rollout_rs_threshold)
            except (TypeError, ValueError) as err:
                raise FieldError("rollout_rs_threshold", f"={self.rollout_rs_threshold!r}: {err}") from None
        if self.loss_type == "reinforce" and not self.bypass_mode:
            raise FieldError(
                "loss_type",
                "=reinforce weights the policy gradient by pi/pi_rollout itself, which needs bypass_mode=true (the "
                "rollout's log-probs as the old ones); set algorithm.rollout_correction.bypass_mode=true.",
            )

    @property
    def enabled(self) -> bool:
        """Whether anything changes the loss (metrics are logged either way)."""
        return self.rollout_is is not None or self.rollout_rs is not None or self.bypass_mode

    # ------------------------------------------------------------------ verl's presets

    @classmethod
    def _preset(cls, **changes: Any) -> RolloutCorrectionConfig:
        from verl.workers.config.roles import trainer_yaml_section

        return build_config(cls, {**trainer_yaml_section(cls.KEY), **changes})

    @classmethod
    def disabled(cls) -> RolloutCorrectionConfig:
        """Metrics only: no weights, no rejection."""
        return cls._preset(rollout_is=None, rollout_rs=None)

    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Token-TIS: per-token weights truncated at ``threshold``, against a separate old-log-prob pass."""
        return cls._preset(rollout_is="token", rollout_is_threshold=threshold, rollout_rs=None)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Seq-TIS: one truncated weight per sequence (the product of its token ratios)."""
        return cls._preset(rollout_is="sequence", rollout_is_threshold=threshold, rollout_rs=None)

    @classmethod
    def decoupled_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        """IcePop: token weights outside [``threshold_lower``, ``threshold``] are zeroed (the mask is kept)."""
        return cls._preset(rollout_is="token", rollout_is_threshold=f"{threshold_lower}_{threshold}", rollout_rs=None)

    @classmethod
    def decoupled_seq_is_rs(
        cls, is_threshold: float = 2.0, rs_threshold: str | float = "0.5_2.0"
    ) -> RolloutCorrectionConfig:
        """Seq-MIS: sequence weights, and sequences whose ratio product leaves the band rejected (``seq_sum_k1``)."""
        return cls._preset(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_sum_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Geo-RS: sequences whose geometric-mean ratio leaves the band rejected (``seq_mean_k1``), no weights."""
        return cls._preset(rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_geo_rs_seq_tis(
        cls, is_threshold: float = 2.0, rs_threshold: str | float = "0.999_1.001"
    ) -> RolloutCorrectionConfig:
        """Geo-RS with sequence weights."""
        return cls._preset(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_geo_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: str | float = "0.999_1.001"
    ) -> RolloutCorrectionConfig:
        """Geo-RS with token weights."""
        return cls._preset(
            rollout_is="token",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """K3-RS: sequences whose mean k3 divergence exceeds ``rs_threshold`` rejected (``seq_mean_k3``)."""
        return cls._preset(rollout_is=None, rollout_rs="seq_mean_k3", rollout_rs_threshold=rs_threshold)

    @classmethod
    def decoupled_k3_rs_seq_tis(cls, is_threshold: float = 2.0, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """K3-RS with sequence weights."""
        return cls._preset(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k3",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_k3_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: float = 0.01
    ) -> RolloutCorrectionConfig:
        """K3-RS with token weights."""
        return cls._preset(
            rollout_is="token",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k3",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def bypass_ppo_clip(cls) -> RolloutCorrectionConfig:
        """Bypass mode, PPO-clip: the ratio pi_theta / mu is the correction; no old-log-prob pass."""
        return cls._preset(rollout_is=None, rollout_rs=None, bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def bypass_ppo_clip_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Bypass mode, PPO-clip, Geo-RS."""
        return cls._preset(
            rollout_is=None,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="ppo_clip",
        )

    @classmethod
    def bypass_ppo_clip_k3_rs(cls, rs_threshold: float = 0.01) -> RolloutCorrectionConfig:
        """Bypass mode, PPO-clip, K3-RS."""
        return cls._preset(
            rollout_is=None,
            rollout_rs="seq_mean_k3",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="ppo_clip",
        )

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE weighted by truncated sequence weights pi_theta / mu."""
        return cls._preset(
            rollout_is="sequence",
            rollout_is_threshold=threshold,
            rollout_rs=None,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_token_icepop(cls, threshold: float = 5.0, threshold_lower: float = 0.5) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE with IcePop token weights."""
        band = f"{threshold_lower}_{threshold}"
        return cls._preset(
            rollout_is="token", rollout_is_threshold=band, rollout_rs=None, bypass_mode=True, loss_type="reinforce"
        )

    @classmethod
    def bypass_pg_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE, Geo-RS."""
        return cls._preset(
            rollout_is=None,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_geo_rs_seq_tis(
        cls, is_threshold: float = 2.0, rs_threshold: str | float = "0.999_1.001"
    ) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE, Geo-RS with sequence weights."""
        return cls._preset(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="reinforce",
        )

    @classmethod
    def bypass_pg_geo_rs_token_tis(
        cls, is_threshold: float = 2.0, rs_threshold: str | float = "0.999_1.001"
    ) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE, Geo-RS with token weights."""
        return cls._preset(
            rollout_is="token",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_mean_k1",
            rollout_rs_threshold=rs_threshold,
            bypass_mode=True,
            loss_type="reinforce",
        )


@dataclasses.dataclass(frozen=True)
class FilterGroupsConfig(BaseConfig):
    """``algorithm.filter_groups``: DAPO's dynamic sampling, which drops the groups that teach nothing.

    A group (the responses to one prompt) whose ``metric`` values are all equal has zero advantage everywhere under
    group-relative estimators; with ``enable`` such groups are dropped and generation goes on until the batch has
    ``data.train_batch_size`` prompts' groups again, for at most ``max_num_gen_batches`` generation rounds.
    """

    KEY: ClassVar[str] = "algorithm.filter_groups"

    enable: bool
    metric: str
    max_num_gen_batches: int

    def check(self) -> None:
        if not self.metric:
            raise FieldError("metric", "is empty: name a per-sample value, e.g. seq_reward, acc or score.")
        if not (isinstance(self.max_num_gen_batches, int) and self.max_num_gen_batches >= 1):
            raise FieldError(
                "max_num_gen_batches",
                f"={self.max_num_gen_batches!r} must be an integer >= 1: the generation rounds one step may take "
                "before it stops with an error (verl's 0, no limit, would loop forever on a task whose groups are "
                "all uniform).",
            )


@dataclasses.dataclass(frozen=True)
class OverlongBufferConfig(BaseConfig):
    """``reward_model.overlong_buffer``: DAPO's soft penalty for responses near ``data.max_response_length``, added
    by the ``dapo`` reward manager (see :mod:`verl.workers.reward_manager.dapo`)."""

    KEY: ClassVar[str] = "reward_model.overlong_buffer"

    enable: bool
    len: int
    penalty_factor: float
    log: bool

    def check(self) -> None:
        check_int(self, "len", 0)
        check_number(self, "penalty_factor", 0.0)
        if self.enable and self.len == 0:
            raise FieldError(
                "len",
                "=0 with enable=true: give the buffer a length in tokens (the penalty grows over it), or set "
                "reward_model.overlong_buffer.enable=false.",
            )
