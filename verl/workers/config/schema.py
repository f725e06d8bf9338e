"""The typed config's machinery, by its import path of the config layer: it lives in :mod:`verl.utils.config_schema`,
a layer below, so that the config classes ``verl.utils`` holds itself (the profiler's, which verl's user code
imports as ``verl.utils.profiler.ProfilerConfig``) are built by the same one base class and builder."""

from verl.utils.config_schema import (
    RENAMED_KEYS,
    UNSUPPORTED_VERL_KEYS,
    BaseConfig,
    FieldError,
    build_config,
    check_int,
    check_int_list,
    check_number,
    check_one_of,
    did_you_mean,
    full_key,
    is_int,
    is_number,
    join_key,
    known_key_message,
    nearest_keys,
    refuse_unavailable,
)

__all__ = [
    "RENAMED_KEYS",
    "UNSUPPORTED_VERL_KEYS",
    "BaseConfig",
    "FieldError",
    "build_config",
    "check_int",
    "check_int_list",
    "check_number",
    "check_one_of",
    "did_you_mean",
    "full_key",
    "is_int",
    "is_number",
    "join_key",
    "known_key_message",
    "nearest_keys",
    "refuse_unavailable",
]
