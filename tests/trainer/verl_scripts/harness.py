"""verl's own example scripts, started here: their stored command lines, normalised, and checked as main_ppo does.

Two sets (:data:`SCRIPT_SETS`), each a JSON file next to this module written by
``scripts/verl_compat/extract_script_overrides.py``: ``january`` (``scripts.json``, verl b178a3c's GRPO/PPO examples)
and ``current`` (``scripts_1dda039.json``, every PPO-family example of verl's current release and its experimental
async trainers' scripts). Each holds each script's trainer command line as bash expands it, and the entry point it
runs (``verl.trainer.main_ppo`` or one of verl's experimental async trainers, :data:`ENTRY_POINT_CONFIGS`).

:func:`normalise` changes only what a user on this machine must change: the model path (the embedded tiny model,
:func:`write_model`; a LoRA adapter of it where a script starts from one, :func:`write_adapter`; its megatron-core
distributed checkpoint where a script starts from one, :func:`write_dist_checkpoint`), the data files (small parquet
files in verl's layout, written from the embedded task by :func:`write_data_files`), the hardware sizes (one
node, one device, every model-parallel size 1) and a ``uv run`` prefix of the workers' Python (verl's uv project is
not here). :func:`start_up_check` then runs what ``python -m <entry point>``
checks before Ray starts: ``prepare(parse_command_line(argv, CONFIG_DIR, <the entry point's config>))``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from verl.trainer.smoke_test import LORA_RANK_KEYS, MAX_LORA_RANK, ONE_RANK_SIZES, TINY_MODEL_OVERRIDES

SCRIPTS_JSON = Path(__file__).with_name("scripts.json")
CURRENT_SCRIPTS_JSON = Path(__file__).with_name("scripts_1dda039.json")
SCRIPT_SETS = {"january": SCRIPTS_JSON, "current": CURRENT_SCRIPTS_JSON}
# The entry points of the stored scripts -> the config each composes when the script names none (each module's own).
ENTRY_POINT_CONFIGS = {
    "verl.trainer.main_ppo": "ppo_trainer",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_trainer",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_trainer",
}
TINY_MODEL = Path(__file__).resolve().parents[3] / "verl" / "models" / "tiny"
# The scripts' model, on this machine: the embedded tiny model with its 64 hidden units read as 2 attention heads of
# 32 (1 key-value head) instead of 4 of 16, and a context as long as the longest script's prompt + response: the
# tiny model of the CPU smoke test (verl.trainer.smoke_test). The weights are the tiny model's own (every projection
# keeps its shape); only config.json differs. vLLM's CPU attention rejects head size 16 and longer sequences than
# max_position_embeddings, and 46 of the 74 scripts use vLLM.
_MODEL_CONFIG_CHANGES = TINY_MODEL_OVERRIDES
# Enough prompts for the largest data.train_batch_size the scripts set (4096), so that a step fits in an epoch.
NUM_TRAIN_ROWS, NUM_VAL_ROWS = 4096, 64
N_GPUS_PER_NODE = 1
# Keys whose value is a model directory (the last part of the key path).
_MODEL_PATH_KEYS = (
    "actor_rollout_ref.model.path",
    "critic.model.path",
    "reward_model.model.path",
    "reward.reward_model.model_path",  # verl's current reward section
)
# A LoRA adapter to start from is part of the model a user brings: the scripts' adapter is one for the scripts' model.
_ADAPTER_PATH_KEY = "actor_rollout_ref.model.lora_adapter_path"
# The megatron form of a model a script starts from (use_dist_checkpointing): the last part of the key.
_DIST_CHECKPOINT_KEY = "dist_checkpointing_path"
_DATA_FILE_KEYS = {"data.train_files": "train", "data.val_files": "test"}
# Hardware sizes: the last part of the key -> the value on this machine (the smoke test's one rank).
_PARALLEL_SIZES = ONE_RANK_SIZES
_HARDWARE = {"trainer.nnodes": "1", "trainer.n_gpus_per_node": str(N_GPUS_PER_NODE)}
# The device a script names (verl's Ascend scripts: npu): replaced by the device each check runs for.
_DEVICE_KEY = "trainer.device"
# The per-GPU token budgets each role's sequence-parallel size divides (the old-log-prob pass runs in the actor).
_TOKEN_BUDGETS_OF_ROLE = {
    "actor_rollout_ref.actor": (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    ),
    "actor_rollout_ref.ref": ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",),
    "critic": ("critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"),
}
# A file of verl's repository where the extraction ran the script (its reward function, say).
_VERL_REPO_FILE = re.compile(r"/verl_scripts_[^/]+/repo/")
# The separate rollout group of verl's async trainers (set by their scripts only): one node of one device too.
_ROLLOUT_GROUP = {"rollout.nnodes": "1", "rollout.n_gpus_per_node": str(N_GPUS_PER_NODE)}
# The out-of-scope features a refusal may name (a regex each): January's, and the one wording of every refusal of
# verl/workers/config/out_of_scope.py (verl's current release's features this project leaves out).
OUT_OF_SCOPE = {
    "SGLang": r"SGLang",
    "TensorRT-LLM": r"TensorRT-LLM",
    "NPU profilers": r"Ascend NPU",
    "multimodal": r"multimodal|vision",
    "sandbox services": r"sandbox",
    # verl's PRIME reward manager (its sandbox script's; docs/start/from_verl.md: not available here)
    "the prime reward manager": r"reward_manager(\.name)?='prime' is not supported",
}
CURRENT_OUT_OF_SCOPE = {**OUT_OF_SCOPE, "verl 1dda039's features left out here": r"which is out of scope here"}
# What this machine lacks: a CUDA-only path (trainer.device=cpu) is refused at start-up.
NEEDS_CUDA = r"needs CUDA|\(CUDA only\)"
# The metric sinks: one whose package is not installed here (W&B) is dropped (installed_sinks).
_LOGGER_KEY = "trainer.logger"
# The Python the workers start with: verl's scripts give a ``uv run`` prefix for verl's own uv project and its
# extras, which a user of this package (installed in the Python that runs the trainer) sets to null.
_PY_EXECUTABLE_KEY = "ray_kwargs.ray_init.runtime_env.py_executable"
# A LoRA rank must fit the model: the scripts' model's narrowest projection (k_proj, 64 -> 32) takes rank 32 at most
# (MAX_LORA_RANK), where the scripts' 7B models take their rank 64; LORA_RANK_KEYS: verl's dp/fsdp and megatron forms.
_LORA_RANK_KEYS = LORA_RANK_KEYS


@dataclass(frozen=True)
class Script:
    """One of verl's example scripts: its ``main_ppo`` command line as bash expanded it."""

    name: str
    config_path: str | None
    config_name: str | None
    overrides: tuple[str, ...]
    entry_point: str = "verl.trainer.main_ppo"

    @property
    def default_config_name(self) -> str:
        """The config the entry point composes when the command line names none."""
        return ENTRY_POINT_CONFIGS[self.entry_point]

    def argv(self, overrides: tuple[str, ...] | None = None) -> list[str]:
        """The command line after ``python -m <entry point>`` (with ``overrides`` instead, if given)."""
        head = []
        if self.config_path is not None:
            head.append(f"--config-path={self.config_path}")
        if self.config_name is not None:
            head.append(f"--config-name={self.config_name}")
        return head + list(self.overrides if overrides is None else overrides)


