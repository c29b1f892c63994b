#!/bin/bash
# One torch lane of CI, run inside a Debian root by .ci/run (through
# scripts/debian_root.sh, the checkout at /src, results to /out):
#   torch         Debian's torch 2.x (CPU): build everything; run every test
#                 that touches torch (the rdeps of //third_party:torch and
#                 the tests tagged "torch").
#   cuda-compile  Debian's CUDA torch, NCCL and CUDA toolkit, no GPU: build
#                 the NCCL transport, its test and the Python extension with
#                 --config=cuda, as C++20 (--config=cxx20: the next torch
#                 releases need it); run the NCCL test (its GPU cases skip
#                 visibly) and the Python tests on that torch (CPU, Gloo).
# Writes every test.xml under /out/testlogs and /out/status (one line:
# "build=N test=N"). Exits non-zero on any failure.
set -uo pipefail
lane="${1:-}"
case "$lane" in
  torch|cuda-compile) ;;
  *) echo "torch_lane: usage: torch_lane.sh torch|cuda-compile" >&2; exit 2 ;;
esac
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --profile "$lane" || { echo "build=1 test=1" >/out/status; exit 1; }
trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT

python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "python", sys.version.split()[0])'
build_status=0 test_status=0
if [[ "$lane" == torch ]]; then
  flags=()
  bazel build "${flags[@]}" --keep_going //... || build_status=$?
  tests="$(bazel query --keep_going 'kind(".*_test", rdeps(//..., //third_party:torch))
      + attr(tags, "torch", tests(//...))' 2>/dev/null | sort -u)"
else
  flags=(--config=cuda --config=cxx20)
  targets=(//transport:nccl_transport //tests/transport:nccl_transport_test //python:wheel)
  bazel build "${flags[@]}" --keep_going "${targets[@]}" || build_status=$?
  tests="$(printf '%s\n' //tests/transport:nccl_transport_test //tests/python:sequence_balancer_test \
    //tests/python:planner_test //tests/python:agreed_errors_test)"
fi
echo "tests in this lane:"
echo "$tests" | sed 's/^/  /'
# shellcheck disable=SC2086  # one target per word
bazel test "${flags[@]}" --keep_going --nocache_test_results $tests || test_status=$?

rm -rf /out/testlogs
mkdir -p /out/testlogs
logs="$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)"
(cd "$logs" && find . -name test.xml -print0 | tar --null -T - -cf -) | tar -xf - -C /out/testlogs
echo "build=$build_status test=$test_status" >/out/status
exit $((build_status != 0 || test_status != 0))
