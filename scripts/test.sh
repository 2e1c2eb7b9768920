#!/usr/bin/env bash
# Installs what is missing, builds everything (Debug, warnings as errors) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
build=${SHARDPLAN_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSHARDPLAN_WERROR=ON
cmake --build "$build" -j "${SHARDPLAN_JOBS:-2}"
ctest --test-dir "$build" --output-on-failure -j "${SHARDPLAN_JOBS:-2}"