def load_scripts(path: Path = SCRIPTS_JSON) -> list[Script]:
    """The stored scripts this package's trainers run, in the order of the file (January's name no entry point:
    each runs ``verl.trainer.main_ppo``)."""
    payload = json.loads(path.read_text())
    return [
        Script(
            r["script"],
            r["config_path"],
            r["config_name"],
            tuple(r["overrides"]),
            r.get("entry_point", "verl.trainer.main_ppo"),
        )
        for r in payload["scripts"]
    ]


def load_broken_in_verl(path: Path) -> dict[str, str]:
    """The stored scripts that cannot start in verl itself either (the extraction composed each with verl's own
    config files and looked for the files it names: ``broken_in_verl``): {script: why}."""
    return {
        r["script"]: r["broken_in_verl"] for r in json.loads(path.read_text())["scripts"] if r.get("broken_in_verl")
    }


def load_not_ours(path: Path) -> dict[str, str]:
    """The stored scripts left out of the check: {script: why} (another trainer's, or stopped before its call)."""
    return {r["script"]: r["reason"] for r in json.loads(path.read_text()).get("not_ours", [])}


def write_data_files(directory: Path) -> dict[str, str]:
    """Small train/test parquet files in verl's layout (chat ``prompt``, ``reward_model.ground_truth``,
    ``data_source``, ``extra_info``) holding the embedded task, written by the command a user runs
    (``python -m verl.utils.dataset.make_tiny_data``); {"train": path, "test": path}."""
    from verl.utils.dataset.make_tiny_data import write_tiny_data

    return write_tiny_data(directory, NUM_TRAIN_ROWS, NUM_VAL_ROWS, seed=0, overwrite=False)


def write_model(directory: Path) -> str:
    """The scripts' model (see ``_MODEL_CONFIG_CHANGES``) under ``directory``; its path."""
    import shutil

    target = directory / "tiny_h32"
    if not target.exists():
        shutil.copytree(TINY_MODEL, target)
        config = json.loads((TINY_MODEL / "config.json").read_text())
        config.update(_MODEL_CONFIG_CHANGES)
        (target / "config.json").write_text(json.dumps(config, indent=2))
    return str(target)


