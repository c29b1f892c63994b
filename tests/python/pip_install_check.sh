#!/bin/bash
# `pip install --no-build-isolation .` from this checkout into a fresh
# virtualenv made with --system-site-packages (so that it sees the
# interpreter's torch), then the Python tests against the installed package
# from outside the source tree. Run by .ci/run on the host (bookworm) and in
# the trixie lane; also a way to check a pip install by hand.
#   bash tests/python/pip_install_check.sh [--python PY] [--junit FILE] [--warm]
#                                          [--install-only [--expect-nccl]]
#     --python  the interpreter with the trainer's torch (default /usr/bin/python3)
#     --junit   where the tests write their JUnit XML (none when the install fails)
#     --warm    install a second time, reusing the build folder, and report its time
#     --install-only  install and import, no tests (the CUDA lane: the pip build of
#               the raw NCCL transport); --expect-nccl fails unless it was built
# Prints the install's wall time; exits non-zero if the install or a test fails.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python=/usr/bin/python3 junit="" warm=0 install_only=0 expect_nccl=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python|--junit)
      [[ -n "${2:-}" ]] || { echo "pip_install_check: $1 needs a value" >&2; exit 2; }
      if [[ "$1" == --python ]]; then python="$2"; else junit="$2"; fi
      shift 2 ;;
    --warm) warm=1; shift ;;
    --install-only) install_only=1; shift ;;
    --expect-nccl) expect_nccl=1; shift ;;
    *) echo "pip_install_check: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
venv="$work/venv"
"$python" -m venv --system-site-packages "$venv" ||
  { echo "pip_install_check: no venv" >&2; exit 1; }

# The install, as a user runs it. --no-index: nothing to fetch (torch and
# the build tools are the interpreter's).
install() {
  local started=$SECONDS
  (cd "$root" && "$venv/bin/python" -m pip install --no-build-isolation --no-index --no-deps \
    --force-reinstall . >"$work/pip.log" 2>&1)
  local status=$?
  seconds=$((SECONDS - started))
  return $status
}
rm -rf "$root/build"  # cold: nothing compiled yet
if ! install; then
  tail -n 60 "$work/pip.log"
  echo "pip_install_check: pip install --no-build-isolation . failed (its log is above)"
  exit 1
fi
echo "pip install --no-build-isolation . (cold): ${seconds} s"
if [[ $warm -eq 1 ]]; then
  if ! install; then
    tail -n 40 "$work/pip.log"
    echo "pip_install_check: the warm install failed"
    exit 1
  fi
  echo "pip install --no-build-isolation . (warm, build folder kept): ${seconds} s"
fi

# Outside the source tree: the tests and the examples they run, copied.
tree="$work/tree"
mkdir -p "$tree/tests"
cp -r "$root/tests/python" "$tree/tests/python"
cp -r "$root/examples" "$tree/examples"
cd "$tree"
unset PYTHONPATH
where="$("$venv/bin/python" -c 'import knapformer, os
print(os.path.dirname(knapformer.__file__))')" ||
  { echo "pip_install_check: the installed package does not import"; exit 1; }
case "$where" in
  "$venv"/*) echo "knapformer imported from $where" ;;
  *) echo "pip_install_check: knapformer came from $where, not the venv"; exit 1 ;;
esac
"$venv/bin/python" - "$expect_nccl" <<'EOF' || exit 1
import sys

import knapformer

info = knapformer.build_info
print("build_info:", info)
assert info["built_by"] == "pip", info
if sys.argv[1] == "1":
    assert info["nccl_transport"] and knapformer._C.nccl_transport_available, \
        "the pip build of a CUDA torch left out the raw NCCL transport"
    print("raw NCCL transport: knapformer._C.NcclTransport", knapformer._C.NcclTransport)
EOF
[[ $install_only -eq 0 ]] || exit 0

# Every test of the package, but those about the Bazel build itself
# (pip_sources, pip_configure), the one comparing with the Bazel-built
# command line, which this tree does not have, and the trainer setups (FSDP,
# the example's options), which test how a trainer wraps its model, not the
# install, and take minutes (the Bazel lanes run them).
tests=()
for file in tests/python/test_*.py; do
  case "$(basename "$file")" in
    test_pip_sources.py|test_pip_configure.py|test_fsdp.py|test_train_dit_options.py) ;;
    *) tests+=("$file") ;;
  esac
done
xml="${junit:-$work/pytest.xml}"
mkdir -p "$(dirname "$xml")"
PYTHONPATH="$tree/tests/python" timeout 2400 "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  -o junit_suite_name=pip_install --junitxml="$xml" \
  --deselect tests/python/test_planner.py::test_plan_equals_the_command_line "${tests[@]}"
