#!/bin/bash
# `pip install --no-build-isolation .` from this checkout into a fresh
# virtualenv made with --system-site-packages (so that it sees the
# interpreter's torch), as the README's Python quick start runs it; then,
# from outside the source tree, the installed package imports from the venv
# and says pip built it, and trains one step on 4 processes
# (tests/python/installed_check.py). Run by .ci/run's trixie lane (Debian's
# CUDA torch 2.6, with --suite: the Python suite's run on torch 2.6; the
# offline recipe proves pip on bookworm's torch 1.13); also a way to check
# a pip install by hand.
#   bash tests/python/pip_install_check.sh [--python PY] [--junit FILE]
#                                          [--expect-nccl] [--suite]
#     --python       the interpreter with the trainer's torch (default /usr/bin/python3)
#     --junit        each check above as a test case of FILE
#     --expect-nccl  fail unless the raw NCCL transport was built (a CUDA torch)
#     --suite        then the whole Python suite against the installed package,
#                    its test cases in suite.xml beside FILE: the suite's run on
#                    a torch that no Bazel lane runs it on (the trixie lane)
# Prints the install's wall time; exits non-zero if a check or a test fails.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python=/usr/bin/python3 junit="" expect_nccl=0 suite=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python|--junit)
      [[ -n "${2:-}" ]] || { echo "pip_install_check: $1 needs a value" >&2; exit 2; }
      if [[ "$1" == --python ]]; then python="$2"; else junit="$2"; fi
      shift 2 ;;
    --expect-nccl) expect_nccl=1; shift ;;
    --suite) suite=1; shift ;;
    *) echo "pip_install_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
results="$work/results.tsv"
: >"$results"
failures=0
check() {  # NAME STATUS MESSAGE
  local result=pass
  [[ "$2" -eq 0 ]] || { result=fail; failures=$((failures + 1)); }
  printf '%s\t%s\t%s\n' "$1" "$result" "$(printf '%s' "$3" | tr '\t\n' '  ')" >>"$results"
  echo "pip install check: $1: $result${3:+ ($3)}"
}
finish() {
  if [[ -n "$junit" ]]; then
    mkdir -p "$(dirname "$junit")"
    python3 "$root/tests/testing/checks_to_junit.py" "$results" "$junit" pip_install \
      tests.python.pip_install_check
  fi
  exit $((failures != 0 || ${1:-0} != 0))
}

venv="$work/venv"
"$python" -m venv --system-site-packages "$venv" ||
  { check makes_a_venv 1 "$python -m venv failed"; finish; }
# --no-index: nothing to fetch (torch and the build tools are the interpreter's).
rm -rf "$root/build"  # cold: nothing compiled yet
started=$SECONDS
(cd "$root" && "$venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps \
  --force-reinstall . >"$work/pip.log" 2>&1)
status=$?
[[ $status -eq 0 ]] || tail -n 60 "$work/pip.log"
check installs "$status" "pip install --no-build-isolation . in $((SECONDS - started)) s"
[[ $status -eq 0 ]] || finish

# Outside the source tree: the tests and the examples they run, copied.
tree="$work/tree"
mkdir -p "$tree/tests"
cp -r "$root/tests/python" "$root/tests/testing" "$tree/tests/"
cp -r "$root/examples" "$tree/examples"
mkdir -p "$tree/scripts"
cp "$root/scripts/replay_paper_table.sh" "$tree/scripts/"
cd "$tree"
unset PYTHONPATH
"$venv/bin/python" - "$venv" "$expect_nccl" >"$work/import.log" 2>&1 <<'EOF'
import os
import sys

import knapformer

venv, expect_nccl = sys.argv[1], sys.argv[2] == "1"
where = os.path.dirname(knapformer.__file__)
assert where.startswith(venv), f"knapformer came from {where}, not the venv"
info = knapformer.build_info
print("build_info:", info)
assert info["built_by"] == "pip", info
if expect_nccl:
    assert info["nccl_transport"] and knapformer._C.nccl_transport_available, \
        "the pip build of a CUDA torch left out the raw NCCL transport"
    print("raw NCCL transport: knapformer._C.NcclTransport", knapformer._C.NcclTransport)
EOF
status=$?
cat "$work/import.log"
check imports_from_the_venv "$status" "$(tail -n 1 "$work/import.log")"
timeout 600 "$venv/bin/python" tests/python/installed_check.py "$venv"
check trains_a_step_on_4_processes $? "tests/python/installed_check.py"

# The `knapformer` command the install put on the venv's PATH: simulate on
# a lengths file (the advice line), serve (its port file written once it
# serves; stopped by SIGTERM) and replay on the lengths file (one row).
printf '# tokens[,mask]\n4096\n1300,causal\n700\n16000\n' >"$work/lengths.txt"
"$venv/bin/knapformer" simulate --lengths "$work/lengths.txt" --samples-per-gpu 2 --world 8 \
  --steps 2 --topology g1n8,g4n2,auto >"$work/simulate.log" 2>&1
status=$?
[[ $status -ne 0 ]] || grep -q "^advice: --topology " "$work/simulate.log" || status=1
check command_simulates_lengths "$status" "$(tail -n 1 "$work/simulate.log")"
"$venv/bin/knapformer" serve --listen 127.0.0.1:0 --metrics off --port-file "$work/port" \
  >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 100); do [[ -s "$work/port" ]] && break; sleep 0.2; done