def write_adapter(directory: Path, model_path: str) -> str:
    """A rank-8 peft LoRA adapter (fresh, B = 0) of the scripts' model under ``directory``; its path."""
    target = directory / "tiny_h32_lora_adapter"
    if not target.exists():
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_path)
        config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
        get_peft_model(model, config).save_pretrained(target)
    return str(target)


def write_dist_checkpoint(directory: Path, model_path: str) -> str:
    """The scripts' model as a megatron-core distributed checkpoint under ``directory``, written by the converter a
    user runs (``python -m verl.models.mcore.dist_checkpoint``, in its own process); its path."""
    import subprocess
    import sys

    target = directory / "tiny_h32_mcore"
    if not (target / "metadata.json").exists():
        command = [sys.executable, "-m", "verl.models.mcore.dist_checkpoint", "--hf_model_path", model_path]
        subprocess.run([*command, "--output_path", str(target), "--dtype", "float32"], check=True)
    return str(target)


def write_reward_function(directory: Path) -> str:
    """A reward function file standing in for one a script names inside verl's repository (its own task's scorer,
    which a user running verl's script from verl's checkout has): ``compute_score`` gives partial credit on the
    embedded task, as the default reward does; its path."""
    target = directory / "reward_function.py"
    if not target.exists():
        target.write_text(
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
            "    answer = solution_str.strip()\n"
            "    return sum(a == b for a, b in zip(answer, ground_truth)) / max(len(ground_truth), 1)\n"
        )
    return str(target)


def write_inputs(directory: Path) -> dict[str, str]:
    """The model (a LoRA adapter of it, its megatron-core checkpoint), the data files and a reward function of the
    scripts on this machine: {"model": path, "adapter": path, "dist_checkpoint": path, "train": path, "test": path,
    "reward_function": path}."""
    model = write_model(directory)
    return {
        "model": model,
        "adapter": write_adapter(directory, model),
        "dist_checkpoint": write_dist_checkpoint(directory, model),
        "reward_function": write_reward_function(directory),
        **write_data_files(directory),
    }


def _num_files(value: str) -> int:
    """How many files a ``data.*_files`` value names: a Hydra list ``[a, b]`` or one path."""
    value = value.strip()
    if not value.startswith("["):
        return 1
    inner = value.strip("[]").strip()
    return len([part for part in re.split(r",", inner) if part.strip()]) or 1


def _sequence_parallel_sizes(overrides: tuple[str, ...]) -> dict[str, int]:
    """{role section: the Ulysses sequence-parallel size the script gives it} (``actor_rollout_ref.actor``,
    ``actor_rollout_ref.ref``, ``critic``; set on the section or in its ``fsdp_config``)."""
    sizes = {}
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.endswith(".ulysses_sequence_parallel_size") and value.isdigit():
            role = next((r for r in _TOKEN_BUDGETS_OF_ROLE if key.startswith(r + ".")), None)
            if role is not None:
                sizes[role] = int(value)
    return sizes


def _budget_without_sequence_parallelism(key: str, value: str, sp_sizes: dict[str, int]) -> str:
    """A per-GPU token budget for one device without sequence parallelism: verl splits each sample over the role's
    ``ulysses_sequence_parallel_size`` GPUs (a budget of B per GPU holds samples of B x SP tokens), so on one GPU the
    same samples take B x SP; any other key's value unchanged."""
    for role, budgets in _TOKEN_BUDGETS_OF_ROLE.items():
        if key in budgets and value.isdigit():
            return str(int(value) * sp_sizes.get(role, 1))
    return value


def installed_sinks(value: str) -> str:
    """A ``trainer.logger`` value without the sinks whose package this machine lacks (verl's scripts log to W&B,
    which a user without wandb removes: start-up refuses it, naming the package); the console when none is left."""
    from verl.utils.tracking import missing_sink_packages

    names = [name.strip().strip("'\"") for name in value.strip().strip("'\"").strip("[]").split(",") if name.strip()]
    missing = missing_sink_packages(names)
    return "[" + ",".join([name for name in names if name not in missing] or ["console"]) + "]"


def _default_logger() -> str:
    """ppo_trainer.yaml's ``trainer.logger``, as :func:`installed_sinks` writes a value."""
    from omegaconf import OmegaConf

    from verl.workers.config.composition import CONFIG_DIR

    return "[" + ",".join(OmegaConf.load(CONFIG_DIR / "ppo_trainer.yaml").trainer.logger) + "]"


