#!/bin/bash
# bazel run -c opt //bench:python_route_bench: the benchmark with the package
# from the runfiles, under Debian's /usr/bin/python3 (python3-torch).
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}/knapformer"
export PYTHONPATH="$runfiles/python"
exec /usr/bin/python3 "$runfiles/bench/python_route_bench.py" "$@"
