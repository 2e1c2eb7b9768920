#!/usr/bin/env bash
# Installs what is missing, builds everything once (Debug, warnings as errors, AddressSanitizer +
# UBSan, in build-asan/) and runs every test there, then builds the libFuzzer targets with clang
# (build-fuzz/) and runs each for a bounded number of inputs. SHARDPLAN_ASAN=0 builds and tests
# without sanitizers (in build/), SHARDPLAN_FUZZ=0 skips the fuzzing. Under CI (CI set), each
# stage's build tree is removed once its tests have passed, so that the disk holds one build at a
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz=${SHARDPLAN_FUZZ:-1}
asan=${SHARDPLAN_ASAN:-1}
extra=()
[[ $fuzz == 1 ]] && extra=(clang libclang-rt-14-dev)
./scripts/deps.sh "${extra[@]}"
jobs=${SHARDPLAN_JOBS:-2}
base=${SHARDPLAN_BUILD_DIR:-build}
build=$base
# A clone at any path reuses what ccache holds from another (the paths in the compile lines and
# the debug information are made relative to the source tree).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
# Each stage's ctest counts are kept for the lines printed at the end: ctest counts a skipped
# test (GTEST_SKIP, e.g. a multi-process test outside mpirun) among the passed ones in its "out of
# N" line and lists it under "did not run" as "(Skipped)"; here passed, failed and skipped are
# told apart.
stages=()
passed=0 failed=0 skipped=0
run_ctest() {  # label, ctest arguments...
  local label=$1 log status=0 total f s
  shift
  log=$(mktemp)
  ctest "$@" | tee "$log" || status=$?
  total=$(sed -n 's/.*tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
  f=$(sed -n 's/.* \([0-9]*\) tests failed out of .*/\1/p' "$log" | tail -1)
  s=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' "$log" || true)
  rm -f "$log"
  total=${total:-0} f=${f:-0}
  passed=$((passed + total - f - s)) failed=$((failed + f)) skipped=$((skipped + s))
  stages+=("$label $((total - f - s)) passed, $f failed, $s skipped")
  if ((status != 0)); then
    echo "stopped after the ${label} tests"
    echo "shardplan: ${passed} passed, ${failed} failed, ${skipped} skipped"
    exit "$status"
  fi
}
# One build runs every test: Debug, warnings as errors, and (unless SHARDPLAN_ASAN=0) AddressSanitizer
# everywhere with UBSan on the library, the command and the examples (the tests' own code and the
# GEMM copies of Eigen's kernels without UBSan: SHARDPLAN_SANITIZE_TESTS in CMakeLists.txt), line
# tables only (-g1: the reports name lines; full debug information doubles some files' compile
# time). Until 2026-11-30 a plain Debug build and a sanitized one each ran the tests: a cold run of
# the three builds took longer than CI's 90 minutes.
config=(-DCMAKE_BUILD_TYPE=Debug -DSHARDPLAN_WERROR=ON)
label=Debug
if [[ $asan == 1 ]]; then
  config+=(-DSHARDPLAN_SANITIZE=address,undefined -DSHARDPLAN_SANITIZE_TESTS=address
           -DCMAKE_CXX_FLAGS_DEBUG=-g1)
  label="Debug+ASan+UBSan"
  build=$base-asan
fi
cmake -S . -B "$build" -G Ninja "${config[@]}"
cmake --build "$build" -j "$jobs"
# ctest starts the tests it knows to be long first, so that -j2 ends with short ones, not with one
# core idle beside a 5-minute example: tests/ctest_costs.txt holds the seconds each test of 2 s
# or more took in a sanitized run (scripts/ctest_costs.sh writes it from a ctest log). A build
# that has timed its own tests keeps its own figures.
costs=$build/Testing/Temporary/CTestCostData.txt
[[ -f $costs ]] || { mkdir -p "$(dirname "$costs")" && cp tests/ctest_costs.txt "$costs"; }
run_ctest "$label" --test-dir "$build" --output-on-failure -j "$jobs"
[[ -n ${CI:-} ]] && rm -rf "$build"
if [[ $fuzz == 1 ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$base-fuzz" -G Ninja -DCMAKE_BUILD_TYPE= \
    -DSHARDPLAN_BUILD_FUZZ=ON -DSHARDPLAN_BUILD_TESTS=OFF -DSHARDPLAN_BUILD_EXAMPLES=OFF \
    -DSHARDPLAN_BUILD_BENCH=OFF
  cmake --build "$base-fuzz" -j "$jobs" --target fuzz_safetensors_header fuzz_rule_file \
    fuzz_model_description fuzz_checkpoint_index fuzz_checkpoint_record fuzz_model_config \
    fuzz_trace_summary fuzz_trace_memory fuzz_stack_config fuzz_schedule_csv
  run_ctest "fuzzers" --test-dir "$base-fuzz" -L fuzz --output-on-failure -j "$jobs"
fi
printf '%s\n' "${stages[@]}"
# The last line, in the plain form a CI reads: "N passed, N failed, N skipped".
echo "shardplan: ${passed} passed, ${failed} failed, ${skipped} skipped"