def normalise(overrides: tuple[str, ...], inputs: dict[str, str]) -> tuple[str, ...]:
    """The overrides with only the model path, the data files and the hardware sizes changed for this machine
    (``inputs``: :func:`write_inputs`; the per-GPU token budgets of a role whose samples verl splits by sequence
    parallelism scaled to one GPU), a reward function file of verl's repository replaced by a stand-in, a LoRA
    rank cut to what the model's layers take (``MAX_LORA_RANK``), a ``uv run`` prefix of the workers' Python
    dropped (:data:`_PY_EXECUTABLE_KEY`) and a metric sink whose package is not installed (W&B) dropped
    (:func:`installed_sinks`)."""
    sp_sizes = _sequence_parallel_sizes(overrides)
    out, seen = [], set()
    for override in overrides:
        key, eq, value = override.partition("=")
        bare = key.lstrip("+~")
        last = bare.rsplit(".", 1)[-1]
        if eq and bare == _DEVICE_KEY:
            continue  # the kind of device is hardware too: the check sets it (start_up_outcomes), npu included
        if eq and bare in _MODEL_PATH_KEYS:
            value = inputs["model"]
        elif eq and bare == _ADAPTER_PATH_KEY and value not in ("null", "None", ""):
            value = inputs["adapter"]
        elif eq and last == _DIST_CHECKPOINT_KEY and value not in ("null", "None", ""):
            value = inputs["dist_checkpoint"]
        elif eq and bare in _DATA_FILE_KEYS:
            path = inputs[_DATA_FILE_KEYS[bare]]
            count = _num_files(value)
            value = path if count == 1 and not value.strip().startswith("[") else "[" + ",".join([path] * count) + "]"
        elif eq and bare in _HARDWARE:
            value = _HARDWARE[bare]
        elif eq and bare in _ROLLOUT_GROUP:
            value = _ROLLOUT_GROUP[bare]
        elif eq and last in _PARALLEL_SIZES:
            value = _PARALLEL_SIZES[last]
        elif eq and bare in _LORA_RANK_KEYS and value.isdigit():
            value = str(min(int(value), MAX_LORA_RANK))
        elif eq and bare == _PY_EXECUTABLE_KEY and value.strip("'\"").startswith("uv "):
            value = "null"
        elif eq and bare == _LOGGER_KEY:
            value = installed_sinks(value)
        elif eq and bare.endswith("custom_reward_function.path") and _VERL_REPO_FILE.search(value):
            value = inputs["reward_function"]
        else:
            value = _budget_without_sequence_parallelism(bare, value, sp_sizes)
        seen.add(bare)
        out.append(f"{key}{eq}{value}" if eq else override)
    out += [f"{key}={value}" for key, value in _HARDWARE.items() if key not in seen]
    if _LOGGER_KEY not in seen:  # the config's default (verl's [console, wandb]) where it names a missing package
        default = _default_logger()
        if installed_sinks(default) != default:
            out.append(f"{_LOGGER_KEY}={installed_sinks(default)}")
    return tuple(out)


def start_up_outcomes(script: Script, inputs: dict[str, str], devices: tuple[str, ...]) -> dict[str, str | None]:
    """:func:`start_up_check` with ``trainer.device`` set to each of ``devices``, the command line composed once
    (the part of the check that costs most): {device: None when the script starts there, else the refusal}.

    Raises:
        Exception: anything but a refusal (``ValueError``) the start-up raised (a bug to report).
    """
    from omegaconf import OmegaConf

    from verl.trainer.main_ppo import CONFIG_DIR, parse_command_line, prepare
    from verl.workers.config.loading import ComposedConfig

    try:
        argv = script.argv(normalise(script.overrides, inputs))
        composed = parse_command_line(argv, CONFIG_DIR, script.default_config_name)
    except ValueError as err:
        return dict.fromkeys(devices, str(err))
    outcomes: dict[str, str | None] = {}
    for device in devices:
        config = composed.config.copy()
        OmegaConf.update(config, "trainer.device", device)  # what the override trainer.device=<device> sets
        try:
            prepare(ComposedConfig(config=config, defaults=composed.defaults))
            outcomes[device] = None
        except ValueError as err:
            outcomes[device] = str(err)
    return outcomes


def start_up_check(script: Script, inputs: dict[str, str], extra: tuple[str, ...] = ()) -> None:
    """What ``python -m verl.trainer.main_ppo`` checks before Ray starts, for the normalised script.

    Raises:
        ValueError: the config is refused (the message says why).
        Exception: anything else the start-up raised (a bug to report).
    """
    from verl.trainer.main_ppo import CONFIG_DIR, parse_command_line, prepare

    argv = script.argv(normalise(script.overrides, inputs) + tuple(extra))
    prepare(parse_command_line(argv, CONFIG_DIR, script.default_config_name))
