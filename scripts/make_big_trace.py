#!/usr/bin/env python3
"""Writes a large trace in the profiler's format (docs/performance.md, "Reading a large trace"):
kernels, collectives, waits and live-bytes counters on 8 devices, with a "memory peak" event (a
run of tests/data/traces/memory.trace.json) every 20,000 events, to about SIZE megabytes.

    scripts/make_big_trace.py OUT.json [SIZE_MB]
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    out = sys.argv[1]
    target = int(float(sys.argv[2] if len(sys.argv) > 2 else 78) * 1e6)
    with open(os.path.join(HERE, "..", "tests", "data", "traces", "memory.trace.json")) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    peak = next(e for e in events if e.get("name") == "memory peak")
    rng = random.Random(0)
    ops = ["dot_general", "tanh", "add", "reduce_sum", "exp", "multiply"]
    scopes = ["mlp/up", "mlp/down", "attention/qkv", "attention/out", "head"]
    written = 0
    n = 0
    ts = 0.0
    with open(out, "w") as f:
        f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        for d in range(8):
            f.write(json.dumps({"name": "thread_name", "ph": "M", "pid": 0, "tid": d,
                                "args": {"name": f"device {d}"}}) + ",\n")
        while written < target:
            d = n % 8
            r = n % 5
            if n % 20000 == 19999:
                e = dict(peak, ts=round(ts, 3), tid=0)
            elif r < 3:
                op = ops[rng.randrange(len(ops))]
                e = {"name": op, "cat": "kernel", "ph": "X", "ts": round(ts, 3),
                     "dur": round(rng.uniform(1, 50), 3), "pid": 0, "tid": d,
                     "args": {"op": op, "scope": scopes[rng.randrange(len(scopes))]}}
            elif r == 3:
                e = {"name": "all_gather", "cat": "collective", "ph": "X", "ts": round(ts, 3),
                     "dur": round(rng.uniform(1, 80), 3), "pid": 0, "tid": d,
                     "args": {"kind": "all_gather", "bytes": rng.randrange(1 << 24),
                              "peers": [p for p in range(8) if p != d]}}
            else:
                e = {"name": "live bytes, device %d" % d, "cat": "memory", "ph": "C",
                     "ts": round(ts, 3), "pid": 0, "tid": d,
                     "args": {"bytes": rng.randrange(1 << 30), "planned": rng.randrange(1 << 30)}}
            line = json.dumps(e) + ",\n"
            f.write(line)
            written += len(line)
            ts += 0.5
            n += 1
        f.write(json.dumps({"name": "tanh", "cat": "kernel", "ph": "X", "ts": ts, "dur": 1,
                            "pid": 0, "tid": 0}) + "\n]}\n")
    print(f"{out}: {os.path.getsize(out)} bytes, {n + 9} events")


if __name__ == "__main__":
    main()
