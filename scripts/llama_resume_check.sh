#!/usr/bin/env bash
# The LLaMA example saves every 10 steps, is killed with SIGKILL after its step-20 checkpoint
# and a few steps more (which the resumed run computes again), and resumes: every loss it prints (the last printed for each step, over both runs) must be the
# same text, and so the same double, as a run never stopped. Usage: llama_resume_check.sh BIN
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export SHARDPLAN_EXAMPLE_SMALL=1 SHARDPLAN_EXAMPLE_STEPS=${SHARDPLAN_EXAMPLE_STEPS:-40}
export SHARDPLAN_SAVE_EVERY=10
SHARDPLAN_CHECKPOINT_DIR="$work/full" "$bin" >"$work/full.txt"
SHARDPLAN_CHECKPOINT_DIR="$work/ckpt" "$bin" >"$work/a.txt" &
pid=$!
for _ in $(seq 1200); do
  [[ -f "$work/ckpt/step_00000020/model.safetensors.index.json" &&
     $(grep -c '^step ' "$work/a.txt") -ge 24 ]] && break
  sleep 0.05
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
SHARDPLAN_CHECKPOINT_DIR="$work/ckpt" "$bin" >"$work/b.txt"
resumed=$(sed -n 's/^resumed from step //p' "$work/b.txt")
if [[ -z "$resumed" || "$resumed" -ge "$SHARDPLAN_EXAMPLE_STEPS" ]]; then
  echo "FAILED: the second run did not resume mid-way (resumed: '${resumed}')"
  exit 1
fi
cat "$work/a.txt" "$work/b.txt" | grep '^step ' |
  awk '{last[$2] = $0} END {for (k in last) print last[k]}' | sort -n -k2 >"$work/merged.txt"
grep '^step ' "$work/full.txt" | sort -n -k2 >"$work/straight.txt"
if ! diff "$work/straight.txt" "$work/merged.txt"; then
  echo "FAILED: the resumed losses differ from the uninterrupted run's"
  exit 1
fi
echo "killed after step $(grep -c '^step ' "$work/a.txt") of $SHARDPLAN_EXAMPLE_STEPS, resumed from step $resumed: every loss is the same bits as the uninterrupted run"
