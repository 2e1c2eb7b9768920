#!/usr/bin/env python3
"""The planning algorithm written plainly in Python, as scalax's TreePathShardingRule does it:
for each path, re.search each pattern in order; the first match wins.

Usage:
  plan_reference.py WORKLOAD.json [repetitions]
      WORKLOAD.json is {"patterns": [...], "paths": [...]} (bench/plan_bench --dump-workload).
      Times the matching alone: prints the best time over the repetitions in milliseconds, and
      a checksum of the decisions.
  plan_reference.py --e2e MODEL.json RULES.json OUT.json
      What `shardplan plan --model MODEL.json --rules RULES.yaml --json > OUT.json` does, end to
      end, in one run: load the model description, turn names into paths ('.' -> '/', layers in
      numeric order), decide each tensor by re.search over the patterns, compute its shard shape
      and bytes per device, and write the JSON report (compact: Python's C encoder). RULES.json
      is {"mesh": "ep:8,...", "rules": [{"match": REGEX, "spec": [...]}]} (plan_bench
      --dump-e2e). Time it from outside (scripts/bench_cli.sh); prints the checksum.
"""
import json
import re
import sys
import time

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
            "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


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


def path_key(path):
    # Dict keys sort as strings, all-numeric keys (lists) as numbers: the tree's flatten order.
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.split("/"))


def spec_json(dims):
    return [None if not d else (d[0] if len(d) == 1 else d) for d in dims]


def e2e(model_file, rules_file, out_file):
    with open(model_file) as f:
        model = json.load(f)
    with open(rules_file) as f:
        table = json.load(f)
    axes = [a.split(":") for a in table["mesh"].split(",")]
    sizes = {name: int(size) for name, size in axes}
    devices = 1
    for s in sizes.values():
        devices *= s
    rules = [(re.compile(r["match"]), r["match"], r["spec"]) for r in table["rules"]]
    catch_all = [rx.search("") is not None for rx, _, _ in rules]
    tensors = [(name.replace(".", "/"), t) for name, t in model.items() if name != "__metadata__"]
    tensors.sort(key=lambda nt: path_key(nt[0]))
    leaves = []
    per_device = 0
    total = 0
    checksum = 0
    for path, t in tensors:
        shape, dtype = t["shape"], t["dtype"]
        entry = -1
        for i, (rx, _, _) in enumerate(rules):
            if rx.search(path) is not None:
                entry = i
                break
        if entry < 0:
            raise SystemExit(f"no rule matches '{path}'")
        checksum += entry
        dims = rules[entry][2]
        if len(dims) > len(shape):
            raise SystemExit(f"spec of rule {entry} has more entries than the rank of '{path}'")
        shard = []
        for k, n in enumerate(shape):
            div = 1
            for a in (dims[k] if k < len(dims) else []):
                div *= sizes[a]
            if n % div:
                raise SystemExit(f"dim {k} of '{path}' is not divisible by {div}")
            shard.append(n // div)
        numel = 1
        for n in shape:
            numel *= n
        shard_numel = 1
        for n in shard:
            shard_numel *= n
        item = ITEMSIZE[dtype]
        bytes_per_device = shard_numel * item
        per_device += bytes_per_device
        total += numel * item
        leaves.append({"path": path, "shape": shape, "dtype": dtype,
                       "spec": spec_json(dims), "shard_shape": shard, "bytes": numel * item,
                       "bytes_per_device": bytes_per_device, "rule": "RuleTable",
                       "rule_index": 0, "rule_path": "", "entry": entry,
                       "reason": f"matched '{rules[entry][1]}'",
                       "fell_through": catch_all[entry]})
    report = {"mesh": {"axes": [a for a, _ in axes], "shape": [int(s) for _, s in axes],
                       "devices": list(range(devices))},
              "leaves": leaves,
              "devices": [{"id": i, "bytes": per_device} for i in range(devices)],
              "total_bytes": total,
              "bytes_per_device": {"min": per_device, "max": per_device},
              "unmatched_rules": [],
              "fell_through": [l["path"] for l in leaves if l["fell_through"]]}
    # json.dumps, not json.dump: only the one-shot call uses the C encoder (json.dump to a file
    # streams through the pure-Python one, about ten times slower).
    text = json.dumps(report)
    with open(out_file, "w") as f:
        f.write(text)
        f.write("\n")
    print(f"tensors {len(leaves)} rules {len(rules)} checksum {checksum}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--e2e":
        e2e(sys.argv[2], sys.argv[3], sys.argv[4])
        return
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
