#!/bin/bash
# The offline recipe of docs/development.md, proven: run by .ci/run inside a
# Debian root made with `scripts/setup.sh --profile trainer` (torch, a
# compiler, pip's build tools; none of gRPC, Abseil, prometheus-cpp,
# nlohmann-json, protoc or pkg-config) with no network
# (scripts/debian_root.sh --offline). The packages carried on the host
# (scripts/carry_packages.sh download) are at CARRIED.
#   offline_recipe_check.sh CARRIED JUNIT
# Each check is a test case of JUNIT (tests/testing/checks_to_junit.py);
# exits non-zero if one fails.
set -uo pipefail
carried="$1" junit="$2"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
work="$(mktemp -d)"
results="$work/results"
: >"$results"
check() {  # NAME STATUS MESSAGE
  local result=pass
  [[ "$2" -eq 0 ]] || result=fail
  printf '%s\t%s\t%s\n' "$1" "$result" "$3" >>"$results"
  echo "offline recipe: $1: $result${3:+ ($3)}"
}

# The premise: nothing of what is carried is installed here, and nothing
# outside the machine answers.
present=""
for package in libgrpc++-dev libabsl-dev prometheus-cpp-dev nlohmann-json3-dev \
    protobuf-compiler protobuf-compiler-grpc pkgconf pkg-config; do
  if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    present+=" $package"
  fi
done
check root_lacks_the_carried_packages "$([[ -z "$present" ]]; echo $?)" "${present:+installed:$present}"
offline=0
python3 -c 'import socket; socket.create_connection(("deb.debian.org", 80), timeout=5)' \
  >/dev/null 2>&1 && offline=1
check no_network "$offline" "$([[ $offline -eq 0 ]] || echo 'deb.debian.org answered')"

# The recipe's one command: unpack, build against this torch, run the GPU
# check (a dry run here: no GPU).
prefix="$work/deps"
started=$SECONDS
bash scripts/gpu_check.sh --packages "$carried" --prefix "$prefix" --venv "$work/venv" \
  -- --dry-run --json "$work/gpu_check.json" >"$work/recipe.log" 2>&1
status=$?
tail -n 30 "$work/recipe.log"
check recipe_installs_and_runs_the_check "$status" \
  "exit $status after $((SECONDS - started)) s; $(grep -m1 'installed in' "$work/recipe.log")"
grep -qi "no GPU" "$work/recipe.log"
check gpu_check_says_no_gpu $? "the dry run's output names the missing GPU"

# Installed from the carried packages, loading them from the prefix by its
# rpath (no LD_LIBRARY_PATH), and working: 4 processes train a step.
python="$work/venv/bin/python"
extension="$("$python" -c 'import knapformer._C as c; print(c.__file__)' 2>"$work/import.err")"
check imports_without_ld_library_path $? "$(tail -n 1 "$work/import.err")"
grpc="$(ldd "$extension" 2>/dev/null | awk '/libgrpc\+\+\.so/{print $3}')"
[[ "$grpc" == "$prefix"/* ]]
check links_the_carried_grpc $? "libgrpc++ resolved to '${grpc:-nothing}'"
missing="$(ldd "$extension" 2>/dev/null | grep -c 'not found')"
check every_library_resolves "$([[ "$missing" -eq 0 ]]; echo $?)" "$missing not found"
cp tests/python/installed_check.py "$work/check_installed.py"
(cd "$work" && unset PYTHONPATH && timeout 300 "$python" check_installed.py "$work/venv") \
  >"$work/installed.log" 2>&1
status=$?
tail -n 5 "$work/installed.log"
check installed_package_trains_a_step "$status" "tests/python/installed_check.py exit $status"

mkdir -p "$(dirname "$junit")"
python3 tests/testing/checks_to_junit.py "$results" "$junit" offline_recipe offline_recipe
! grep -q $'\tfail\t' "$results"
