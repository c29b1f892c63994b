#!/bin/bash
# The wheel installs with pip into a fresh virtualenv made with
# --system-site-packages (so that it sees the interpreter's torch), and the
# installed package works from outside the source tree
# (tests/python/installed_check.py: its files come from the venv, it plans,
# 4 Gloo processes train a step in float64 with balanced == unbalanced, and
# misuse raises the expected errors).
#   wheel_install_test.sh PYTHON WHEEL   (the interpreter it was built for)
set -euo pipefail
python="$1"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
wheel="$runfiles/$2"
venv="$TEST_TMPDIR/venv"
fail() { echo "FAIL: $*"; exit 1; }

unzip -l "$wheel" >"$TEST_TMPDIR/contents" 2>/dev/null ||
  "$python" -m zipfile -l "$wheel" >"$TEST_TMPDIR/contents"
for member in knapformer/__init__.py knapformer/_C.so knapformer-0.1.0.dist-info/RECORD; do
  grep -q "$member" "$TEST_TMPDIR/contents" || fail "the wheel lacks $member"
done

"$python" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --no-index --no-deps "$wheel" || fail "pip install refused the wheel"

cd "$TEST_TMPDIR"  # nothing of the source tree on the path
unset PYTHONPATH
# A copy, not the runfiles' path: spawned workers import the main module again.
cp "$runfiles/tests/python/installed_check.py" check_installed.py
timeout 300 "$venv/bin/python3" check_installed.py "$venv" || fail "the installed package does not work"
echo "PASS"
