#!/bin/bash
# One torch lane of CI, run inside a Debian root by .ci/run (through
# scripts/debian_root.sh, the checkout at /src, results to /out):
#   torch         Debian's torch 2.x (CPU): build everything; run every test
#                 that touches torch (the rdeps of //third_party:torch and
#                 the tests tagged "torch"); then pip install
#                 --no-build-isolation . into a fresh venv and the Python
#                 tests against the installed package (JUnit: /out/pip).
#   cuda-compile  Debian's CUDA torch, NCCL and CUDA toolkit, no GPU: build
#                 everything with --config=cuda (the NCCL transport and its
#                 test among it) as C++20 (--config=cxx20: the torch releases
#                 after 2.11 need it); run the NCCL test (its GPU cases skip
#                 visibly) and every Python test on that torch (CPU, Gloo);
#                 then pip install --no-build-isolation . with the raw NCCL
#                 transport (compiled, imported; no GPU to run it).
# Writes every test.xml under /out/testlogs and /out/status (one line:
# "build=N test=N"). Exits non-zero on any failure.
set -uo pipefail
lane="${1:-}"
case "$lane" in
  torch|cuda-compile) ;;
  *) echo "torch_lane: usage: torch_lane.sh torch|cuda-compile" >&2; exit 2 ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --profile "$lane" || { echo "build=1 test=1 pip=1" >/out/status; exit 1; }
trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT

python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "python", sys.version.split()[0])'
build_status=0 test_status=0
if [[ "$lane" == torch ]]; then
  flags=()
  tests="$(bazel query --keep_going 'kind(".*_test", rdeps(//..., //third_party:torch))
      + attr(tags, "torch", tests(//...))' 2>/dev/null | sort -u)"
else
  flags=(--config=cuda --config=cxx20)
  tests="$(bazel query 'tests(//tests/python/...) + //tests/transport:nccl_transport_test' \
    2>/dev/null | sort -u)"
fi
bazel build "${flags[@]}" --keep_going //... || build_status=$?
echo "tests in this lane:"
echo "$tests" | sed 's/^/  /'
# shellcheck disable=SC2086  # one target per word
bazel test "${flags[@]}" --keep_going --nocache_test_results $tests || test_status=$?

rm -rf /out/testlogs
mkdir -p /out/testlogs
logs="$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)"
(cd "$logs" && find . -name test.xml -print0 | tar --null -T - -cf -) | tar -xf - -C /out/testlogs
# The pip build of the same checkout against this root's torch.
pip_status=0
rm -rf /out/pip
if [[ "$lane" == torch ]]; then
  bash tests/python/pip_install_check.sh --python python3 --junit /out/pip/test.xml ||
    pip_status=$?
else
  bash tests/python/pip_install_check.sh --python python3 --install-only --expect-nccl ||
    pip_status=$?
fi
echo "build=$build_status test=$test_status pip=$pip_status" >/out/status
exit $((build_status != 0 || test_status != 0 || pip_status != 0))
