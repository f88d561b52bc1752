#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine and builds everything into ./build:
# Debian packages (libtorch, OpenBLAS with OpenMP, GoogleTest, Google Benchmark, CLI11, pytest, matplotlib,
# SentencePiece's Python module for the LM data (tools/lm_data.py), and venv, pip, setuptools, wheel for `pip install .`),
# then CMake (the CUDA kernels are compiled too when nvcc is in /usr/local/cuda; they run on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake libtorch-dev python3-torch python3-numpy python3-pytest python3-matplotlib
          libopenblas-openmp-dev libopenblas0-openmp googletest libgtest-dev libgmock-dev libbenchmark-dev
          libcli11-dev python3-sentencepiece python3-venv python3-pip python3-setuptools python3-wheel)
missing=()
for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Debian picks the pthread OpenBLAS when both are installed; its threads fight our OpenMP threads (measured:
# 14x slower forward on 2 cores). Select the OpenMP flavour, which runs serially inside our parallel regions.
for lib in libopenblas.so.0 libblas.so.3 liblapack.so.3 libopenblas.so; do
  target=/usr/lib/x86_64-linux-gnu/openblas-openmp/$lib
  if [ -e "$target" ] && update-alternatives --list "$lib-x86_64-linux-gnu" >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO update-alternatives --set "$lib-x86_64-linux-gnu" "$target" >/dev/null
  fi
done

export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${PATHATTN_CMAKE_ARGS:-}
cmake --build build -j"$(nproc)"
