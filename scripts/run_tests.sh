#!/usr/bin/env bash
# README's second command: set up .venv, then run every check CI runs — pre-commit hooks (ruff lint and format,
# YAML, whitespace), the commit-title check, the docs build and the test suite. Fails on the first failing check;
# "no tests collected" counts as a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== pre-commit"
pre-commit run --all-files --show-diff-on-failure
echo "== commit title"
python tests/special_sanity/check_pr_title.py --from-git
echo "== pytest"
# Two pytest workers (pytest-xdist), PYTEST_WORKERS to change: much of an end-to-end test is waiting on process
# start-up (Ray, workers, imports), so two of them overlap well even on two cores (pytest 25 -> 17.5 min, see
# docs/perf.md). Every test keeps its own temporary directories, Ray instance and ports. Work stealing hands out
# the tests: a worker that runs out takes half of the other's queue, where xdist's default hands each worker fixed
# chunks and left one core idle for the last ~10 minutes (CI 31:14 -> 28:30 on a fresh clone). The 40 slowest
# tests are listed at the end, to keep the suite's time in view (CI's budget is 30 minutes).
set +e
python -m pytest -q -p no:cacheprovider -n "${PYTEST_WORKERS:-2}" --dist worksteal --durations=40 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing." >&2
  exit 1
fi
exit "$status"
