"""verl's own example scripts start here, from their stored command lines (no fetching): the 74 GRPO/PPO scripts of
verl's January release b178a3c (issue 27) and every PPO-family script of its current release 1dda039 (issue 47).

Each script's command line (``tests/trainer/verl_scripts/scripts.json``, ``scripts_1dda039.json``) is normalised
(model path, data files, hardware sizes only) and checked as ``python -m <its entry point>`` checks it before Ray
starts, once with ``trainer.device=cpu`` (this machine) and once with ``cuda`` (what a GPU machine checks). January:
a script passes or is refused with a message naming a feature that is out of scope here; ``MIN_PASSING`` is the count
reached (every script that started before still starts). Current release: the scripts refused by an out-of-scope
feature's name are out of scope, and those verl's own config cannot compose (or that name a file verl lacks) are
counted apart; of the others at least ``MIN_PASSING_CURRENT`` and 90 % start (issue 47), and ``python -m
tests.trainer.verl_scripts.report --set current --all-blockers`` lists what stops the rest). The scripts the
extraction leaves out (another trainer's entry point) are listed in the data file with the reason.
"""

import importlib.util
import re
from pathlib import Path

import pytest

from tests.trainer.verl_scripts.harness import (
    CURRENT_OUT_OF_SCOPE,
    CURRENT_SCRIPTS_JSON,
    ENTRY_POINT_CONFIGS,
    NEEDS_CUDA,
    OUT_OF_SCOPE,
    SCRIPTS_JSON,
    load_broken_in_verl,
    load_not_ours,
    load_scripts,
    start_up_outcomes,
    write_inputs,
)

MIN_PASSING = 55
# On a GPU machine (trainer.device=cuda) the CUDA-only features start too: every refusal left is out of scope or the
# script's own text; this is all 74 less the 17 such scripts.
MIN_PASSING_ON_CUDA = 57
# verl's own text does not parse in Hydra (in verl too): a comment after a line continuation, a stray brace.
BROKEN_IN_VERL = {
    "run_deepseek7b_llm_pfppo.sh": r"LexerNoViableAltException",
    "run_qwen3_4b_grpo_vllm_1k_npu.sh": r"Error parsing override",
}
# Blockers other work owns: these may fail with any message until it lands.
PENDING: dict[str, str] = {}

# The counts reached (16:45 UTC, 7 December: 76 of the 117 start, on either device; 28 are refused by an
# out-of-scope feature's name and 8 cannot start in verl itself (``broken_in_verl``), so 76 of the 81 in scope,
# 94 %; issue 47 asks for 90 %, SHARE_CURRENT): raise them as work lands.
MIN_PASSING_CURRENT = 76
MIN_PASSING_CURRENT_ON_CUDA = 76
# issue 47's acceptance: of the current release's scripts in scope (neither refused by an out-of-scope feature's name
# nor broken in verl itself), at least this share start
SHARE_CURRENT = 0.9


def _outcomes(scripts, inputs):
    """{"cpu": {script: refusal or None}, "cuda": {...}}: each script composed once, checked for both devices."""
    results = {"cpu": {}, "cuda": {}}
    for script in scripts:
        for device, message in start_up_outcomes(script, inputs, ("cpu", "cuda")).items():
            results[device][script.name] = message
    return results


def _unexplained(outcomes, allowed):
    bad = {}
    for path, message in outcomes.items():
        name = path.rsplit("/", 1)[-1]
        if message is None or name in PENDING:
            continue
        if name in BROKEN_IN_VERL:
            if not re.search(BROKEN_IN_VERL[name], message):
                bad[path] = message
        elif not any(re.search(pattern, message) for pattern in allowed):
            bad[path] = message
    return bad


# One test per set for both devices: each script is composed once (Hydra's compose is most of the check's time), and
# a fixture shared by several tests would be built again on every pytest-xdist worker that runs one of them.
@pytest.mark.slow
def test_every_script_starts_or_is_refused_by_an_out_of_scope_feature_here_and_on_a_gpu_machine(tmp_path):
    outcomes = _outcomes(load_scripts(SCRIPTS_JSON), write_inputs(tmp_path))
    here, on_cuda = outcomes["cpu"], outcomes["cuda"]
    assert len(here) == len(on_cuda) == 74
    # here (trainer.device=cpu): a refusal names an out-of-scope feature, or a CUDA-only one
    assert _unexplained(here, [*OUT_OF_SCOPE.values(), NEEDS_CUDA]) == {}
    num_passing = sum(message is None for message in here.values())
    assert num_passing >= MIN_PASSING, {k: v for k, v in here.items() if v is not None}
    # on a GPU machine (trainer.device=cuda) only out-of-scope features are refused
    assert _unexplained(on_cuda, list(OUT_OF_SCOPE.values())) == {}
    num_passing = sum(message is None for message in on_cuda.values())
    assert num_passing >= MIN_PASSING_ON_CUDA, {k: v for k, v in on_cuda.items() if v is not None}


