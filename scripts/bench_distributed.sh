#!/usr/bin/env bash
# The process group's all-reduce and all-gather against Open MPI's MPI_Allreduce/MPI_Allgather
# on the same bytes, 2 processes on this machine (shared memory), one run.
# Usage: scripts/bench_distributed.sh [processes]   (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
np=${1:-2}
build=${SHARDPLAN_BUILD_DIR:-build-release}
if [[ -z "${SHARDPLAN_NO_BUILD:-}" ]]; then
  ./scripts/deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDPLAN_BUILD_TESTS=OFF \
    -DSHARDPLAN_BUILD_EXAMPLES=OFF -DSHARDPLAN_BUILD_BENCH=ON >/dev/null
  cmake --build "$build" -j 2 --target distributed_bench
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lscpu | grep 'Model name' || true
mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader \
  --mca btl_vader_single_copy_mechanism none -np "$np" "$build/bench/distributed_bench"
