#!/bin/bash
# train-sim's command line (a binary of its own, it links LibTorch): --help
# and -h print its usage and exit 0, and a mistyped option names the closest
# valid one in one line. No process is started: parsing fails or help exits
# first.
set -u
bin="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

for flag in --help -h help; do
  timeout 60 "$bin" "$flag" >"$tmp/out" 2>"$tmp/err"
  code=$?
  if [[ $code -ne 0 || -s "$tmp/err" ]]; then
    fail "help $flag: exit $code, stderr: $(cat "$tmp/err")"
  elif ! head -n 1 "$tmp/out" | grep -q "^usage: train_sim \[options\]"; then
    fail "help $flag: not the usage: $(head -n 3 "$tmp/out")"
  elif ! grep -q -- "^  --procs N .*(default 4)$" "$tmp/out" ||
       ! grep -q -- "^  --gpus-per-node N .*(default --procs)$" "$tmp/out" ||
       ! grep -q -- "^  --tflops X .*(default 0.02)$" "$tmp/out"; then
    fail "help $flag: an option or its default is missing: $(cat "$tmp/out")"
  elif awk 'length > 100 { exit 1 }' "$tmp/out"; [[ $? -ne 0 ]]; then
    fail "help $flag: lines past 100 columns: $(awk 'length > 100' "$tmp/out")"
  else
    echo "ok   help $flag"
  fi
done

# Help after other options too, even a bad one.
timeout 60 "$bin" --procs 4 --stpes 3 -h >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -eq 0 && ! -s "$tmp/err" ]] && grep -q "^usage: train_sim" "$tmp/out"; then
  echo "ok   help-beside-bad-option"
else
  fail "help-beside-bad-option: exit $code, stderr: $(cat "$tmp/err")"
fi

expect_error() {  # expect_error NAME STDERR_LINE -- args...
  local name="$1" want="$2"
  shift 3
  timeout 60 "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local code=$?
  if [[ $code -ne 2 ]]; then
    fail "$name: exit $code, expected 2; stderr: $(cat "$tmp/err")"
  elif [[ "$(cat "$tmp/err")" != "$want" ]]; then
    fail "$name: stderr is not the one line '$want': $(cat "$tmp/err")"
  else
    echo "ok   $name"
  fi
}
expect_error suggest-steps "train-sim: --stpes: unknown option (did you mean --steps?)" \
  -- --procs 4 --stpes 3
expect_error suggest-machine-flag \
  "train-sim: --intra-node-gbs: unknown option (did you mean --intra-node-gbps?)" \
  -- --intra-node-gbs 2
expect_error suggest-prefix \
  "train-sim: --plan: unknown option (did you mean --planner or --plan-ahead?)" -- --plan 1
expect_error missing-value "train-sim: --procs: missing value" -- --procs --steps 3

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
