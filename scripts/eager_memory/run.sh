#!/usr/bin/env bash
# Measures PyTorch's eager CPU training step (scripts/eager_memory/reference.py) on the small
# LLaMAs of tests/data/eager_memory/ and writes tests/data/eager_memory/reference.txt, which
# tests/published_runs_test.cpp (EagerReference.*) compares train-plan's peaks with.
# Needs python3-torch (Debian's, on /usr/bin/python3) and a C compiler. About a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "run.sh: $python cannot import torch (Debian: apt-get install python3-torch)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -shared -fPIC -o "$tmp/alloc_count.so" scripts/eager_memory/alloc_count.c
out=tests/data/eager_memory/reference.txt
{
  echo "# PyTorch $("$python" -c 'import torch; print(torch.__version__)') eager on the CPU, float32, one thread:"
  echo "# the most heap bytes held during the second step, less those held before the model was made"
  echo "# (scripts/eager_memory/run.sh). config batch seq remat peak_bytes held_bytes"
  for row in "a 4 256" "b 2 512" "c 2 512"; do
    set -- $row
    for remat in none full; do
      LD_PRELOAD="$tmp/alloc_count.so" "$python" scripts/eager_memory/reference.py \
        "tests/data/eager_memory/$1/config.json" "$2" "$3" "$remat" |
        "$python" -c "import json, sys; r = json.load(sys.stdin); print('$1 $2 $3 $remat', r['peak_bytes'], r['held_bytes'])"
    done
  done
} > "$tmp/reference.txt"
mv "$tmp/reference.txt" "$out"
cat "$out"