def _in_scope_failures(outcomes, allowed):
    """(number starting, {script: refusal} of those refused by no out-of-scope feature's name)."""
    failing = {k: v for k, v in outcomes.items() if v is not None and not any(re.search(p, v) for p in allowed)}
    return sum(message is None for message in outcomes.values()), failing


@pytest.mark.slow
def test_current_release_scripts_start_at_least_as_many_as_reached(tmp_path):
    scripts = load_scripts(CURRENT_SCRIPTS_JSON)
    outcomes = _outcomes(scripts, write_inputs(tmp_path))
    assert len(outcomes["cpu"]) == len(outcomes["cuda"]) == len(scripts)
    # the scripts verl's own config refuses (or that name a file verl lacks) cannot start in verl either: counted
    # apart, each refused here too
    broken = load_broken_in_verl(CURRENT_SCRIPTS_JSON)
    assert set(broken) <= set(outcomes["cpu"])
    for device, allowed, min_passing in (
        ("cpu", [*CURRENT_OUT_OF_SCOPE.values(), NEEDS_CUDA], MIN_PASSING_CURRENT),
        ("cuda", list(CURRENT_OUT_OF_SCOPE.values()), MIN_PASSING_CURRENT_ON_CUDA),
    ):
        considered = {name: message for name, message in outcomes[device].items() if name not in broken}
        num_passing, failing = _in_scope_failures(considered, allowed)
        # in scope: those that start plus those refused by no out-of-scope feature's name
        in_scope = num_passing + len(failing)
        assert num_passing >= min_passing, (device, f"{num_passing} of {in_scope} start", failing)
        assert num_passing >= SHARE_CURRENT * in_scope, (device, f"{num_passing} of {in_scope} start", failing)


def test_current_release_set_runs_our_entry_points_and_lists_every_script_it_leaves_out():
    scripts = load_scripts(CURRENT_SCRIPTS_JSON)
    not_ours = load_not_ours(CURRENT_SCRIPTS_JSON)
    # every stored script runs one of our trainers, the async trainers' scripts under their own entry points
    assert {s.entry_point for s in scripts} == set(ENTRY_POINT_CONFIGS)
    # the January file names none: each runs main_ppo
    assert {s.entry_point for s in load_scripts(SCRIPTS_JSON)} == {"verl.trainer.main_ppo"}
    # the left-out scripts (SFT, generation, distillation...) are listed with a reason, none also checked
    assert not_ours and all(reason for reason in not_ours.values())
    assert not set(not_ours) & {s.name for s in scripts}
    assert any(name.startswith("examples/sft/") for name in not_ours)


