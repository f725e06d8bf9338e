# Sourced by every example script (`source "$(dirname "$0")/../python_env.sh"`): sets PYTHON, the interpreter the
# script runs verl with, so that an example works right after README's first command without activating anything.
#   1. $VERL_PYTHON when set (e.g. VERL_PYTHON=~/miniconda3/envs/verl/bin/python);
#   2. otherwise the project's environment, .venv/bin/python, when it exists (scripts/setup_env.sh creates it);
#   3. otherwise python3 from PATH (an environment you activated, with verl installed in it).
# The scripts `exec` it, so a signal for the script (Ctrl-C, `timeout`'s SIGTERM) reaches the run itself: it finishes
# its step, saves, and exits with its own code (5).
_verl_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${VERL_PYTHON:-}" ]; then
  PYTHON="$VERL_PYTHON"
elif [ -x "$_verl_root/.venv/bin/python" ]; then
  PYTHON="$_verl_root/.venv/bin/python"
else
  PYTHON=python3
fi
unset _verl_root
