#!/usr/bin/env bash
# Runs every CPU test: the C++ suites through ctest (label cpu) and the Python package's pytest suite.
# GPU tests (label gpu) run on a GPU machine through tools/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
[ -d build ] || bash tools/setup.sh
cmake --build build -j"$(nproc)"
ctest --test-dir build -L cpu --output-on-failure -j1
if [ -d tests/python ]; then
  PYTHONPATH="$PWD/python" /usr/bin/python3 -m pytest -q tests/python
fi
