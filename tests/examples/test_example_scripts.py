"""The example launch scripts and the GSM8K preprocessing script, checked without training.

Each ``examples/**/run_*.sh`` is parsed the way bash would expand it (line continuations joined, environment
variables replaced by dummy values, quotes removed), its ``key=value`` overrides are composed with Hydra on the
config the script names, and the result goes through the trainer's start-up validation. Every script takes its
interpreter from ``examples/python_env.sh`` (``$VERL_PYTHON``, else the project's ``.venv``, else ``python3``), which
runs here on copies in temporary trees. The preprocessing script runs on a tiny GSM8K-format fixture written by the
test.
"""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from examples.data_preprocess import gsm8k
from verl.utils.dataset import RLHFDataset
from verl.utils.reward_score import default_compute_score
from verl.workers.config import compose_with_defaults

REPO = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO / "verl" / "trainer" / "config"
SCRIPTS = sorted((REPO / "examples").glob("*/run_*.sh"))
GPU_SCRIPTS = {"run_qwen2_5_0_5b_fp16_megatron.sh", "run_qwen2_5_1_5b_fp16_dp.sh"}
DUMMY_ENV = {"MODEL_PATH": "/dummy/model", "DATA_DIR": "/dummy/data"}
ENTRY = 'exec "$PYTHON" -m verl.trainer.main_ppo'
PYTHON_ENV = REPO / "examples" / "python_env.sh"
SOURCE_PYTHON_ENV = 'source "$(dirname "$0")/../python_env.sh"'
_VAR = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)")


def expand(text: str) -> str:
    """Replace ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` (dummy value, else the default); keep ``$@``."""

    def repl(match: re.Match) -> str:
        name = match.group(1) or match.group(3)
        if name in DUMMY_ENV:
            return DUMMY_ENV[name]
        if match.group(2) is not None:
            return match.group(2)
        raise AssertionError(f"no dummy value for ${name}; add it to DUMMY_ENV")

    return _VAR.sub(repl, text)


def parse_script(path: Path) -> tuple[str, list[str]]:
    """(config name, overrides) of the script's ``exec "$PYTHON" -m verl.trainer.main_ppo`` command."""
    logical_lines = path.read_text().replace("\\\n", " ").splitlines()
    commands = [line.strip() for line in logical_lines if ENTRY in line]
    assert len(commands) == 1, f"{path.name}: expected one '{ENTRY}' command, found {len(commands)}"
    assert commands[0].startswith(ENTRY), f"{path.name}: the command must start with '{ENTRY}'"
    tokens = shlex.split(expand(commands[0][len(ENTRY) :].replace('"$@"', "")))
    assert commands[0].rstrip().endswith('"$@"'), f'{path.name}: the command must end with "$@" (user overrides)'
    config_name = "ppo_trainer"
    if tokens[:1] == ["--config-name"]:
        config_name, tokens = tokens[1], tokens[2:]
    bad = [t for t in tokens if not re.fullmatch(r"[\w.]+=.*", t)]
    assert not bad, f"{path.name}: tokens that are not key=value overrides: {bad}"
    return config_name, tokens


def compose_script(path: Path):
    config_name, overrides = parse_script(path)
    return compose_with_defaults(overrides, config_name, CONFIG_DIR), overrides


def test_all_scripts_are_found():
    names = {f"{p.parent.name}/{p.name}" for p in SCRIPTS}
    assert names == {
        "dapo_trainer/run_tiny_fp16_dp.sh",
        "grpo_trainer/run_tiny_fp16_dp.sh",
        "grpo_trainer/run_tiny_fp16_megatron.sh",
        "grpo_trainer/run_qwen2_5_0_5b_fp16_megatron.sh",
        "grpo_trainer/run_qwen2_5_1_5b_fp16_dp.sh",
        "ppo_trainer/run_tiny_fp16_dp.sh",
        "ppo_trainer/run_tiny_fp16_megatron.sh",
    }


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_composes_and_validates(path):
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, f"{path.name}: bash syntax error"
    composed, overrides = compose_script(path)
    cfg = composed.config
    # the policy is chosen on purpose in every script, never left to the default
    assert any(o.startswith("actor_rollout_ref.actor.update_failure_policy=") for o in overrides)
    composed.validate()  # as the command line: against the file's defaults, so settings nothing reads are refused
    actor = cfg.actor_rollout_ref.actor
    assert actor.dtype == "float16"
    assert actor.strategy == ("megatron" if "megatron" in path.name else "dp")
    expected_estimator = "gae" if path.parent.name == "ppo_trainer" else "grpo"
    assert cfg.algorithm.adv_estimator == expected_estimator
    if expected_estimator == "gae":
        assert cfg.critic.enable is True
        assert any(o.startswith("critic.update_failure_policy=") for o in overrides)
    if path.parent.name == "dapo_trainer":  # DAPO's pieces, each set on purpose
        assert cfg.algorithm.filter_groups.enable and cfg.reward_model.overlong_buffer.enable
        assert cfg.reward_model.reward_manager == "dapo" and actor.loss_agg_mode == "token-mean"
        assert actor.clip_ratio_high > actor.clip_ratio_low


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_script_runs_the_interpreter_the_shared_helper_chooses(path):
    lines = path.read_text().splitlines()
    # the helper is sourced right after `set -euo pipefail`, before anything runs Python
    assert lines[lines.index("set -euo pipefail") + 1] == SOURCE_PYTHON_ENV
    code = [line for line in lines if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"\bpython3?\b", line) and "-m verl" in line and ENTRY not in line]