status=1
[[ -s "$work/port" ]] && kill -0 "$serve_pid" 2>/dev/null && status=0
kill -TERM "$serve_pid" 2>/dev/null
wait "$serve_pid"
check command_serves "$status" "port $(cat "$work/port" 2>/dev/null): $(tail -n 1 "$work/serve.log")"
"$venv/bin/knapformer" replay --lengths "$work/lengths.txt" --samples-per-gpu 2 --world 8 \
  --steps 1 --length-scale 16 --d-model 32 --heads 8 --topology g1n8 --gamma 1 \
  --cost-model transformer --repeat 1 --device cpu >"$work/replay.log" 2>&1
status=$?
[[ $status -ne 0 ]] || grep -q "^g1n8 .* transformer " "$work/replay.log" || status=1
check command_replays_lengths "$status" "$(tail -n 3 "$work/replay.log" | head -n 1)"
"$venv/bin/python" -m knapformer --help >"$work/help.log" 2>&1
check python_m_knapformer "$?" "$(head -n 1 "$work/help.log")"
[[ $suite -eq 1 ]] || finish

# The suite: every pytest file but the one about the Bazel build's source
# list, but the tests marked torch_independent (tests/python/conftest.py:
# Bazel runs them on the host's torch), every shell test of the package but
# the Bazel wheel's. The files
# test_pip_configure.py reads come along; python/ holds no package, so the
# venv's knapformer is the one imported.
mkdir -p "$tree/python/knapformer" "$tree/third_party"
cp "$root"/python/{pip_configure.py,package_facts.py,extension_sources.bzl,version.bzl} \
  "$tree/python/"
cp "$root/python/knapformer/_version.py" "$tree/python/knapformer/"
cp "$root/third_party/torch_probe.py" "$tree/third_party/"
cp "$root/README.md" "$root/setup.py" "$tree/"
tests=()
for file in tests/python/test_*.py; do
  [[ "$(basename "$file")" == test_extension_sources.py ]] || tests+=("$file")
done
xml="$(dirname "${junit:-$work/x}")/suite.xml"
PYTHONPATH="$tree/tests/python:$tree/python" timeout 3600 "$venv/bin/python" -m pytest -q \
  -p no:cacheprovider -o junit_suite_name=pip_suite --junitxml="$xml" -m "not torch_independent" \
  --deselect tests/python/test_planner.py::test_plan_equals_the_command_line "${tests[@]}"
suite_status=$?
# The shell tests, as Bazel runs them (their runfiles are this tree).
for test in example_test quickstart_test; do
  TEST_SRCDIR="$work" TEST_WORKSPACE=tree TEST_TMPDIR="$(mktemp -d)" \
    timeout 1200 bash "tests/python/$test.sh" "$venv/bin/python" >"$work/$test.log" 2>&1
  status=$?
  tail -n 20 "$work/$test.log"
  check "$test" "$status" "$(grep -m1 '^PASS' "$work/$test.log")"
done
finish "$suite_status"
