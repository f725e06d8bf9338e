#!/usr/bin/env bash
# Every GPU check of the repository, in one call that fits in 8 minutes on one GPU with a fresh machine.
#
# Prints one line per check:   CHECK <name>: PASS|FAIL (<seconds>s)
# and, at the end,             GPU checks: <n> failed
# Exit status: the number of failed checks (0 = all passed).
#
# Steps: install verl with megatron-core around the machine's own torch (never replacing it), then vLLM for the
# vllm rollout's checks (a step of its own, see below), make sure CUDA is really there (otherwise every GPU test
# would skip and "pass"), then run each test file that holds `pytest.mark.gpu` tests with `-m gpu` as one check. A skipped GPU test counts as a failure here: on a CUDA
# machine a skip means a check did not run.
#
# Offline machines: a wheelhouse (WHEELHOUSE=<dir of wheels>, default tests/special_gpu/wheels, filled beforehand
# on a machine with PyPI by tests/special_gpu/fetch_wheels.sh) is installed with --no-deps into SITE_DIR and put
# on PYTHONPATH with verl itself; without one, pip installs verl with its extras. The machine's packages are kept.
#
# Usage: bash tests/special_gpu/run_all.sh            (PYTHON=... to pick the interpreter)
set -uo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-tests/special_gpu/wheels}
SITE_DIR=${SITE_DIR:-/tmp/verl_gpu_site}
LOG_DIR=$(mktemp -d /tmp/verl_gpu_checks.XXXXXX)
# the whole run stays inside this many seconds (the 8-minute call, less start-up and transfers)
DEADLINE_S=${GPU_CHECKS_DEADLINE_S:-450}
failures=0

time_left() {  # time_left <cap>: seconds until the deadline, at most <cap>, at least 1
  local left=$((DEADLINE_S - SECONDS))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 1 ] && left=1
  echo "$left"
}

report() {  # report <name> <ok: 0|1> <start seconds> [log]
  local name=$1 ok=$2 start=$3 log=${4:-}
  if [ "$ok" = 0 ]; then
    echo "CHECK ${name}: PASS ($((SECONDS - start))s)"
  else
    echo "CHECK ${name}: FAIL ($((SECONDS - start))s)"
    failures=$((failures + 1))
    if [ -n "$log" ] && [ -f "$log" ]; then tail -n 40 "$log" | sed 's/^/    /'; fi
  fi
}

# ---------------------------------------------------------------- install (torch stays as it is)
start=$SECONDS
install_log=$LOG_DIR/install.log
needed="import torch, verl, megatron.core, transformers, tensordict, omegaconf, safetensors, pytest"
if $PYTHON -c "$needed" >"$install_log" 2>&1; then
  report install 0 "$start"
