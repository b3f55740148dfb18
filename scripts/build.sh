#!/usr/bin/env bash
# Builds the project (Release; CUDA when nvcc is found) and runs its main job: `flashattn run`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
./build/tools/flashattn run
