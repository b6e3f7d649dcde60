#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole test suite, as the README and CI run it:
#   1. install Debian packages (scripts/install-deps.sh; skipped when all are present)
#   2. Release build + every ctest (unit, integration, Soft-RoCE VM)
#   3. AddressSanitizer+UBSan build + unit and integration tests
#   4. valgrind over the unit tests and a subset of the integration tests
# Environment: SC_SKIP_SANITIZE=1 / SC_SKIP_VALGRIND=1 / RDMA_SIDECAR_SKIP_VM=1 to skip stages;
# JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
jobs=${JOBS:-$(nproc)}

bash scripts/install-deps.sh

echo "== Release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
echo "== Release tests"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 900

if [[ "${SC_SKIP_SANITIZE:-0}" != 1 ]]; then
  echo "== AddressSanitizer + UBSan build"
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSANITIZE=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  echo "== Sanitizer tests (unit + integration)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 SC_TEST_SLOW=3 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -L 'unit|integration' --timeout 900
fi

if [[ "${SC_SKIP_VALGRIND:-0}" != 1 ]]; then
  echo "== valgrind (unit tests, and the daemon under a subset of integration tests)"
  fail=0
  for t in build/tests/test_*; do
    [[ -x "$t" ]] || continue
    case "$(basename "$t")" in test_nats_bus) ;; esac
    if ! valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 \
         "$t" >/dev/null 2>"build/valgrind-$(basename "$t").log"; then
      echo "valgrind: $(basename "$t") failed:"; tail -40 "build/valgrind-$(basename "$t").log"; fail=1
    fi
  done
  SC_WRAPPER="valgrind -q --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=99 --log-file=$root/build/valgrind-daemon-%p.log" \
  SC_TEST_SLOW=10 SC_BINARY=$root/build/rdma-sidecar SC_PYTHON_STUBS=$root/build/python \
    /usr/bin/python3 tests/integration/valgrind_subset.py || fail=1
  [[ $fail == 0 ]] || { echo "valgrind found problems"; exit 1; }
fi
echo "== all test stages passed"
