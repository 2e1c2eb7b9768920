#!/usr/bin/env python3
"""The planning algorithm written plainly in Python, as scalax's TreePathShardingRule does it:
for each path, re.search each pattern in order; the first match wins.

Usage: plan_reference.py WORKLOAD.json [repetitions]
WORKLOAD.json is {"patterns": [...], "paths": [...]} (bench/plan_bench --dump-workload).
Prints the best time over the repetitions in milliseconds, and a checksum of the decisions.
"""
import json
import re
import sys
import time


def plan(patterns, paths):
    compiled = [re.compile(p) for p in patterns]
    decisions = []
    for path in paths:
        chosen = -1
        for i, rx in enumerate(compiled):
            if rx.search(path) is not None:
                chosen = i
                break
        decisions.append(chosen)
    return decisions


def main():
    workload = json.load(open(sys.argv[1]))
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    patterns, paths = workload["patterns"], workload["paths"]
    best = float("inf")
    decisions = []
    for _ in range(reps):
        start = time.perf_counter()
        decisions = plan(patterns, paths)
        best = min(best, time.perf_counter() - start)
    print(f"python_reference_ms {best * 1e3:.2f}")
    print(f"paths {len(paths)} patterns {len(patterns)} checksum {sum(decisions)}")


if __name__ == "__main__":
    main()
