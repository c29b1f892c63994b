#!/bin/bash
# The torch and CUDA the build cannot work with are refused when the build is
# configured (third_party/torch_configure.bzl, cuda_configure.bzl), with a
# message naming the cause: each case points --repo_env=KNAPFORMER_PYTHON at a
# stand-in interpreter that answers the probe as such a torch would, and
# checks that `bazel build` fails with that message before compiling
# anything. Bazel runs here (not as a bazel test: the checks drive Bazel
# itself), in this checkout's workspace; .ci/run calls it.
#   tests/tools/torch_configure_checks.sh [--junit FILE]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
junit=""
if [[ "${1:-}" == "--junit" ]]; then
  [[ -n "${2:-}" ]] || { echo "torch_configure_checks: --junit needs a file" >&2; exit 2; }
  junit="$2"
elif [[ $# -gt 0 ]]; then
  echo "torch_configure_checks: unknown argument '$1' (usage: [--junit FILE])" >&2
  exit 2
fi
cd "$root"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
results="$work/results.tsv"
: >"$results"

# A stand-in interpreter: prints the real probe's answer with `edit` (a
# Python expression over `facts`) applied.
stand_in() {
  local name="$1" edit="$2"
  cat >"$work/$name" <<EOF
#!/bin/bash
exec /usr/bin/python3 - "\$@" <<'PY'
import json, runpy, sys, io, contextlib
out = io.StringIO()
with contextlib.redirect_stdout(out):
    sys.argv = ["torch_probe.py"]
    runpy.run_path("$root/third_party/torch_probe.py", run_name="__main__")
line = [l for l in out.getvalue().splitlines() if l.startswith("KNAPFORMER_PROBE ")][-1]
facts = json.loads(line[len("KNAPFORMER_PROBE "):])
$edit
print("KNAPFORMER_PROBE " + json.dumps(facts))
PY
EOF
  chmod +x "$work/$name"
  echo "$work/$name"
}

# check NAME EXPECTED_MESSAGE PYTHON [BAZEL FLAGS...]: the build must fail
# and its output name the cause.
check() {
  local name="$1" expected="$2" python="$3"
  shift 3
  local out="$work/$name.log" status=0
  bazel build --noshow_progress --repo_env=KNAPFORMER_PYTHON="$python" "$@" >"$out" 2>&1 ||
    status=$?
  if [[ $status -ne 0 ]] && grep -qF -- "$expected" "$out"; then
    printf '%s\tpass\t\n' "$name" >>"$results"
    echo "PASS $name"
  else
    local why
    why="exit $status; expected '$expected' in:"
    why+=" $(grep -m3 -E 'ERROR|Error|knapformer' "$out" | tr '\t\n' '  ')"
    printf '%s\tfail\t%s\n' "$name" "$why" >>"$results"
    echo "FAIL $name: $why"
  fi
}

torch_target=//transport:c10d_transport
check "an old-ABI torch is refused" "was built with the old C++ string ABI" \
  "$(stand_in old_abi 'facts["torch"]["cxx11_abi"] = False
facts["torch"]["full_version"] = "2.5.1+cu121"')" \
  "$torch_target"
check "an interpreter without torch is refused" "cannot import torch (ModuleNotFoundError" \
  "$(stand_in no_torch 'facts["torch"] = None
facts["torch_error"] = "ModuleNotFoundError: No module named torch"')" \
  "$torch_target"
check "a torch older than 1.13 is refused" "torch 1.12.1 is older than 1.13" \
  "$(stand_in old_torch 'facts["torch"]["version"] = "1.12.1"
facts["torch"]["full_version"] = "1.12.1"')" \
  "$torch_target"
check "a torch without Gloo is refused" "without torch.distributed or without Gloo" \
  "$(stand_in no_gloo 'facts["torch"]["gloo"] = False')" \
  "$torch_target"
check "a torch without pybind11 headers is refused" "no pybind11 headers" \
  "$(stand_in no_pybind11 'facts["torch"]["pybind11_include"] = None')" \
  "$torch_target"
check "a missing interpreter is refused" "no such file" "$work/no_such_python" "$torch_target"
if [[ -d /usr/local/cuda-13.0 ]]; then
  check "a CUDA torch of another CUDA major than the toolkit is refused" \
    "is built for CUDA 11.8, but the CUDA toolkit found" \
    "$(stand_in cuda11 'facts["torch"]["cuda"] = "11.8"')" \
    --config=cuda --repo_env=CUDA_HOME=/usr/local/cuda-13.0 //transport:nccl_transport
fi
# Back to the default interpreter: the next build configures torch again.
bazel build --noshow_progress "$torch_target" >/dev/null 2>&1 ||
  echo "torch_configure_checks: the default build of $torch_target failed afterwards" >&2

if [[ -n "$junit" ]]; then
  mkdir -p "$(dirname "$junit")"
  python3 tests/testing/checks_to_junit.py "$results" "$junit" torch_configure \
    tests.tools.torch_configure_checks
fi
failures="$(grep -c $'\tfail\t' "$results")"
echo "torch configure checks: $(grep -c $'\tpass\t' "$results") passed, $failures failed"
[[ $failures -eq 0 ]]
