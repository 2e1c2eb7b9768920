#!/usr/bin/env bash
# Installs what is missing, builds everything (Debug, warnings as errors) and runs every test,
# then builds it again with AddressSanitizer + UBSan (the asan preset's settings, in build-asan/)
# and runs every test there, then builds the libFuzzer targets with clang and runs each for a
# bounded number of inputs. SHARDPLAN_ASAN=0 skips the sanitized run, SHARDPLAN_FUZZ=0 the fuzzing.
# Under CI (CI set), each stage's build tree is removed once its tests have passed, so that the
# disk holds one build at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz=${SHARDPLAN_FUZZ:-1}
asan=${SHARDPLAN_ASAN:-1}
extra=()
[[ $fuzz == 1 ]] && extra=(clang libclang-rt-14-dev)
./scripts/deps.sh "${extra[@]}"
jobs=${SHARDPLAN_JOBS:-2}
build=${SHARDPLAN_BUILD_DIR:-build}
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
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSHARDPLAN_WERROR=ON
cmake --build "$build" -j "$jobs"
run_ctest "Debug" --test-dir "$build" --output-on-failure -j "$jobs"
[[ -n ${CI:-} ]] && rm -rf "$build"
if [[ $asan == 1 ]]; then
  cmake -S . -B "$build-asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSHARDPLAN_WERROR=ON \
    -DSHARDPLAN_SANITIZE=address,undefined -DSHARDPLAN_BUILD_BENCH=OFF
  cmake --build "$build-asan" -j "$jobs"
  # Left to the Debug stage, the slowest runs under the sanitizers whose code runs sanitized
  # elsewhere: the four-process runs of the multi-process suites (the same code runs over two
  # processes, mpi.np2.*), the single-process character-LLaMA example (mpi.np2.example.llama_char
  # runs it sanitized) and the published-runs table (planning, as the train-plan tests).
  run_ctest "ASan+UBSan" --test-dir "$build-asan" --output-on-failure -j "$jobs" \
    -E '^mpi\.np4\.|^example\.llama_char|^PublishedRuns\.'
  [[ -n ${CI:-} ]] && rm -rf "$build-asan"
fi
if [[ $fuzz == 1 ]]; then
  CC=clang CXX=clang++ cmake -S . -B "$build-fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSHARDPLAN_BUILD_FUZZ=ON -DSHARDPLAN_BUILD_TESTS=OFF -DSHARDPLAN_BUILD_EXAMPLES=OFF \
    -DSHARDPLAN_BUILD_BENCH=OFF
  cmake --build "$build-fuzz" -j "$jobs" --target fuzz_safetensors_header fuzz_rule_file \
    fuzz_model_description fuzz_checkpoint_index fuzz_checkpoint_record fuzz_model_config \
    fuzz_trace_summary fuzz_trace_memory fuzz_stack_config
  run_ctest "fuzzers" --test-dir "$build-fuzz" -L fuzz --output-on-failure -j "$jobs"
fi
printf '%s\n' "${stages[@]}"
# The last line, in the plain form a CI reads: "N passed, N failed, N skipped".
echo "shardplan: ${passed} passed, ${failed} failed, ${skipped} skipped"
