#!/usr/bin/env bash
# The whole `shardplan plan --json` command (load the model JSON, plan, write the report) on the
# DeepSeek-V3-sized model (90,427 tensors, 20 rules), beside the Python reference doing the same
# work end to end (scripts/plan_reference.py --e2e), in one run; prints both and the ratio.
# Usage: scripts/bench_cli.sh [runs]   (default 5; the best run of each is compared)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
build=${SHARDPLAN_BUILD_DIR:-build-release}
if [[ -z "${SHARDPLAN_NO_BUILD:-}" ]]; then
  ./scripts/deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHARDPLAN_BUILD_TESTS=OFF \
    -DSHARDPLAN_BUILD_EXAMPLES=OFF -DSHARDPLAN_BUILD_BENCH=ON >/dev/null
  cmake --build "$build" -j 2 --target plan_bench shardplan_cli
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/bench/plan_bench" --dump-e2e "$work"
python3 - "$build/shardplan" "$work" "$runs" <<'PY'
import json, os, resource, subprocess, sys, time
exe, work, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
cpp = [exe, "plan", "--model", f"{work}/model.json", "--rules", f"{work}/rules.yaml",
       "--devices", "64", "--json"]
py = [sys.executable, "scripts/plan_reference.py", "--e2e", f"{work}/model.json",
      f"{work}/rules.json", f"{work}/out_py.json"]

def run(cmd, out):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(out, "w") as f:
        subprocess.run(cmd, stdout=f, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu

best = {"cpp": [float("inf")] * 2, "py": [float("inf")] * 2}
for _ in range(runs):  # alternate, so that both see the same load
    for name, cmd, out in (("cpp", cpp, f"{work}/out_cpp.json"), ("py", py, f"{work}/py.txt")):
        wall, cpu = run(cmd, out)
        best[name] = [min(best[name][0], wall), min(best[name][1], cpu)]
with open(f"{work}/out_cpp.json") as f:
    c = json.load(f)
with open(f"{work}/out_py.json") as f:
    p = json.load(f)
# Same tensors, same order, same decisions and bytes.
assert [l["path"] for l in c["leaves"]] == [l["path"] for l in p["leaves"]]
for a, b in zip(c["leaves"], p["leaves"]):
    assert (a["spec"], a["shard_shape"], a["bytes_per_device"]) == \
        (b["spec"], b["shard_shape"], b["bytes_per_device"]), (a, b)
assert c["total_bytes"] == p["total_bytes"]
print(f"tensors {len(c['leaves'])}; reports agree on every path, spec, shard shape and byte count")
for name, label in (("cpp", "shardplan plan --json"), ("py", "plan_reference.py --e2e")):
    print(f"{label:26} wall {best[name][0] * 1e3:8.1f} ms  cpu {best[name][1] * 1e3:8.1f} ms")
print(f"ratio (Python / C++): wall {best['py'][0] / best['cpp'][0]:.1f}x, "
      f"cpu {best['py'][1] / best['cpp'][1]:.1f}x")
PY
