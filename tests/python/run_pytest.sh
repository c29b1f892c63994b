#!/bin/bash
# Runs pytest on the given test files with the knapformer package (sources
# and the extension) from the runfiles; Debian's /usr/bin/python3 is the one
# that sees python3-torch. Each test function is one case in Bazel's XML.
set -euo pipefail
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="$runfiles/python:$runfiles/tests/python"
cd "$runfiles"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider \
  --junitxml="${XML_OUTPUT_FILE:-$TEST_TMPDIR/pytest.xml}" "$@"
