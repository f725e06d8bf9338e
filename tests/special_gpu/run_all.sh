#!/usr/bin/env bash
# Every GPU check of the repository and the GPU figures, in one call of at most 8 minutes on a fresh lent machine.
#
# The machine (the 'cuda' image: Python 3.12, torch 2.11 cu130, transformers 5.17; no Ray, no Hydra, no vLLM, no
# network) keeps its own python3 and torch. Steps:
#   1. install: the wheelhouse (tests/special_gpu/wheels, filled here by fetch_wheels.sh and carried with the call)
#      is checked against wheels.txt and installed with --no-deps into a fresh folder put on PYTHONPATH with verl;
#   2. cuda_available: torch must see the GPU (otherwise every GPU test would skip);
#   3. bench_gpu_figures.py: MFU, peak memory and the fp16 loss-scale warm-up, printed as "FIGURE <name>: <value>";
#   4. every test file holding a `pytest.mark.gpu` test runs with `-m gpu` in a process of its own (GPU_CHECK_JOBS
#      at a time), and each of its tests prints one line: "CHECK <file>::<test>: PASS|FAIL (<s>s) <figures>".
# A skipped GPU test is a FAIL: on this machine a skip is a check that did not run. The one exception is by design:
# vLLM cannot run on the lent machine (its CUDA wheel pins another torch and is far over what a call carries), so
# the vLLM rollout's files (VLLM_FILES) get a "NOT RUN BY DESIGN" line each and count as no failure.
#
# --rehearse runs the same script on a machine without a GPU: the same install, into a scratch folder (for
# CPython 3.12 whatever the local Python), every GPU test file collected with the GPU image's package set imposed
# (tests/special_gpu/rehearsal: Ray and vLLM refused, so is anything the image and the wheelhouse lack), the CPU
# variants of tests/special_gpu's checks run on that package set, every file run with `-m gpu` and reported (a skip
# for the missing CUDA device is then expected: REHEARSED), and the figures script on a tiny CPU model (--dry-run),
# so that a mistake in any of them shows up before device time is spent.
#
# Environment: PYTHON (default python3), WHEELHOUSE, GPU_WHEEL_LIST (default wheels.txt), GPU_CHECK_FILES (the test
# files to run, space-separated; default: every file with a gpu mark), GPU_CHECK_JOBS (default 3),
# GPU_CHECKS_DEADLINE_S (default 450), GPU_RUN_BENCH (default 1), GPU_REHEARSE_CPU_VARIANTS (default 1),
# GPU_CHECKS_ARCHIVE (a .tgz path to write the logs and JUnit reports to, e.g. under the device tool's $OUT).
# Exit status: 0 when every check passed, 1 otherwise.
#
# Usage: bash tests/special_gpu/run_all.sh [--rehearse]
set -uo pipefail
cd "$(dirname "$0")/../.."

REHEARSE=0
case "${1:-}" in
  "") ;;
  --rehearse) REHEARSE=1 ;;
  *) echo "usage: bash tests/special_gpu/run_all.sh [--rehearse]" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-tests/special_gpu/wheels}
DEFAULT_WHEEL_LIST=tests/special_gpu/wheels.txt
WHEEL_LIST=${GPU_WHEEL_LIST:-$DEFAULT_WHEEL_LIST}
JOBS=${GPU_CHECK_JOBS:-3}
DEADLINE_S=${GPU_CHECKS_DEADLINE_S:-450}
RUN_BENCH=${GPU_RUN_BENCH:-1}
LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/verl_gpu_checks.XXXXXX")
SITE_DIR=$LOG_DIR/site
mkdir -p "$LOG_DIR/tmp"
# checks that cannot run on the lent machine by design, and why
VLLM_FILES=" tests/workers/rollout/test_vllm_rollout.py tests/workers/rollout/test_vllm_tensor_parallel.py "
VLLM_WHY="vLLM cannot run on this machine: its CUDA wheel pins another torch and is far over the 64 MiB a call carries"
# a few threads per test process: several run at once on the machine's 16 cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
num_failed=0
num_passed=0
num_by_design=0

time_left() { # time_left <cap>: seconds until the deadline, at most <cap>, at least 1
  local left=$((DEADLINE_S - SECONDS))
  [ "$left" -gt "$1" ] && left=$1
  [ "$left" -lt 1 ] && left=1
  echo "$left"
}

check() { # check <name> <PASS|FAIL|REHEARSED> <start seconds> [detail] [log]
  local name=$1 status=$2 start=$3 detail=${4:-} log=${5:-}
  echo "CHECK ${name}: ${status} ($((SECONDS - start))s)${detail:+ $detail}"
  case $status in
    PASS) num_passed=$((num_passed + 1)) ;;
    FAIL)
      num_failed=$((num_failed + 1))
      if [ -n "$log" ] && [ -f "$log" ]; then tail -n 30 "$log" | sed 's/^/    /'; fi
      ;;
  esac
}

