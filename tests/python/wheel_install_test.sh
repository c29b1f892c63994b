#!/bin/bash
# The wheel installs with pip into a fresh virtualenv made with
# --system-site-packages (so that it sees the interpreter's torch), and the
# installed package works from outside the source tree
# (tests/python/installed_check.py: its files come from the venv, it plans,
# 4 Gloo processes train a step in float64 with balanced == unbalanced, and
# misuse raises the expected errors), its METADATA declares the torch
# major.minor it was built against, and its `knapformer` command runs.
#   wheel_install_test.sh PYTHON WHEEL   (the interpreter it was built for)
set -euo pipefail
python="$1"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
wheel="$runfiles/$2"
venv="$TEST_TMPDIR/venv"
fail() { echo "FAIL: $*"; exit 1; }

unzip -l "$wheel" >"$TEST_TMPDIR/contents" 2>/dev/null ||
  "$python" -m zipfile -l "$wheel" >"$TEST_TMPDIR/contents"
for member in knapformer/__init__.py knapformer/_C.so knapformer/gpu_check/__main__.py \
    knapformer/bin/knapformer knapformer-0.1.0.dist-info/RECORD \
    knapformer-0.1.0.dist-info/entry_points.txt; do
  grep -q "$member" "$TEST_TMPDIR/contents" || fail "the wheel lacks $member"
done

"$python" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --no-index --no-deps "$wheel" || fail "pip install refused the wheel"

cd "$TEST_TMPDIR"  # nothing of the source tree on the path
unset PYTHONPATH

# METADATA declares the torch release the extension was built against (its
# major.minor, as the import check compares them; pre-releases and local
# labels of it included) and matplotlib for the "plot" extra.
"$venv/bin/python3" - "$wheel" <<'EOF' || fail "the wheel's METADATA lacks its requirements"
import email.parser
import sys
import zipfile

import torch
from knapformer import _C
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.version import Version

with zipfile.ZipFile(sys.argv[1]) as wheel:
    metadata = email.parser.Parser().parsestr(
        wheel.read("knapformer-0.1.0.dist-info/METADATA").decode(), headersonly=True)
requires = [Requirement(line) for line in metadata.get_all("Requires-Dist", [])]
torch_req = [r for r in requires if r.name == "torch"]
assert len(torch_req) == 1 and torch_req[0].marker is None, [str(r) for r in requires]
spec = torch_req[0].specifier
built = _C.__torch_version__  # the build's torch (@local_torch's TORCH_VERSION)
major, minor = (int(v) for v in built.split("+")[0].split(".")[:2])
inside = [built, torch.__version__, f"{major}.{minor}", f"{major}.{minor}.0a0",
          f"{major}.{minor}.0.dev20250101", f"{major}.{minor}.9+cu999"]
outside = [f"{major}.{minor + 1}.0", f"{major}.{minor + 1}.0a0", f"{major}.{minor + 1}.0.dev1",
           f"{major + 1}.{minor}.0"] + ([f"{major}.{minor - 1}.9"] if minor > 0 else [])
for version in inside:
    assert spec.contains(Version(version), prereleases=True), (str(spec), version)
for version in outside:
    assert not spec.contains(Version(version), prereleases=True), (str(spec), version)
assert metadata.get_all("Provides-Extra") == ["plot"], metadata.get_all("Provides-Extra")
plot = [r for r in requires if r.name == "matplotlib"]
assert len(plot) == 1 and plot[0].marker is not None, [str(r) for r in requires]
assert plot[0].marker.evaluate({"extra": "plot"}), str(plot[0])
assert not plot[0].marker.evaluate({"extra": ""}), str(plot[0])
print(f"Requires-Dist: {', '.join(str(r) for r in requires)}; torch {built} (built), "
      f"{torch.__version__} (here)")
EOF
# pip check: the interpreter's torch meets the requirement where its
# distribution is registered (Debian's python3-torch is, as
# 1.13.0a0+gitunknown); complaints about other packages are not the wheel's.
"$venv/bin/pip" check >"$TEST_TMPDIR/pip_check" 2>&1 || true
sed 's/^/pip check: /' "$TEST_TMPDIR/pip_check"
if grep -qi "knapformer" "$TEST_TMPDIR/pip_check"; then
  fail "pip check reports knapformer's requirements unmet"
fi
# The `knapformer` command the install put on the venv's PATH: the command
# line (simulate's advice) and replay, as a pip install has them.
"$venv/bin/knapformer" simulate --data mixed-res --world 32 --steps 1 --topology g1n32,auto \
  >simulate.log 2>&1 || { cat simulate.log; fail "knapformer simulate failed"; }
grep -q "^advice: --topology " simulate.log || { cat simulate.log; fail "simulate gave no advice"; }
"$venv/bin/knapformer" replay --help >replay.log 2>&1 || { cat replay.log; fail "knapformer replay --help failed"; }
# A copy, not the runfiles' path: spawned workers import the main module again.
cp "$runfiles/tests/python/installed_check.py" check_installed.py
timeout 300 "$venv/bin/python3" check_installed.py "$venv" || fail "the installed package does not work"
echo "PASS"
