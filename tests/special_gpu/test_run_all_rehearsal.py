"""The GPU run's script, rehearsed on the CPU: what ``run_all.sh --rehearse`` does, in the parts that are fast.

The GPU machine is lent for minutes, so the script must work the first time there: these tests run its rehearsal
on two files of GPU checks with a wheelhouse of one tiny wheel built here (install, the vLLM file's by-design line,
collection with Ray and vLLM refused, every file run and reported), the whole script on a stub check list (a
failing check gives a FAIL line and exit status 1), its refusal of a wheelhouse holding two versions of one package,
the reporter's verdicts on JUnit reports, the wheelhouse check, the image's package set imposed on an interpreter,
and the vLLM rollout's file skipping (not erroring) where vLLM and Ray are missing.
The full rehearsal (every GPU test file, the real wheelhouse, the figures on a tiny model) is
``PYTHON=.venv/bin/python bash tests/special_gpu/run_all.sh --rehearse`` (about 3 minutes on 2 cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.special_gpu import bench_gpu_figures, report_checks, wheelhouse

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# two files of GPU checks (3 + 4 tests), and the vLLM rollout's file, which a machine without vLLM does not run
CHECK_FILES = (
    "tests/special_gpu/test_worker_nccl_gpu.py tests/special_gpu/test_dp_actor_gpu.py "
    "tests/workers/rollout/test_vllm_rollout.py"
)


def write_wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python wheel holding one empty module ``name``."""
    dist_info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.py", "")
        archive.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist_info}/RECORD", "")
    return path


