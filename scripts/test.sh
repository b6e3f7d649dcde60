#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as the README and CI run it:
#   1. install Debian packages (scripts/install-deps.sh; skipped when all are present)
#   2. Release build + every ctest (unit, integration, Soft-RoCE VM)
#   3. AddressSanitizer+UBSan build + unit and integration tests
#   4. libFuzzer targets (tests/fuzz/build-and-run.sh), SC_FUZZ_SECONDS (20) each
#   5. valgrind over the unit tests and a subset of the integration tests
# Environment: SC_SKIP_SANITIZE=1 / SC_SKIP_FUZZ=1 / SC_SKIP_VALGRIND=1 / RDMA_SIDECAR_SKIP_VM=1
# to skip stages;
# JOBS (default: nproc).
# A failing stage does not hide the stages after it: every stage runs, and the script fails at the
# end with the list of every stage that failed (and the tests that failed in it).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${JOBS:-$(nproc)}
stage_failures=()
# Records a failed stage (with the names of the failed ctest entries when a log is given).
stage_failed() {
  local what=$1 log=${2:-}
  if [[ -n "$log" && -f "$log" ]]; then
    local names; names=$(grep -E '^\s+[0-9]+ - .* \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|Not Run)' "$log" |
      sed -E 's/^\s+[0-9]+ - //' | tr '\n' ';' || true)
    [[ -z "$names" ]] || what="$what: $names"
  fi
  stage_failures+=("$what")
}

bash scripts/install-deps.sh

echo "== Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
echo "== Release tests"
passed=0; failed=0
# Adds a ctest run's counts (from its summary line) to the totals printed at the end.
count() {
  local line; line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$1" | tail -1 || true)
  [[ -n "$line" ]] || return 0
  local f t; f=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
  t=$(sed -E 's/.* tests failed out of ([0-9]+).*/\1/' <<<"$line")
  local skipped; skipped=$(grep -c '\*\*\*Skipped' "$1" || true)
  passed=$((passed + t - f - skipped)); failed=$((failed + f))
}
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900 | tee build/ctest-release.log ||
  stage_failed "Release tests" build/ctest-release.log
count build/ctest-release.log

if [[ "${SC_SKIP_SANITIZE:-0}" != 1 ]]; then
  echo "== AddressSanitizer + UBSan build"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSANITIZE=ON >/dev/null
  if cmake --build build-asan -j"$jobs"; then
    echo "== Sanitizer tests (unit + integration)"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 SC_TEST_SLOW=3 \
      ctest --test-dir build-asan --output-on-failure -j"$jobs" -L 'unit|integration' --timeout 900 |
      tee build-asan/ctest-asan.log || stage_failed "Sanitizer tests" build-asan/ctest-asan.log
    count build-asan/ctest-asan.log
  else
    stage_failed "AddressSanitizer build"; failed=$((failed + 1))
  fi
fi

if [[ "${SC_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "== fuzzing: metadata, peer frames and hello, config, key file, fast-path wire (${SC_FUZZ_SECONDS:-20} s each)"
  if sh tests/fuzz/build-and-run.sh build "${SC_FUZZ_SECONDS:-20}"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "a fuzz target crashed: see build/fuzz/artifacts/"
    stage_failed "fuzzing (see build/fuzz/artifacts/)"
  fi
fi

if [[ "${SC_SKIP_VALGRIND:-0}" != 1 ]]; then
  echo "== valgrind (unit tests, and the daemon under a subset of integration tests)"
  fail=0
  for t in build/tests/test_*; do
    [[ -x "$t" ]] || continue
    name=$(basename "$t")
    rc=0
    valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 \
      "$t" >/dev/null 2>"build/valgrind-$name.log" || rc=$?
    case $rc in
      0) echo "valgrind: $name clean"; passed=$((passed + 1)) ;;
      77) echo "valgrind: $name skipped (no device here)" ;;
      *) echo "valgrind: $name failed (exit $rc):"; tail -40 "build/valgrind-$name.log"; fail=1
         failed=$((failed + 1)) ;;
    esac
  done
  SC_WRAPPER="valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 --log-file=$root/build/valgrind-daemon-%p.log" \
  SC_TEST_SLOW=10 SC_BINARY=$root/build/rdma-sidecar SC_PYTHON_STUBS=$root/build/python \
  SC_FAKE_CUDA=$root/build/tests/libsc_fake_cuda.so \
    /usr/bin/python3 tests/integration/valgrind_subset.py || { fail=1; failed=$((failed + 1)); }
  [[ $fail == 1 ]] || passed=$((passed + 1))
  [[ $fail == 0 ]] || { echo "valgrind found problems"; stage_failed "valgrind"; }
fi
if ((${#stage_failures[@]})); then
  echo "== ${#stage_failures[@]} test stage(s) failed:"
  printf '  - %s\n' "${stage_failures[@]}"
  echo "$passed passed, $failed failed"
  exit 1
fi
echo "== all test stages passed"
echo "$passed passed, $failed failed"
