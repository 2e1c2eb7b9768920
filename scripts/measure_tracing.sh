#!/bin/bash
# The tracing overhead, two builds alternated (docs/performance.md, "Tracing a small step"):
#   scripts/measure_tracing.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR
# each a Release build directory holding bench/train_bench (AFTER also profiler_bench and
# kernel_bench). Prints the machine, the floor, then each binary's paired figures twice.
set -u
if [ $# -ne 2 ]; then echo "usage: $0 BEFORE_BUILD_DIR AFTER_BUILD_DIR" >&2; exit 2; fi
B=$1/bench/train_bench
N=$2/bench/train_bench
date -u; uptime; lscpu | grep "Model name"
"$2/bench/kernel_bench" --benchmark_filter='BM_Gemm_avx512/1024' 2>&1 | tail -1
"$2/bench/profiler_bench" 2>&1 | tail -4
for round in 1 2; do
  for bin in "$B" "$N"; do
    tag=$([ "$bin" = "$B" ] && echo before || echo after)
    "$bin" --benchmark_filter='SmallMlp|MlpTrainStepTracingOffOn|LlamaStepTracingOffOn' 2>&1 |
      grep -E "^BM_" | sed "s/^/$tag round $round: /"
  done
done
uptime
