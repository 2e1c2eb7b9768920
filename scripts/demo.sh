#!/usr/bin/env bash
# Installs what is missing, builds the `shardplan` command (Release) and plans the embedded
# LLaMA-2-7B-shaped model with the llama_fsdp_tp preset over fsdp:4,tp:2 (8 devices).
# Extra arguments go to `shardplan plan` (e.g. --json, --explain PATH, --model FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
# A build directory of its own: the options below (no tests, examples or benchmarks) stay out of
# build-release, which `cmake --preset release` configures with everything.
build=${SHARDPLAN_BUILD_DIR:-build-demo}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDPLAN_BUILD_TESTS=OFF \
  -DSHARDPLAN_BUILD_EXAMPLES=OFF -DSHARDPLAN_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j "${SHARDPLAN_JOBS:-2}" --target shardplan_cli
"$build/shardplan" plan --mesh fsdp:4,tp:2 "$@"
echo "(the command is $PWD/$build/shardplan)" >&2