finish() {
  if [ -n "${GPU_CHECKS_ARCHIVE:-}" ]; then
    tar -czf "$GPU_CHECKS_ARCHIVE" -C "$LOG_DIR" --exclude=./site --exclude=./tmp . 2>/dev/null ||
      echo "could not write $GPU_CHECKS_ARCHIVE"
  fi
  local mode=""
  [ "$REHEARSE" = 1 ] && mode=" (rehearsal without a GPU)"
  echo "GPU checks${mode}: ${num_failed} failed, ${num_passed} passed, ${num_by_design} not run by design," \
    "$((SECONDS))s (logs in $LOG_DIR)"
  [ "$num_failed" = 0 ]
  exit $?
}

# ---------------------------------------------------------------- 1. install (the machine's torch stays)
install_wheelhouse() {
  local start=$SECONDS log=$LOG_DIR/install.log
  local torch_file
  if ! torch_file=$($PYTHON -c "import torch; print(torch.__file__)" 2>>"$log"); then
    check install FAIL "$start" "(no torch in $PYTHON: the machine's own torch is expected, never installed)" "$log"
    finish
  fi
  if ! $PYTHON tests/special_gpu/wheelhouse.py "$WHEELHOUSE" "$WHEEL_LIST" >>"$log" 2>&1; then
    check install FAIL "$start" "(the wheelhouse does not match $WHEEL_LIST: run fetch_wheels.sh here first)" "$log"
    finish
  fi
  local target_python=()
  if [ "$REHEARSE" = 1 ]; then # the GPU image's wheels, whatever this machine's Python
    target_python=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none)
    for tag in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any; do
      target_python+=(--platform "$tag")
    done
  fi
  if ! timeout "$(time_left 120)" $PYTHON -m pip install --disable-pip-version-check -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target "$SITE_DIR" "${target_python[@]}" "$WHEELHOUSE"/*.whl \
    >>"$log" 2>&1; then
    check install FAIL "$start" "(pip could not install the wheelhouse)" "$log"
    finish
  fi
  export PYTHONPATH=$SITE_DIR:$PWD${PYTHONPATH:+:$PYTHONPATH}
  if [ "$REHEARSE" = 1 ]; then
    local strict=0
    [ "$WHEEL_LIST" = "$DEFAULT_WHEEL_LIST" ] && strict=1 # a test's own pin list proves nothing of the real one
    export PYTHONPATH=$PWD/tests/special_gpu/rehearsal:$PYTHONPATH
    export VERL_REHEARSAL=1 VERL_REHEARSAL_SITE=$SITE_DIR VERL_REHEARSAL_STRICT=$strict
  fi
  local versions
  if ! versions=$($PYTHON -c "
import torch, transformers, megatron.core, tensordict, omegaconf, hydra, safetensors, pytest
import verl.workers.actor.megatron_builder, verl.workers.actor.fsdp_actor
assert torch.__file__ == '$torch_file', 'torch was shadowed by ' + torch.__file__
print('torch', torch.__version__, 'transformers', transformers.__version__, 'megatron-core',
      megatron.core.__version__, 'tensordict', tensordict.__version__)" 2>>"$log"); then
    check install FAIL "$start" "(verl's GPU imports fail after the install)" "$log"
    finish
  fi
  check install PASS "$start" "$versions"
}

# ---------------------------------------------------------------- 2. the device itself
check_cuda() {
  local start=$SECONDS log=$LOG_DIR/cuda.log
  if [ "$REHEARSE" = 1 ]; then
    check cuda_available REHEARSED "$start" "(no GPU expected here)"
    return
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$log" 2>&1 || true
  local device
  if ! device=$($PYTHON -c "import torch; assert torch.cuda.is_available(), 'torch sees no CUDA device'; \
print(torch.cuda.get_device_name(0), 'CUDA', torch.version.cuda, torch.cuda.device_count(), 'device(s)')" \
    2>>"$log"); then
    check cuda_available FAIL "$start" "" "$log"
    finish
  fi
  check cuda_available PASS "$start" "$device"
}

# ---------------------------------------------------------------- 3. the figures
run_bench() {
  local start=$SECONDS log=$LOG_DIR/bench_gpu_figures.log args=()
  [ "$REHEARSE" = 1 ] && args=(--dry-run)
  timeout -k 10 "$(time_left 150)" $PYTHON tests/special_gpu/bench_gpu_figures.py "${args[@]}" >"$log" 2>&1
  local rc=$?
  grep -E '^FIGURE ' "$log"
  if [ "$rc" = 0 ]; then
    check bench_gpu_figures "$([ "$REHEARSE" = 1 ] && echo REHEARSED || echo PASS)" "$start"
  else
    check bench_gpu_figures FAIL "$start" "(exit status $rc)" "$log"
  fi
}

# ---------------------------------------------------------------- 4. every file with GPU tests
gpu_test_files() {
  if [ -n "${GPU_CHECK_FILES:-}" ]; then
    printf '%s\n' $GPU_CHECK_FILES
  else
    grep -rlE --include='test_*.py' 'pytest\.mark\.gpu\b' tests | sort
  fi
}

collect_without_ray() { # the rehearsal's collection of every file in one process, the image's packages imposed
  local start=$SECONDS log=$LOG_DIR/collect.log
  $PYTHON -m pytest --collect-only -q -p no:cacheprovider -m gpu "$@" >"$log" 2>&1
  local rc=$?
  local num_tests num_files
  num_tests=$(grep -c '::' "$log")
  num_files=$(grep '::' "$log" | cut -d: -f1 | sort -u | wc -l)
  if [ "$rc" = 0 ] && [ "$num_files" = "$#" ]; then
    check collect_without_ray PASS "$start" "$num_tests GPU tests in $num_files files"
  else
    check collect_without_ray FAIL "$start" "(pytest exit status $rc; $num_files of $# files hold collected GPU tests)" "$log"
  fi
}

cpu_variants() { # the rehearsal runs the CPU variants of the GPU checks too: their code paths, on the image's packages
  local start=$SECONDS log=$LOG_DIR/cpu_variants.log own=()
  for file in "$@"; do [[ $file == tests/special_gpu/* ]] && own+=("$file"); done
  [ "${#own[@]}" = 0 ] && return
  $PYTHON -m pytest -q -p no:cacheprovider -m "not gpu" "${own[@]}" >"$log" 2>&1
  local rc=$?
  if [ "$rc" = 0 ]; then
    check cpu_variants_on_the_image_packages PASS "$start" "$(tail -n 1 "$log")"
  else
    check cpu_variants_on_the_image_packages FAIL "$start" "(pytest exit status $rc)" "$log"
  fi
}

run_file() { # run_file <file> <name>: one file's GPU tests in a process of its own; its exit status in <name>.rc
  local file=$1 name=$2
  # a temporary folder of its own: pytest processes running at once would clean up each other's
  timeout -k 10 "$(time_left 240)" $PYTHON -m pytest -q -rs -p no:cacheprovider -o junit_family=xunit1 \
    --basetemp="$LOG_DIR/tmp/$name" --junitxml="$LOG_DIR/$name.xml" -m gpu "$file" >"$LOG_DIR/$name.log" 2>&1
  echo $? >"$LOG_DIR/$name.rc.tmp"
  mv "$LOG_DIR/$name.rc.tmp" "$LOG_DIR/$name.rc"
}

report_file() { # report_file <file> <name>: one line per test of the file
  local file=$1 name=$2 out rc args=()
  [ "$REHEARSE" = 1 ] && args=(--rehearse)
  out=$($PYTHON tests/special_gpu/report_checks.py --file "$file" --junit "$LOG_DIR/$name.xml" \
    --log "$LOG_DIR/$name.log" --rc "$(cat "$LOG_DIR/$name.rc")" "${args[@]}")
  rc=$?
  echo "$out"
  num_failed=$((num_failed + rc))
  num_passed=$((num_passed + $(grep -c ': PASS (' <<<"$out")))
}

run_test_files() {
  local pending=("$@") running=() still file name
  while [ "${#pending[@]}" -gt 0 ] || [ "${#running[@]}" -gt 0 ]; do
    while [ "${#running[@]}" -lt "$JOBS" ] && [ "${#pending[@]}" -gt 0 ]; do
      file=${pending[0]}
      pending=("${pending[@]:1}")
      if [ $((DEADLINE_S - SECONDS)) -lt 30 ]; then
        check "$file" FAIL "$SECONDS" "(not run: the ${DEADLINE_S}s budget of this script is spent)"
        continue
      fi
      run_file "$file" "$(echo "${file#tests/}" | tr '/' '.')" &
      running+=("$file")
    done
    sleep 1
    still=()
    for file in "${running[@]}"; do
      name=$(echo "${file#tests/}" | tr '/' '.')
      if [ -f "$LOG_DIR/$name.rc" ]; then report_file "$file" "$name"; else still+=("$file"); fi
    done
    running=("${still[@]}")
  done
  wait
}

# ---------------------------------------------------------------- the run
if [ "$REHEARSE" = 1 ]; then
  echo "rehearsal of the GPU run without a GPU: its figures and CUDA skips mean nothing"
fi
install_wheelhouse
check_cuda
mapfile -t candidates < <(gpu_test_files)
files=()
vllm_importable=0
$PYTHON -c "import vllm" >/dev/null 2>&1 && vllm_importable=1
for file in "${candidates[@]}"; do
  if [[ $VLLM_FILES == *" $file "* ]] && [ "$vllm_importable" = 0 ]; then
    echo "CHECK ${file}: NOT RUN BY DESIGN ($VLLM_WHY)"
    num_by_design=$((num_by_design + 1))
  else
    files+=("$file")
  fi
done
if [ "${#files[@]}" = 0 ]; then
  check discover_gpu_tests FAIL "$SECONDS" "(no test file with a gpu mark)"
  finish
fi
if [ "$REHEARSE" = 1 ]; then
  collect_without_ray "${files[@]}"
  [ "${GPU_REHEARSE_CPU_VARIANTS:-1}" = 1 ] && cpu_variants "${files[@]}"
fi
[ "$RUN_BENCH" = 1 ] && run_bench
run_test_files "${files[@]}"
finish
