#!/usr/bin/env python3
"""The profiler's off path against a build without it ("none when off", issue 29).

Runs the same train_bench steps from two Release builds alternately, round by round: BIN_ON was
built with the profiler (the default) and runs with it off; BIN_NONE was configured with
-DSHARDPLAN_PROFILER=OFF, so every recording branch is compiled out. Each round runs each
benchmark once in each binary (the order alternating between rounds); the figures are each
binary's median step time over the rounds and the median of the per-round ratios.

Usage: bench/profiler_off_vs_none.py BIN_ON BIN_NONE [ROUNDS]
"""
import json
import statistics
import subprocess
import sys

BENCHES = ["BM_MlpTrainStep8Devices", "BM_LlamaStepFsdpTp"]


def step_ms(binary, bench):
    out = subprocess.run(
        [binary, f"--benchmark_filter=^{bench}/",
         "--benchmark_format=json"], check=True, capture_output=True, text=True).stdout
    runs = [b for b in json.loads(out)["benchmarks"] if b["name"].startswith(bench + "/")]
    if len(runs) != 1:
        sys.exit(f"{binary}: expected one result for {bench}, got {len(runs)}")
    return runs[0]["real_time"]  # the benchmarks report milliseconds


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    bin_on, bin_none = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) == 4 else 8
    for bench in BENCHES:
        on, none, ratio = [], [], []
        for r in range(rounds):
            if r % 2 == 0:
                a = step_ms(bin_on, bench)
                b = step_ms(bin_none, bench)
            else:
                b = step_ms(bin_none, bench)
                a = step_ms(bin_on, bench)
            on.append(a)
            none.append(b)
            ratio.append(a / b)
        print(f"{bench}: with the profiler, off {statistics.median(on):.2f} ms; "
              f"without it {statistics.median(none):.2f} ms; median ratio "
              f"{statistics.median(ratio):.4f} (min {min(ratio):.4f}, max {max(ratio):.4f}, "
              f"{rounds} rounds)")


if __name__ == "__main__":
    main()
