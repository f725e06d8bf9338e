#!/usr/bin/env bash
# Fill the wheelhouse that tests/special_gpu/run_all.sh installs on the lent GPU machine (no network there).
#
# Run it here, on a machine with PyPI, before the GPU call; the call then carries tests/special_gpu/wheels. It
# downloads exactly the pins of tests/special_gpu/wheels.txt, --no-deps, built for the GPU image: CPython 3.12 on
# manylinux x86_64 (a package with no wheel on PyPI, such as antlr4-python3-runtime, is built here from its source;
# only pure-Python ones can be). Then it checks one wheel per pin, nothing else in the folder, and prints the size
# of the wheelhouse and of what a GPU call carries with it (the working tree travels too: 64 MiB in all).
#
# Usage: bash tests/special_gpu/fetch_wheels.sh        (PYTHON=... for the pip to use; WHEELHOUSE=... for the folder)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-tests/special_gpu/wheels}
WHEEL_LIST=${GPU_WHEEL_LIST:-tests/special_gpu/wheels.txt}
LIMIT_MIB=64

platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done

rm -rf "$WHEELHOUSE"
mkdir -p "$WHEELHOUSE"
mapfile -t pins < <(grep -vE '^\s*(#|$)' "$WHEEL_LIST")
for pin in "${pins[@]}"; do
  if ! "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none "${platforms[@]}" \
    -d "$WHEELHOUSE" "$pin" 2>/dev/null; then
    echo "$pin: no wheel for CPython 3.12 on PyPI; building one from its source (pure Python only)"
    "$PYTHON" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WHEELHOUSE" "$pin"
  fi
done

# exactly one wheel per pin, of the pinned version, pure Python or CPython 3.12 on x86_64
"$PYTHON" tests/special_gpu/wheelhouse.py "$WHEELHOUSE" "$WHEEL_LIST"

wheel_kib=$(du -sk "$WHEELHOUSE" | cut -f1)
# what travels besides: tracked and untracked-but-not-ignored files (apparent sizes, as they are copied)
tree_kib=$(git ls-files -co --exclude-standard -z | "$PYTHON" -c '
import os, sys
paths = [p for p in sys.stdin.buffer.read().decode().split("\0") if p and os.path.isfile(p)]
print(sum(os.path.getsize(p) for p in paths) // 1024)')
echo "wheelhouse: $((wheel_kib / 1024)).$(((wheel_kib % 1024) * 10 / 1024)) MiB in $WHEELHOUSE"
echo "with the working tree a GPU call carries: $(((wheel_kib + tree_kib) / 1024)) MiB of the ${LIMIT_MIB} MiB limit"
if [ $((wheel_kib + tree_kib)) -ge $((LIMIT_MIB * 1024)) ]; then
  echo "over the limit: the call would be refused" >&2
  exit 1
fi
