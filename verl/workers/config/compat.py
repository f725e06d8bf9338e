"""Sections that exist so that verl's own scripts start here: verl's keys with verl's meaning, or refused by name.

verl's scripts set profiler switches, a custom dataset class, PF-PPO and the like. Each such section is typed here;
its off value (verl's default) is always accepted, and a value that asks for a feature this project does not have
(a profiler, a custom dataset class, images) is refused at start-up with the feature's name and the reason, never
as an unknown key. ``docs/start/from_verl.md`` lists them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal

from verl.workers.config.schema import BaseConfig, FieldError, check_int, check_number

# verl's profiler tools built here (verl.utils.profiler), and the one that is not.
PROFILER_TOOLS = ("torch", "nsys", "torch_memory")
NPU_REASON = "Ascend NPU profiling (NPU hardware is out of scope here)"
ULYSSES_REASON = (
    "Ulysses sequence parallelism (one sequence split over several ranks) is not implemented here; every rank "
    "holds whole sequences"
)


def _check_tool(section: Any) -> None:
    if section.tool == "npu":
        raise FieldError("tool", f"='npu' asks for {NPU_REASON}. Use torch or nsys.")
    if section.tool is not None and section.tool not in PROFILER_TOOLS:
        raise FieldError(
            "tool", f"={section.tool!r} is not a profiler here; take one of {list(PROFILER_TOOLS)} or null."
        )


@dataclasses.dataclass(frozen=True)
class ProfilerConfig(BaseConfig):
    """A role's ``profiler`` section (verl's ``ProfilerConfig``), read by :class:`verl.utils.profiler.RoleProfiler`.

    ``tool`` null takes ``global_profiler.tool``; ``tool_config`` holds verl's per-tool settings (``nsys``,
    ``torch``, ``torch_memory``; ``npu`` is read by nothing here).
    """

    tool: str | None
    enable: bool
    all_ranks: bool
    ranks: list[int]
    save_path: str | None
    tool_config: Any

    def check(self) -> None:
        _check_tool(self)
        for rank in self.ranks or ():
            if not isinstance(rank, int) or rank < 0:
                raise FieldError("ranks", f"={list(self.ranks)!r} must list ranks (integers >= 0).")


@dataclasses.dataclass(frozen=True)
class GlobalProfilerConfig(BaseConfig):
    """``global_profiler``: the tool and the (1-based) steps the driver profiles (:mod:`verl.utils.profiler`)."""

    KEY: ClassVar[str] = "global_profiler"

    tool: str | None
    steps: list[int] | None
    profile_continuous_steps: bool
    save_path: str
    global_tool_config: Any

    def check(self) -> None:
        _check_tool(self)
        if self.tool is None:
            return
        if not self.steps or not all(isinstance(step, int) and step >= 1 for step in self.steps):
            raise FieldError("steps", f"={self.steps!r}: list the training steps to profile (1-based), e.g. [1, 2, 5].")


@dataclasses.dataclass(frozen=True)
class CustomClsConfig(BaseConfig):
    """``data.custom_cls``: verl's own dataset class from a file. ``path: null`` (the built-in dataset) only."""

    path: str | None
    name: str | None

    def check(self) -> None:
        if self.path is not None:
            raise FieldError(
                "path",
                f"={self.path!r} asks for a custom dataset class: subclasses of verl's RLHFDataset (its "
                "processor/multimodal API) cannot run here, where rows are prompt, ground truth and data_source. "
                "Convert the data to parquet/JSONL in that layout and set data.custom_cls.path=null.",
            )


@dataclasses.dataclass(frozen=True)
class PFPPOConfig(BaseConfig):
    """``algorithm.pf_ppo``: how PF-PPO (``algorithm.use_pf_ppo``) weights each sample by its score.

    Attributes:
        reweight_method: pow (weight |score| ** weight_pow) | max_min (only the samples with the batch's highest
            or lowest score) | max_random (the highest-scored samples weigh 0.4, the others 0.1).
        weight_pow: the exponent of ``pow``.
    """

    reweight_method: Literal["pow", "max_min", "max_random"]
    weight_pow: float

    def check(self) -> None:
        check_number(self, "weight_pow", 0.0)


def check_ulysses(obj: Any, field: str = "ulysses_sequence_parallel_size") -> None:
    """``ulysses_sequence_parallel_size``: 1 (verl's default, no sequence parallelism) only."""
    check_int(obj, field, 1)
    if getattr(obj, field) != 1:
        raise FieldError(field, f"={getattr(obj, field)} asks for {ULYSSES_REASON}. Set it to 1.")


def check_ref_strategy(actor_strategy: str, ref_strategy: str) -> None:
    """``actor_rollout_ref.ref.strategy``: the reference runs in the actor's worker, on the actor's backend, so
    its strategy must be the actor's (fsdp and fsdp2 are one backend)."""
    same = {"fsdp": "fsdp2"}
    if same.get(ref_strategy, ref_strategy) != same.get(actor_strategy, actor_strategy):
        raise ValueError(
            f"actor_rollout_ref.ref.strategy={ref_strategy} differs from actor_rollout_ref.actor.strategy="
            f"{actor_strategy}: the reference model lives in the actor's worker and runs on its backend. Leave "
            "ref.strategy at its default (the actor's) or set the same value."
        )


# Config keys whose value is an open mapping handed on to another library (megatron-core's dataclasses, vllm.LLM, a
# Hugging Face config, a chat template): verl's scripts add entries with "+key=value", and a plain "key=value" for
# an entry the YAML does not list is turned into Hydra's "++key=value" (add or replace) by open_mapping_override, so
# that both spellings work. The entries are checked where they are read (megatron.check_passthrough_keys, the
# vLLM engine's argument check, the model path check).
OPEN_MAPPINGS = (
    ("override_transformer_config",),
    ("override_ddp_config",),
    ("override_optimizer_config",),
    ("override_config",),
    ("engine_kwargs", "vllm"),
    ("apply_chat_template_kwargs",),
)


def open_mapping_override(override: str) -> str:
    """A command-line override, with ``++`` put before a plain ``key=value`` whose key lies inside one of
    :data:`OPEN_MAPPINGS` (``actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=4096``): Hydra adds such an
    entry only when asked to, and the YAML's mapping cannot list every key of the library it feeds. Any other
    override (a prefixed one, a group choice, a key outside those mappings) is returned as it is."""
    if override[:1] in "+~" or "=" not in override:
        return override
    key = override.split("=", 1)[0]
    if "@" in key or "/" in key:
        return override
    parts = key.split(".")
    for mapping in OPEN_MAPPINGS:
        width = len(mapping)
        # an entry inside the mapping: the mapping's name, then at least one key below it
        if any(tuple(parts[i : i + width]) == mapping for i in range(len(parts) - width)):
            return "++" + override
    return override
