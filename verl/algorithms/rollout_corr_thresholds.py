"""Rollout-correction settings as written in the config: rejection options and threshold forms, parsed and checked.

``algorithm.rollout_correction`` names its rejection criteria as text (``rollout_rs: "token_k1,seq_max_k3"``) and
its thresholds as numbers or strings (``rollout_is_threshold: 2.0`` truncates, ``"0.5_5.0"`` is a band;
``rollout_rs_threshold: "0.5_2.0,3.0"`` gives one threshold per criterion). The parsers here turn them into
numbers, raising ``ValueError`` (``TypeError`` for a value of the wrong kind) with the accepted forms, so that the
config check at start-up and the computation in :mod:`verl.algorithms.rollout_corr_helper` read them alike.

The criteria: ``k1`` is -log r = log(mu / pi) (a ratio, bounded on both sides: ``lower_upper``, or one number C
meaning ``1/C_C``), ``k2`` is (log r)^2 / 2 and ``k3`` is r - 1 - log r (divergences, bounded above only), with
r = pi_old / mu per token. ``token_*`` judges each token; ``seq_sum_*``, ``seq_mean_*`` and ``seq_max_*`` judge a
sequence by the sum, mean or maximum over its tokens and keep or reject it whole.
"""

from __future__ import annotations

import math
from typing import Any

# log-ratios are clamped to +-20 before exponentiating: exp(20) is about 4.9e8, exp(-20) about 2e-9
SAFETY_BOUND = 20.0

SUPPORTED_ROLLOUT_RS_OPTIONS: set[str] = {
    *(f"{level}_k{k}" for level in ("token", "seq_sum", "seq_mean") for k in (1, 2, 3)),
    "seq_max_k2",
    "seq_max_k3",
}
TOKEN_LEVEL_ROLLOUT_RS_OPTIONS: set[str] = {"token_k1", "token_k2", "token_k3"}

# this project's earlier rejection settings and the verl option each one equals (a band [1/C, C] on the token
# ratio, or on the product of a sequence's ratios: k1 with one threshold C is that band)
RS_ALIASES: dict[str, str] = {"token": "token_k1", "sequence": "seq_sum_k1"}


def parse_is_threshold(spec: Any) -> tuple[float, float | None]:
    """``rollout_is_threshold`` as (upper, lower): a number (or numeric string) C truncates the weights at C
    (lower None); ``"lower_upper"`` keeps weights inside the band and zeroes the rest (IcePop).

    Raises:
        TypeError: a boolean, or neither a number nor a string.
        ValueError: an unreadable string, a bound <= 0, or lower > upper.
    """
    if isinstance(spec, bool):
        raise TypeError("rollout_is_threshold must be a number or a 'lower_upper' string, not a boolean.")
    if isinstance(spec, int | float):
        upper, lower = float(spec), None
    elif isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ValueError("rollout_is_threshold must not be an empty string; use e.g. 2.0 or '0.5_5.0'.")
        parts = text.split("_", 1)
        try:
            numbers = [float(part) for part in parts]
        except ValueError:
            raise ValueError(
                f"rollout_is_threshold={spec!r} is not a number nor a 'lower_upper' pair; use e.g. 2.0 or '0.5_5.0'."
            ) from None
        upper, lower = (numbers[0], None) if len(numbers) == 1 else (numbers[1], numbers[0])
    else:
        raise TypeError(f"rollout_is_threshold must be a number or a 'lower_upper' string, got {spec!r}.")
    if not upper > 0 or (lower is not None and not lower > 0):
        raise ValueError(f"rollout_is_threshold={spec!r}: its bounds must be > 0.")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_is_threshold={spec!r}: the lower bound must not exceed the upper one.")
    return upper, lower


def parse_rs_options(rollout_rs: Any) -> list[str]:
    """The rejection criteria of ``rollout_rs`` (comma separated), in order, each once; ``token`` and ``sequence``
    (this project's earlier names) become ``token_k1`` and ``seq_sum_k1``.

    Raises:
        ValueError: not a non-empty string, or an unknown criterion (the message lists the known ones).
    """
    if not isinstance(rollout_rs, str) or not rollout_rs.strip():
        raise ValueError("rollout_rs must be a non-empty string of comma-separated criteria, e.g. 'token_k1'.")
    options: list[str] = []
    for raw in rollout_rs.split(","):
        name = RS_ALIASES.get(raw.strip(), raw.strip())
        if not name:
            continue
        if name not in SUPPORTED_ROLLOUT_RS_OPTIONS:
            raise ValueError(
                f"rollout_rs option {raw.strip()!r} is not supported; use any of "
                f"{sorted(SUPPORTED_ROLLOUT_RS_OPTIONS)}, comma separated."
            )
        if name not in options:
            options.append(name)
    if not options:
        raise ValueError("rollout_rs names no criterion; give at least one, e.g. 'token_k1'.")
    return options


def _positive(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"rollout_rs_threshold {text!r} for {option} is not a number.") from None
    if not value > 0:
        raise ValueError(f"rollout_rs_threshold for {option} must be > 0, got {text!r}.")
    return value


def parse_rs_thresholds(options: list[str], spec: Any) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs_threshold`` for each criterion, as ``{option: (lower, upper)}``; lower is None but for k1.

    ``spec`` is one threshold shared by every criterion, or one per criterion (comma separated). A k1 criterion
    takes ``lower_upper`` or one number C (the band ``1/C_C``); k2 and k3 take one upper bound.

    Raises:
        TypeError: neither a number nor a string.
        ValueError: missing, the wrong count, a form the criterion does not take, or a bound <= 0.
    """
    if spec is None:
        raise ValueError("rollout_rs_threshold must be set when rollout_rs is: one threshold per criterion.")
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise TypeError(f"rollout_rs_threshold must be a number or a string, got {spec!r}.")
    texts = [str(spec)] if not isinstance(spec, str) else [part.strip() for part in spec.split(",") if part.strip()]
    if len(texts) not in (1, len(options)):
        raise ValueError(
            f"rollout_rs_threshold={spec!r} gives {len(texts)} thresholds for {len(options)} rollout_rs criteria "
            f"{options}; give one shared threshold or one per criterion."
        )
    texts = texts * len(options) if len(texts) == 1 else texts
    thresholds: dict[str, tuple[float | None, float]] = {}
    for option, text in zip(options, texts, strict=True):
        if option.endswith("k1"):
            if "_" in text:
                lower_text, upper_text = text.split("_", 1)
                lower, upper = _positive(lower_text, option), _positive(upper_text, option)
            else:
                upper = _positive(text, option)
                lower = 1.0 / upper
            if lower > upper:
                raise ValueError(f"rollout_rs_threshold {text!r} for {option}: lower must not exceed upper.")
            thresholds[option] = (lower, upper)
        else:
            if "_" in text:
                raise ValueError(
                    f"rollout_rs_threshold {text!r} for {option}: a divergence criterion takes one upper bound, not "
                    "a 'lower_upper' pair."
                )
            thresholds[option] = (None, _positive(text, option))
    return thresholds


def k1_log_bounds(lower: float, upper: float) -> tuple[float, float]:
    """A k1 band on mu / pi as bounds on -log r (what the criterion compares)."""
    return math.log(lower), math.log(upper)
