#!/bin/bash
# deploy/docker/build.sh refuses bad arguments before it builds anything,
# naming the argument (the build itself runs in .ci/run: it needs root,
# podman and minutes).
set -uo pipefail
script="deploy/docker/build.sh"
failures=0
expect() {  # expect WHAT WANT_STATUS WANT_TEXT ARGS...
  local what="$1" want_status="$2" want_text="$3"
  shift 3
  local output status
  output="$(bash "$script" "$@" 2>&1)"
  status=$?
  if [[ $status -eq $want_status && "$output" == *"$want_text"* ]]; then
    echo "ok   $what"
  else
    echo "FAIL $what: exit $status, output: $output"
    failures=$((failures + 1))
  fi
}
expect "--help prints the usage" 0 "usage: deploy/docker/build.sh" --help
expect "an unknown argument is named" 2 "unknown argument '--bogus'" --bogus
expect "an option without its value is named" 2 "--tag needs a value" --tag
expect "an empty value is refused" 2 "--junit needs a value" --junit ""
bash -n "$script" && bash -n deploy/docker/smoke.sh || { echo "FAIL syntax"; failures=$((failures + 1)); }
echo "$failures failures"
exit $((failures > 0))
