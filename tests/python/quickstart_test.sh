#!/bin/bash
# The README's Python quick start as a new user runs it: the script shown is
# examples/quickstart.py line for line (after its docstring), and the command
# shown (with this test's interpreter for the venv's) runs it on 4 CPU
# processes, every rank reporting the balanced block equal to the unbalanced.
#   quickstart_test.sh PYTHON
set -euo pipefail
python="$1"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="$runfiles/python"
cd "$runfiles"
fail() { echo "FAIL: $*"; exit 1; }

# The ```python block and the launcher line of the section.
section="$(sed -n '/^## Python quick start/,/^## /p' README.md)"
shown="$(printf '%s\n' "$section" | sed -n '/^```python$/,/^```$/p' | sed '1d;$d')"
script="$(sed -n '/^import torch$/,$p' examples/quickstart.py)"
[[ -n "$shown" ]] || fail "no python block in the README's Python quick start"
if [[ "$shown" != "$script" ]]; then
  diff <(printf '%s\n' "$shown") <(printf '%s\n' "$script") || true
  fail "the README's script is not examples/quickstart.py"
fi
command_line="$(printf '%s\n' "$section" | grep -m1 -- '-m knapformer.launch' || true)"
[[ "$command_line" == /opt/kf/bin/python3\ * ]] || fail "no launcher line: '$command_line'"
read -r -a words <<<"${command_line#/opt/kf/bin/python3 }"
echo "running: $python ${words[*]}"
out="$TEST_TMPDIR/quickstart.log"
status=0
timeout 300 "$python" "${words[@]}" >"$out" 2>&1 || status=$?
cat "$out"
[[ $status -eq 0 ]] || fail "the quick start exited $status"
for rank in 0 1 2 3; do
  grep -q "rank $rank: the balanced block equals the unbalanced one" "$out" ||
    fail "rank $rank did not report"
done
grep -q "max/mean 3.0318 ---> 1.0000" "$out" || fail "print_imbalance's line changed"
echo "PASS"