def run_all(
    tmp_path: Path, wheels: list[tuple[str, str]], pins: list[str], *args: str, **env
) -> subprocess.CompletedProcess:
    house = tmp_path / "wheels"
    house.mkdir()
    for name, version in wheels:
        write_wheel(house, name, version)
    pin_list = tmp_path / "pins.txt"
    pin_list.write_text("# test pins\n" + "\n".join(pins) + "\n")
    environment = {
        **os.environ,
        "PYTHON": sys.executable,
        "WHEELHOUSE": str(house),
        "GPU_WHEEL_LIST": str(pin_list),
        "GPU_CHECK_FILES": CHECK_FILES,
        "GPU_CHECK_JOBS": "2",
        "GPU_RUN_BENCH": "0",
        "GPU_REHEARSE_CPU_VARIANTS": "0",  # the suite runs them anyway
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        **env,
    }
    return subprocess.run(
        ["bash", str(HERE / "run_all.sh"), *args],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


# a stub check list: one file of three GPU tests, one that passes, one that fails, one that skips without CUDA
STUB_CHECKS = """
import pytest
import torch


@pytest.mark.gpu
def test_stub_passes():
    assert 1 + 1 == 2


@pytest.mark.gpu
def test_stub_fails():
    assert 1 + 1 == 3, "the stub's failure"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_stub_needs_cuda():
    pass
"""


def test_a_failing_check_gives_a_fail_line_and_a_non_zero_exit(tmp_path):
    # the whole script on a stub check list: install, collection, the file run and reported, the summary and exit
    stub = tmp_path / "stub" / "test_stub_gpu.py"
    stub.parent.mkdir()
    stub.write_text(STUB_CHECKS)
    result = run_all(
        tmp_path,
        [("verl_rehearsal_probe", "0.0.1")],
        ["verl-rehearsal-probe==0.0.1"],
        "--rehearse",
        GPU_CHECK_FILES=str(stub),
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    checks = {line.split(": ")[0]: line.split(": ")[1].split(" (")[0] for line in lines if line.startswith("CHECK ")}
    assert checks == {
        "CHECK install": "PASS",
        "CHECK cuda_available": "REHEARSED",
        "CHECK collect_without_ray": "PASS",
        f"CHECK {stub}::test_stub_passes": "PASS",
        f"CHECK {stub}::test_stub_fails": "FAIL",
        f"CHECK {stub}::test_stub_needs_cuda": "REHEARSED",  # the skip a rehearsal expects, not a failure
    }
    assert "the stub's failure" in result.stdout  # the failing check's reason is printed with it
    # passed: install, collection, test_stub_passes; failed: test_stub_fails alone
    assert lines[-1].startswith("GPU checks (rehearsal without a GPU): 1 failed, 3 passed, 0 not run by design")


def test_the_wheel_fetcher_parses():
    # fetch_wheels.sh downloads from PyPI, which a test must not do: only its syntax is checked here
    result = subprocess.run(["bash", "-n", str(HERE / "fetch_wheels.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_rehearsal_installs_collects_runs_and_reports(tmp_path):
    archive = tmp_path / "checks.tgz"
    result = run_all(
        tmp_path,
        [("verl_rehearsal_probe", "0.0.1")],
        ["verl-rehearsal-probe==0.0.1"],
        "--rehearse",
        GPU_CHECKS_ARCHIVE=str(archive),
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(line.startswith("CHECK install: PASS") for line in lines)
    assert next(tmp_path.glob("verl_gpu_checks.*/site/verl_rehearsal_probe.py")).is_file()
    assert "CHECK cuda_available: REHEARSED" in result.stdout
    by_design = [line for line in lines if "NOT RUN BY DESIGN" in line]
    assert by_design == [line for line in lines if "test_vllm_rollout.py" in line] and len(by_design) == 1
    # two files left to run: collected with Ray and vLLM refused, every GPU test reported
    assert any(
        line.startswith("CHECK collect_without_ray: PASS") and "7 GPU tests in 2 files" in line for line in lines
    )
    reported = [line for line in lines if line.startswith("CHECK tests/special_gpu/test_")]
    assert len(reported) == 7 and all(": REHEARSED (" in line for line in reported)
    fused = "CHECK tests/special_gpu/test_dp_actor_gpu.py::test_the_fused_adamw_step_equals_the_per_tensor_loop[cuda]"
    assert fused in result.stdout
    assert lines[-1].startswith("GPU checks (rehearsal without a GPU): 0 failed")
    with tarfile.open(archive) as logs:  # the logs and JUnit reports, for the device tool's $OUT
        names = logs.getnames()
    assert "./special_gpu.test_dp_actor_gpu.py.xml" in names and "./install.log" in names
    assert not any(name.startswith(("./site", "./tmp")) for name in names)


def test_a_wheelhouse_with_two_versions_of_a_package_fails_the_install(tmp_path):
    result = run_all(
        tmp_path,
        [("verl_rehearsal_probe", "0.0.1"), ("verl_rehearsal_probe", "0.0.2")],
        ["verl-rehearsal-probe==0.0.1"],
    )
    assert result.returncode == 1
    assert "CHECK install: FAIL" in result.stdout and "the wheelhouse holds ['0.0.1', '0.0.2']" in result.stdout
    assert "CHECK collect_without_ray" not in result.stdout  # nothing runs after a failed install


def test_without_a_gpu_the_real_run_stops_after_the_install_instead_of_skipping_every_check(tmp_path):
    if subprocess.run([sys.executable, "-c", "import torch; assert not torch.cuda.is_available()"]).returncode:
        pytest.skip("this machine has a GPU: the real run would go on")
    result = run_all(tmp_path, [("verl_rehearsal_probe", "0.0.1")], ["verl-rehearsal-probe==0.0.1"])
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert lines[0].startswith("CHECK install: PASS") and lines[1].startswith("CHECK cuda_available: FAIL")
    assert "torch sees no CUDA device" in result.stdout
    assert lines[-1].startswith("GPU checks: 1 failed, 1 passed")


def test_the_figures_count_the_model_flops_of_qwen2_0_5b_by_hand():
    config = bench_gpu_figures.hf_config(dry_run=False)
    # per layer: q and o 896 x 896 each, k and v 896 x 128 each (2 heads of 64), gate/up/down 3 x 896 x 4864:
    # 1,605,632 + 229,376 + 13,074,432 = 14,909,440; 24 layers: 357,826,560; + the tied LM head 151936 x 896 =
    # 136,134,656: N = 493,961,216. One update of 16 rows of 1024 tokens: T = 16384;
    # 6 N T = 4.85587e13 and 12 L d S T = 12 * 24 * 896 * 1024 * 16384 = 4.32932e12
    expected = 6 * 493_961_216 * 16384 + 12 * 24 * 896 * 1024 * 16384
    assert bench_gpu_figures.model_flops(config, num_rows=16, seq_len=1024) == expected


def test_the_wheelhouse_check_wants_one_wheel_of_the_pinned_version_per_pin(tmp_path):
    write_wheel(tmp_path, "alpha", "1.0")
    write_wheel(tmp_path, "beta_pkg", "2.0")
    (tmp_path / "notes.txt").write_text("")
    pins = {"alpha": "1.0", "beta_pkg": "2.1", "gamma": "3.0"}
    assert sorted(wheelhouse.problems(tmp_path, pins)) == [
        "beta_pkg==2.1: the wheelhouse holds ['2.0']",
        "gamma==3.0: the wheelhouse holds none",
        "notes.txt: not a wheel",
    ]
    pin_list = tmp_path / "pins.txt"
    pin_list.write_text("# c\nBeta.Pkg==2.0  # a comment\n")
    assert wheelhouse.read_pins(pin_list) == {"beta_pkg": "2.0"}
    pin_list.write_text("alpha>=1\n")
    with pytest.raises(ValueError, match="no exact pin"):
        wheelhouse.read_pins(pin_list)
    # the real list pins every package once, and fetch_wheels.sh fills the folder run_all.sh reads
    assert len(wheelhouse.read_pins(HERE / "wheels.txt")) == 6


JUNIT = """<testsuites><testsuite>
<testcase classname="t" name="test_ok" time="1.25"><properties><property name="max_diff" value="3e-06"/></properties>
</testcase>
<testcase classname="t" name="test_skipped" time="0.0"><skipped message="{reason}">x</skipped></testcase>
</testsuite></testsuites>"""


@pytest.mark.parametrize(
    ("reason", "rehearse", "status", "num_failed"),
    [
        ("needs a CUDA device", False, "FAIL", 1),  # on the GPU machine a skip is a check that did not run
        ("needs a CUDA device", True, "REHEARSED", 0),  # rehearsed without a GPU: the expected skip
        ("the vllm extra is not installed", True, "FAIL", 1),  # would skip on the GPU machine too
    ],
)
def test_the_reporter_prints_a_line_per_test_with_its_figures(tmp_path, reason, rehearse, status, num_failed):
    junit = tmp_path / "t.xml"
    junit.write_text(JUNIT.format(reason=reason))
    lines, failed = report_checks.report("tests/t.py", junit, tmp_path / "t.log", 0, rehearse)
    assert lines[0] == "CHECK tests/t.py::test_ok: PASS (1.2s) max_diff=3e-06"
    assert lines[1].startswith(f"CHECK tests/t.py::test_skipped: {status} (0.0s)") and reason in lines[1]
    assert failed == num_failed


def test_the_reporter_fails_a_file_without_a_report_or_without_gpu_tests(tmp_path):
    log = tmp_path / "t.log"
    log.write_text("line 1\nTimeout\n")
    lines, failed = report_checks.report("tests/t.py", tmp_path / "missing.xml", log, 124, False)
    assert (lines[0], failed) == ("CHECK tests/t.py: FAIL (timed out)", 1) and lines[-1] == "    Timeout"
    empty = tmp_path / "empty.xml"
    empty.write_text("<testsuites><testsuite/></testsuites>")
    lines, failed = report_checks.report("tests/t.py", empty, log, 5, False)
    assert (lines[0], failed) == ("CHECK tests/t.py: FAIL (no test of this file is marked gpu)", 1)


def rehearsal_python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "VERL_REHEARSAL": "1", "PYTHONPATH": f"{HERE / 'rehearsal'}:{REPO}", **env}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


def test_the_rehearsal_interpreter_refuses_what_the_gpu_image_lacks():
    result = rehearsal_python(
        "import sys\n"
        "for name in ('ray', 'vllm'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ImportError as err:\n"
        "        print(err)\n"
        "import json, numpy\n"  # the standard library and the image's packages pass
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "No module named 'ray' on the GPU image (not installed there; rehearsal)",
        "No module named 'vllm' on the GPU image (not installed there; rehearsal)",
        "ok",
    ]
    # strict: a wheelhouse package must come from the rehearsal's install folder, not from this machine
    strict = rehearsal_python("import omegaconf", VERL_REHEARSAL_STRICT="1", VERL_REHEARSAL_SITE="/nonexistent")
    assert strict.returncode == 1 and "the wheelhouse lacks it" in strict.stderr


def collect_without_vllm_and_ray(path: Path) -> subprocess.CompletedProcess:
    code = f"import sys, pytest; sys.exit(pytest.main(['--collect-only', '-rs', '-p', 'no:cacheprovider', '{path}']))"
    environment = {**os.environ, "VERL_REHEARSAL": "1", "PYTHONPATH": f"{HERE / 'rehearsal'}:{REPO}"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True, timeout=120
    )


def test_the_vllm_rollout_module_skips_where_vllm_and_ray_are_missing():
    result = collect_without_vllm_and_ray(REPO / "tests/workers/rollout/test_vllm_rollout.py")
    # a skipped module: nothing collected, no error (pytest's "no tests collected" exit status, 5; an error is 2)
    assert result.returncode == 5, result.stdout + result.stderr
    assert "1 skipped" in result.stdout and "the vllm extra is not installed" in result.stdout