def _extractor():
    """scripts/verl_compat/extract_script_overrides.py as a module (scripts/ is no package)."""
    path = Path(__file__).resolve().parents[2] / "scripts" / "verl_compat" / "extract_script_overrides.py"
    spec = importlib.util.spec_from_file_location("extract_script_overrides", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_extraction_records_each_scripts_entry_point_and_why_one_is_left_out(tmp_path):
    extractor = _extractor()
    root = tmp_path / "x"
    recorder = root / "record.py"
    root.mkdir()
    recorder.write_text(extractor._RECORDER)
    extractor._write_shims(root / "shims", recorder)
    scripts = {
        # verl's async scripts run through ray job submit and uv: the module after -m is the entry point
        "a.sh": "M=verl.experimental.fully_async_policy.fully_async_main\nray job submit -- uv run python -m $M "
        "--config-path=config --config-name=x.yaml data.train_batch_size=0 trainer.n_gpus_per_node=$((2 * 4))\n",
        "b.sh": "torchrun --nproc_per_node=8 -m verl.trainer.sft_trainer model.path=m\n",
        "c.sh": "python3 -m verl.trainer.main_ppo distillation.enabled=True\n",
        "d.sh": "set -u\necho $UNSET_BY_USER\npython3 -m verl.trainer.main_ppo a=1\n",
    }
    records = {
        name: extractor._record(name, text, extractor.run_script(text, name, root / "repo", root / "shims"))
        for name, text in scripts.items()
    }
    assert records["a.sh"]["entry_point"] == "verl.experimental.fully_async_policy.fully_async_main"
    assert (records["a.sh"]["config_path"], records["a.sh"]["config_name"]) == ("config", "x.yaml")
    # the shell expanded the arithmetic: 2 * 4 = 8
    assert records["a.sh"]["overrides"] == ["data.train_batch_size=0", "trainer.n_gpus_per_node=8"]
    assert "reason" not in records["a.sh"]
    assert records["b.sh"]["reason"] == "entry point verl.trainer.sft_trainer is not one of this package's trainers"
    assert records["c.sh"]["reason"].startswith("on-policy distillation trainer")
    # bash stopped at an unset variable before the trainer call: listed with bash's message, not dropped
    assert records["d.sh"]["reason"] == "stops before its trainer call: line 2: UNSET_BY_USER: unbound variable"


def test_all_blockers_names_the_override_each_refusal_names():
    from tests.trainer.verl_scripts.report import blocking_override

    overrides = ("+x.y=1", "trainer.balance_batch=True", "actor_rollout_ref.actor.fsdp_config.fsdp_size=8")
    # Hydra's refusal quotes the key; ours name key=value
    assert blocking_override(overrides, "Could not override 'trainer.balance_batch'.") == overrides[1]
    message = "actor_rollout_ref.actor.fsdp_config.fsdp_size=8: larger than the 1 ranks"
    assert blocking_override(overrides, message) == overrides[2]
    assert blocking_override(overrides, "a rule across two keys of no override here") is None


def test_all_blockers_report_counts_scripts_that_start_that_are_freed_and_that_are_out_of_scope():
    from tests.trainer.verl_scripts.report import format_all_blockers

    results = [
        ("a.sh", [], None),  # starts
        ("b.sh", [("actor_rollout_ref.actor.megatron.param_offload=True", "...")], None),  # freed
        ("c.sh", [("actor_rollout_ref.ref.megatron.param_offload=True", "...")], "out of scope: veomni"),
    ]
    lines = format_all_blockers(results)
    # 1 starts as it is; 1 more once its blocker goes; 1 ends at an out-of-scope refusal
    assert "1 of 3 scripts start; 1 more start once their blocking overrides go; 1 end at an out-of-scope" in lines[4]
    # both first blockers collapse to the same key (the role prefix goes): 2 scripts
    assert "  2  *.megatron.param_offload" in lines


def test_all_blockers_report_gives_the_in_scope_share_without_out_of_scope_and_broken_in_verl_scripts():
    from tests.trainer.verl_scripts.report import format_all_blockers

    results = [
        ("a.sh", [], None),  # starts
        ("b.sh", [("x.y=1", "...")], None),  # in scope, does not start yet
        ("c.sh", [], "out of scope: SGLang"),  # out of scope at its first refusal
        ("d.sh", [("model_engine=megatron", "...")], None),  # verl cannot start it either
    ]
    lines = format_all_blockers(results, {"d.sh": "in verl 1dda039 too: Could not override"})
    # in scope: a and b (c is out of scope, d broken in verl): 1 of 2 start, 50 %
    assert any(line.startswith("in scope (") and line.endswith(": 1 of 2 start (50 %)") for line in lines)
    assert any(line.startswith("d.sh:") and "[in verl 1dda039 too" in line for line in lines)


def test_extraction_marks_the_scripts_verls_own_config_or_files_cannot_start(tmp_path):
    import subprocess

    extractor = _extractor()
    # a repository laid out like verl's: one config file and one reward function, committed
    repo = tmp_path / "verl_repo"
    (repo / "verl/trainer/config").mkdir(parents=True)
    config = "data:\n  train_batch_size: 8\n  train_files: null\ncustom_reward_function:\n  path: null\n"
    (repo / "verl/trainer/config/ppo_trainer.yaml").write_text(config)
    (repo / "verl/utils").mkdir()
    (repo / "verl/utils/score.py").write_text("def compute_score(*args):\n    return 0.0\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    where = "/tmp/verl_scripts_ab12/repo"  # the extraction's repository, as recorded in the overrides

    def record(name, *overrides):
        return {"script": name, "entry_point": "verl.trainer.main_ppo", "config_path": None, "config_name": None,
                "overrides": list(overrides)}  # fmt: skip

    records = [
        record("ok.sh", "data.train_batch_size=4", f"custom_reward_function.path={where}/verl/utils/score.py"),
        record("unknown.sh", "data.no_such_key=1"),  # Hydra refuses it in verl too
        record("plus.sh", "+data.train_batch_size=4"),  # verl's YAML has the key: + cannot add it
        record("file.sh", f"custom_reward_function.path={where}/verl/utils/gone.py"),
        record("data.sh", f"data.train_files={where}/data/train.parquet"),  # data files are the user's, not verl's
    ]
    reasons = extractor.broken_in_verl(str(repo / ".git"), "HEAD", records)
    assert reasons["ok.sh"] is None and reasons["data.sh"] is None
    assert reasons["unknown.sh"].startswith("in verl HEAD too: ConfigCompositionException: Could not override")
    assert "Could not append to config" in reasons["plus.sh"]
    assert reasons["file.sh"] == (
        "in verl HEAD too: custom_reward_function.path names verl/utils/gone.py, which verl's repository does not have"
    )
