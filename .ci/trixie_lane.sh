#!/bin/bash
# CI's torch 2.x lane, run by .ci/run inside a Debian trixie root with
# Debian's CUDA torch 2.6 (scripts/debian_root.sh --profile cuda; the
# checkout at /src, results to /out). No GPU: everything runs on the CPU,
# and the CUDA paths are compiled, linked and imported.
#   1. tests/python/pip_install_check.sh --suite --expect-nccl: pip install
#      --no-build-isolation . (as C++17, with the raw NCCL transport) into a
#      fresh venv, imported, one 4-process step, then the whole Python suite
#      against the installed package from outside the source tree: the
#      suite's one run on torch 2.6, but its tests marked torch_independent
#      (tests/python/conftest.py; the host runs them). JUnit under /out/pip.
#   2. Bazel, --config=cuda --config=cxx20 --config=asan (gcc 14, Abseil
#      20240722, Python 3.13, CUDA 12.4 headers and NCCL 2.22, as C++20,
#      ASan + UBSan with LeakSanitizer): everything built (the command line,
#      train-sim, the benchmarks) but the Python extension and what loads it
#      (step 1's pip built it from the same source list against this torch,
#      with the raw NCCL transport, as C++17: the bindings are the only files
#      not compiled as C++20); every C++ test run, its one run
#      under ASan (its assertions and memory safety; those that link LibTorch
#      against torch 2.6, and the host runs those of the code that branches
#      by torch version plain on torch 1.13), but
#      malloc_policy_test (it observes glibc's malloc, which ASan replaces:
#      the host runs it). The host runs the shell tests (train-sim's sets
#      glibc's malloc; the planner's faults and replicas exercise the
#      service; the exchange calibration loads the Python extension). JUnit
#      under /out/testlogs.
# Writes /out/status (one line: "bazel=N pip=N"). Exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --profile cuda || { echo "bazel=1 pip=1" >/out/status; exit 1; }
trap 'bazel shutdown >/dev/null 2>&1 || true' EXIT

python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda,
    "python", sys.version.split()[0])'
# The pip install and the suite first, the Bazel build and the C++ tests
# last: the last of this lane runs while the host's lanes have ended, and
# Bazel's jobs keep both cores busy where the suite keeps one and a half.
pip_status=0
rm -rf /out/pip
bash tests/python/pip_install_check.sh --python python3 --suite --expect-nccl \
  --junit /out/pip/test.xml || pip_status=$?
flags=(--config=cuda --config=cxx20 --config=asan
  --test_env=LSAN_OPTIONS="suppressions=$PWD/tests/lsan_suppressions.txt")
tests="$(bazel query 'kind(cc_test, //...) - //tests/common:malloc_policy_test' 2>/dev/null)"
[[ -n "$tests" ]] || {
  echo "bazel query found no C++ tests"; echo "bazel=1 pip=$pip_status" >/out/status; exit 1; }
echo "tests in this lane:"
echo "$tests" | sed 's/^/  /'
bazel_status=0
logs="$(bazel info "${flags[@]}" bazel-testlogs 2>/dev/null)"
rm -rf "$logs"  # Bazel's cache stays in the root: count only this run's
# Everything builds (train-sim, the benchmarks) but the Python extension and
# what loads it (the Bazel wheel, the Python tests: the host runs those),
# which pip built above from the same sources on this torch, with the raw
# NCCL transport; the C++ tests run.
extension_users="$(bazel query 'rdeps(//..., //python:knapformer/_C.so)' 2>/dev/null)"
[[ -n "$extension_users" ]] || {
  echo "bazel query found no users of the extension"; echo "bazel=1 pip=$pip_status" >/out/status
  exit 1; }
# shellcheck disable=SC2046  # one target per word
bazel build "${flags[@]}" --keep_going -- //... $(sed 's/^/-/' <<<"$extension_users") ||
  bazel_status=$?
# shellcheck disable=SC2086  # one target per word
bazel test "${flags[@]}" --keep_going --nocache_test_results $tests || bazel_status=$?
rm -rf /out/testlogs
mkdir -p /out/testlogs
(cd "$logs" && find . -name test.xml -print0 | tar --null -T - -cf -) | tar -xf - -C /out/testlogs
bazel shutdown >/dev/null 2>&1

echo "bazel=$bazel_status pip=$pip_status" >/out/status
exit $((bazel_status != 0 || pip_status != 0))
