#!/bin/bash
# Runs pytest on the given test files with the knapformer package (sources
# and the extension) from the runfiles, under the interpreter the package was
# built for (the first argument). Each test function is one case in Bazel's XML.
#   run_pytest.sh PYTHON TEST_FILE...
set -euo pipefail
python="$1"
shift
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="$runfiles/python:$runfiles/tests/python"
cd "$runfiles"
exec "$python" -m pytest -q -p no:cacheprovider \
  --junitxml="${XML_OUTPUT_FILE:-$TEST_TMPDIR/pytest.xml}" "$@"
