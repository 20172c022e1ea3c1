#!/bin/sh
# tests/c/run.sh - run C test binaries, each in its own process with a timeout.
#
#   tests/c/run.sh [binary ...]      (default: every build/ctest/test_*)
#
# CTEST_TIMEOUT (seconds, default 1200) bounds each binary; one that runs
# over is killed and counts as failed. The sanitizers stop at the first
# report (the binaries are built with -fno-sanitize-recover=all). The last
# line is exactly "N passed, N failed", counting binaries; the exit status is
# 1 if any failed.
timeout_s=${CTEST_TIMEOUT:-1200}
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS UBSAN_OPTIONS

if [ $# -eq 0 ]; then
  set -- build/ctest/test_*
fi

passed=0
failed=0
for bin in "$@"; do
  if [ ! -x "$bin" ]; then
    echo "== $bin: not built"
    failed=$((failed + 1))
    continue
  fi
  echo "== $bin"
  start=$(date +%s)
  timeout -k 10 "$timeout_s" "$bin"
  rc=$?
  secs=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    echo "== $bin: ok (${secs} s)"
    passed=$((passed + 1))
  else
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "== $bin: FAILED (timed out after ${timeout_s} s)"
    else
      echo "== $bin: FAILED (exit status $rc, ${secs} s)"
    fi
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
