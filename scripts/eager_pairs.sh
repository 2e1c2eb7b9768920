#!/usr/bin/env bash
# Alternated pairs of BM_EagerAddFirstCall (the median of 3 repetitions, real time): a baseline
# sjit_bench (issue 40's: a Release build of a2139f3) against a newer one, odd pairs baseline
# first (docs/performance.md, "Eager first calls: a sixth of their instructions cut").
# Usage: scripts/eager_pairs.sh NEW_SJIT_BENCH BASELINE_SJIT_BENCH [PAIRS, default 8]
set -euo pipefail
new=$1
base=$2
pairs=${3:-8}
med() { "$1" --benchmark_filter=EagerAddFirstCall --benchmark_min_time=1 --benchmark_repetitions=3 --benchmark_format=json 2>/dev/null | python3 -c "
import json,sys; d=json.load(sys.stdin)
print([b['real_time'] for b in d['benchmarks'] if b.get('aggregate_name')=='median'][0])"; }
for i in $(seq 1 $pairs); do
  if (( i % 2 )); then a=$(med $base); b=$(med $new); else b=$(med $new); a=$(med $base); fi
  python3 -c "print(f'pair $i load $(cut -d' ' -f1 /proc/loadavg): before {$a:.2f} us after {$b:.2f} us ratio {$a/$b:.2f}')"
done
