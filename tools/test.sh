#!/usr/bin/env bash
# Runs every CPU test: the C++ suites through ctest (label cpu) and the Python package's pytest suite.
# GPU tests (label gpu) run on a GPU machine through tools/gpu_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}"
# Idle OpenMP threads sleep instead of spinning: on a loaded 2-core machine spinning made small calls up to 50x
# slower (docs/results/cpu_bench.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
[ -d build ] || bash tools/setup.sh
cmake --build build -j"$(nproc)"
ctest --test-dir build -L cpu --output-on-failure -j1
if [ -d tests/python ]; then
  PYTHONPATH="$PWD/python" /usr/bin/python3 -m pytest -q tests/python
fi