else
  torch_version=$($PYTHON -c "import torch; print(torch.__version__)" 2>>"$install_log")
  if [ -z "$torch_version" ]; then
    echo "no torch in $PYTHON: this script expects the machine's torch and never installs one" >>"$install_log"
    report install 1 "$start" "$install_log"
    echo "GPU checks: $failures failed"
    exit "$failures"
  fi
  ok=1
  if [ -d "$WHEELHOUSE" ] && ls "$WHEELHOUSE"/*.whl >/dev/null 2>&1; then
    # offline machines: the wheels of tests/special_gpu/fetch_wheels.sh, beside the machine's own packages
    echo "installing the wheelhouse $WHEELHOUSE into $SITE_DIR" >>"$install_log"
    timeout "$(time_left 120)" $PYTHON -m pip install --disable-pip-version-check -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target "$SITE_DIR" "$WHEELHOUSE"/*.whl >>"$install_log" 2>&1 && ok=0
    export PYTHONPATH=$SITE_DIR:$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    # the constraint pins torch to the installed build, so pip fails rather than download another torch
    constraints=$LOG_DIR/constraints.txt
    echo "torch==${torch_version}" >"$constraints"
    timeout "$(time_left 180)" $PYTHON -m pip install --disable-pip-version-check --progress-bar off \
      -c "$constraints" --timeout 20 --retries 1 -e ".[megatron,test]" >>"$install_log" 2>&1 && ok=0
  fi
  if [ "$ok" != 0 ]; then
    # last resort: the machine may already hold the dependencies; put verl itself on the path
    echo "falling back to PYTHONPATH=. with the installed packages" >>"$install_log"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  $PYTHON -c "$needed" >>"$install_log" 2>&1
  report install $? "$start" "$install_log"
fi

# ---------------------------------------------------------------- vLLM, for the vllm rollout's GPU checks
# Its own step, so that a machine where vLLM cannot be installed still runs every other check. pip installs the
# release of pyproject's `vllm` extra with the machine's torch pinned: where that release needs another torch, pip
# fails rather than replace it, this step reports FAIL, and the vllm rollout's GPU tests skip (counted as failed
# below). An offline machine takes vLLM from the wheelhouse, like everything else.
start=$SECONDS
vllm_log=$LOG_DIR/install_vllm.log
if ! $PYTHON -c "import vllm" >"$vllm_log" 2>&1 && ! { [ -d "$WHEELHOUSE" ] && ls "$WHEELHOUSE"/*.whl >/dev/null 2>&1; }; then
  vllm_requirement=$(grep -oE '"vllm==[^"]+"' pyproject.toml | tr -d '"')
  vllm_constraints=$LOG_DIR/vllm_constraints.txt
  $PYTHON -c "import torch; print('torch==' + torch.__version__)" >"$vllm_constraints" 2>>"$vllm_log"
  timeout "$(time_left 180)" $PYTHON -m pip install --disable-pip-version-check --progress-bar off \
    -c "$vllm_constraints" --timeout 20 --retries 1 "$vllm_requirement" >>"$vllm_log" 2>&1
fi
$PYTHON -c "import vllm; print('vllm', vllm.__version__)" >>"$vllm_log" 2>&1
report install_vllm $? "$start" "$vllm_log"

# ---------------------------------------------------------------- the device itself
start=$SECONDS
cuda_log=$LOG_DIR/cuda.log
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$cuda_log" 2>&1 || true
$PYTHON -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))" >>"$cuda_log" 2>&1
cuda_ok=$?
[ "$cuda_ok" = 0 ] && sed 's/^/    /' "$cuda_log"
report cuda_available "$cuda_ok" "$start" "$cuda_log"
if [ "$cuda_ok" != 0 ]; then
  echo "GPU checks: $failures failed"
  exit "$failures"
fi

# ---------------------------------------------------------------- every file with GPU tests
mapfile -t gpu_files < <(grep -rlE --include='test_*.py' 'pytest\.mark\.gpu\b' tests | sort)
if [ "${#gpu_files[@]}" = 0 ]; then
  report discover_gpu_tests 1 "$SECONDS"
fi
for file in "${gpu_files[@]}"; do
  name=$(echo "${file#tests/}" | sed 's/\.py$//; s#/#.#g')
  log=$LOG_DIR/${name}.log
  start=$SECONDS
  if [ $((DEADLINE_S - SECONDS)) -lt 20 ]; then
    echo "not run: the ${DEADLINE_S}s budget of this script is spent" >"$log"
    report "$name" 1 "$start" "$log"
    continue
  fi
  # each file gets its own process: megatron-core's global process groups never leak between files
  timeout -k 10 "$(time_left 240)" $PYTHON -m pytest -q -rs -p no:cacheprovider -m gpu "$file" >"$log" 2>&1
  rc=$?
  ok=$rc
  if [ "$rc" = 5 ]; then
    echo "no test of this file is marked gpu" >>"$log"
  elif [ "$rc" = 0 ] && grep -qE '[0-9]+ skipped' "$log"; then
    echo "a GPU test was skipped on a CUDA machine: it did not run" >>"$log"
    ok=1
  fi
  report "$name" "$ok" "$start" "$log"
done

echo "GPU checks: $failures failed (logs in $LOG_DIR)"
exit "$failures"
