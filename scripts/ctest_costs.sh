#!/usr/bin/env bash
# Writes tests/ctest_costs.txt (ctest's cost data: "name 1 seconds", then "---") from the output of
# a ctest run, for the tests that took 2 s or more; scripts/test.sh seeds a fresh build's
# Testing/Temporary/CTestCostData.txt with it so that ctest starts the long tests first.
#   scripts/ctest_costs.sh CTEST_OUTPUT_FILE
set -euo pipefail
[[ $# == 1 && -f $1 ]] || { echo "usage: $0 CTEST_OUTPUT_FILE" >&2; exit 2; }
cd "$(dirname "$0")/.."
sed -nE 's/.*Test +#[0-9]+: ([^ ]+) \.+.* ([0-9.]+) sec.*/\1 1 \2/p' "$1" |
  awk '$3 >= 2.0' | sort -k3,3 -g -r > tests/ctest_costs.txt.tmp
echo '---' >> tests/ctest_costs.txt.tmp
mv tests/ctest_costs.txt.tmp tests/ctest_costs.txt
echo "tests/ctest_costs.txt: $(($(wc -l < tests/ctest_costs.txt) - 1)) tests"