def python_chosen(root: Path, env: dict[str, str]) -> str:
    """``$PYTHON`` after a script in ``root/examples/<dir>/`` sourced a copy of the helper, as the scripts do."""
    (root / "examples" / "grpo_trainer").mkdir(parents=True, exist_ok=True)
    (root / "examples" / "python_env.sh").write_text(PYTHON_ENV.read_text())
    script = root / "examples" / "grpo_trainer" / "run_x.sh"
    script.write_text(f'set -euo pipefail\n{SOURCE_PYTHON_ENV}\necho "$PYTHON"\n')
    proc = subprocess.run(["bash", str(script)], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_helper_takes_verl_python_else_the_projects_venv_else_python3(tmp_path):
    # no .venv in a clone nobody set up: python3 from PATH (an environment the user activated)
    assert python_chosen(tmp_path, {}) == "python3"
    # README's first command created .venv: the examples use it without activating anything
    venv_python = tmp_path / ".venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text("#!/bin/sh\n")
    venv_python.chmod(0o755)
    assert python_chosen(tmp_path, {}) == str(venv_python)
    # a user's own choice wins over both
    assert python_chosen(tmp_path, {"VERL_PYTHON": "/opt/conda/envs/verl/bin/python"}) == (
        "/opt/conda/envs/verl/bin/python"
    )


@pytest.mark.parametrize("name", sorted(GPU_SCRIPTS))
def test_gpu_scripts_take_model_data_and_gpus_from_the_environment(name):
    path = REPO / "examples" / "grpo_trainer" / name
    text = path.read_text()
    assert 'trainer.n_gpus_per_node="${N_GPUS:-8}"' in text
    cfg = compose_script(path)[0].config
    assert cfg.trainer.device == "cuda"
    assert cfg.trainer.n_gpus_per_node == 8
    assert cfg.actor_rollout_ref.model.path == "/dummy/model"
    assert cfg.data.train_files == "/dummy/data/train.parquet"
    assert cfg.data.val_files == "/dummy/data/test.parquet"


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.name not in GPU_SCRIPTS], ids=lambda p: p.name)
def test_tiny_scripts_run_on_cpu_with_the_embedded_model(path):
    cfg = compose_script(path)[0].config
    assert cfg.trainer.device == "cpu"
    assert cfg.actor_rollout_ref.model.path == "default"
    assert cfg.data.train_files is None


GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
    {"question": " A farm sells 1,000 eggs a day. How many in 2 days? ", "answer": "1000*2=2000\n#### 2,000"},
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_jsonl_becomes_the_training_format(tmp_path):
    source = write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    written = gsm8k.convert_file(source, tmp_path / "out", "train")
    assert written == tmp_path / "out" / "train.parquet"
    frame = pd.read_parquet(written)
    # verl's layout: a chat prompt, the answer under reward_model, extra_info
    assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    # "#### 2,000" -> "2000": the scorer compares numbers with the thousands separators removed
    assert [r["ground_truth"] for r in frame["reward_model"]] == ["7", "2000"]
    assert set(frame["data_source"]) == {"openai/gsm8k"}
    question = f"A farm sells 1,000 eggs a day. How many in 2 days? {gsm8k.INSTRUCTION}"
    assert list(frame["prompt"][1]) == [{"role": "user", "content": question}]
    # the trainer's dataset reads the file, and the built-in scorer for its data_source accepts a right answer
    dataset = RLHFDataset(written, render_chat=lambda messages: messages[-1]["content"])
    assert dataset[1]["ground_truth"] == "2000" and dataset[1]["raw_prompt"] == question
    assert dataset[1]["extra_info"]["index"] == 1
    assert default_compute_score(dataset[1]["data_source"], "2 * 1000 = 2000\n#### 2000", "2000") == 1.0


def test_gsm8k_parquet_input_through_the_cli(tmp_path):
    source = tmp_path / "test_in.parquet"
    pd.DataFrame(GSM8K_ROWS).to_parquet(source)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "data_preprocess" / "gsm8k.py"),
            "--input",
            str(source),
            "--output_dir",
            str(tmp_path / "out"),
            "--split",
            "test",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 rows" in proc.stdout
    rewards = pd.read_parquet(tmp_path / "out" / "test.parquet")["reward_model"]
    assert [r["ground_truth"] for r in rewards] == ["7", "2000"]


@pytest.mark.parametrize(
    ("rows", "split", "expected"),
    [
        ([{"question": "q", "answer": "the answer is 7"}], "train", "does not end with '#### <number>'"),
        ([{"question": "q"}], "train", "field 'answer' must be a string"),
        ([{"prompt": "q", "answer": "#### 1"}], "train", "field 'question' must be a string"),
        ([], "train", "has no rows"),
        (GSM8K_ROWS, "dev", "--split 'dev' is not supported"),
    ],
)
def test_gsm8k_bad_input_is_a_clear_error(tmp_path, rows, split, expected):
    source = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=re.escape(expected)):
        gsm8k.convert_file(source, tmp_path / "out", split)


def test_gsm8k_cli_reports_errors_with_exit_code_2(tmp_path, capsys):
    assert gsm8k.main(["--input", str(tmp_path / "missing.jsonl"), "--output_dir", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
