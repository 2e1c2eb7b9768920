#!/usr/bin/env bash
# Builds the planning benchmark (Release) and runs it beside the Python reference on the same
# paths and patterns, then prints the ratio. Usage: scripts/bench_plan.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
build=${SHARDPLAN_BUILD_DIR:-build-release}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDPLAN_BUILD_TESTS=OFF \
  -DSHARDPLAN_BUILD_EXAMPLES=OFF -DSHARDPLAN_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j 2 --target plan_bench
workload=$(mktemp --suffix=.json)
trap 'rm -f "$workload"' EXIT
"$build/bench/plan_bench" --dump-workload "$workload"
"$build/bench/plan_bench" --benchmark_format=console | tee /tmp/plan_bench.txt
python3 scripts/plan_reference.py "$workload" 5 | tee /tmp/plan_reference.txt
python3 - <<'PY'
import re
bench = open("/tmp/plan_bench.txt").read()
ref = float(re.search(r"python_reference_ms ([0-9.]+)", open("/tmp/plan_reference.txt").read()).group(1))
for name in ("BM_Plan", "BM_Match", "BM_Resolve", "BM_ResolveUnshared", "BM_RuleApplyOnly",
             "BM_BoostRegexOnly"):
    m = re.search(name + r"(?:/\S*)?\s+([0-9.]+) ms", bench)
    if m:
        t = float(m.group(1))
        print(f"{name}: {t:.3f} ms, {ref / t:.1f}x faster than the Python reference ({ref:.1f} ms)")
PY
