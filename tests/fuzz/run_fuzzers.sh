#!/bin/bash
# Builds every fuzzer under --config=fuzz and runs each for SECONDS (default
# 20) over a copy of its checked-in corpus, with ASan + UBSan. Prints each
# fuzzer's executions; exits non-zero on any crash, leak, sanitizer report
# or timeout, leaving the input under $FUZZ_ARTIFACTS (default /tmp/fuzz-artifacts).
# Runs as many fuzzers at a time as there are cores.
# Usage: tests/fuzz/run_fuzzers.sh [SECONDS] [FUZZER...]
# With FUZZ_RUNS=N each fuzzer stops after N executions (or SECONDS).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
seconds="${1:-20}"
shift || true
fuzzers=("$@")
if [[ ${#fuzzers[@]} -eq 0 ]]; then
  fuzzers=(topology_fuzzer plan_json_fuzzer request_scan_fuzzer plan_request_fuzzer
    plan_group_request_fuzzer
    plan_response_fuzzer plan_group_response_fuzzer rank_reports_fuzzer timing_csv_fuzzer)
fi
targets=()
for f in "${fuzzers[@]}"; do targets+=("//tests/fuzz:$f"); done
bazel build --config=fuzz "${targets[@]}" || exit 1
bin="$(bazel info --config=fuzz bazel-bin)/tests/fuzz"
artifacts="${FUZZ_ARTIFACTS:-/tmp/fuzz-artifacts}"
mkdir -p "$artifacts"
# One fuzzer per core at a time (each is one process).
run_one() {
  local f="$1" work log rc runs
  work="$(mktemp -d)"
  cp tests/fuzz/corpus/"$f"/* "$work"/
  log="$artifacts/$f.log"
  # -timeout: one input taking 10 s is a hang; -rss_limit_mb bounds memory.
  "$bin/$f" "$work" -max_total_time="$seconds" ${FUZZ_RUNS:+-runs="$FUZZ_RUNS"} \
    -timeout=10 -rss_limit_mb=2048 \
    -max_len=4096 -print_final_stats=1 -artifact_prefix="$artifacts/$f-" >"$log" 2>&1
  rc=$?
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')"
  if [[ $rc -ne 0 ]]; then
    echo "FUZZ FAILED: $f (exit $rc); the input is under $artifacts/$f-*:"
    grep -E "ERROR|fuzz property broken|SUMMARY|Test unit written" "$log" | head -20
  else
    echo "fuzz ok: $f: ${runs:-?} executions (at most ${seconds} s) from $(ls tests/fuzz/corpus/"$f" | wc -l) seeds, corpus grown to $(ls "$work" | wc -l)"
  fi
  rm -rf "$work"
  return $rc
}
status=0
running=()
for f in "${fuzzers[@]}"; do
  if [[ ${#running[@]} -ge $(nproc) ]]; then
    wait "${running[0]}" || status=1
    running=("${running[@]:1}")
  fi
  run_one "$f" &
  running+=($!)
done
for pid in "${running[@]}"; do wait "$pid" || status=1; done
exit $status
