#!/bin/bash
# scripts/knapformer and the profiles of scripts/setup.sh it uses. Bazel
# cannot run inside a Bazel test (the server's output base is locked, and a
# nested one would build everything cold), and apt-get needs root and a
# network: so scripts/knapformer runs here from a copy of the repository
# with a stand-in setup.sh next to it and a stand-in `bazel` on PATH that
# prints Bazel's chatter and "builds" a stand-in binary; setup.sh runs with
# stand-in dpkg-query, apt-get and id.
set -u
script="$1"
setup="$2"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $1"; failures=$((failures + 1)); }

repo="$tmp/repo"
mkdir -p "$repo/scripts" "$tmp/bin"
cp "$script" "$repo/scripts/knapformer"
cat >"$repo/scripts/setup.sh" <<'SH'
echo "$*" >>"$CALLS/setup"
exit "${FAKE_SETUP_EXIT:-0}"
SH
cat >"$tmp/bin/bazel" <<'SH'
#!/bin/bash
echo "$*" >>"$CALLS/bazel"
echo "INFO: Invocation ID: 0c5a0d6e"
echo "Loading: 0 packages loaded" >&2
echo "INFO: Analyzed target (0 packages loaded, 0 targets configured)." >&2
sleep "${FAKE_BAZEL_SECONDS:-0}"
if [[ "${FAKE_BAZEL_EXIT:-0}" -ne 0 ]]; then
  echo "ERROR: tools/simulate.cc:12:1: expected ';' before '}' token" >&2
  echo "INFO: Elapsed time: 0.5s" >&2
  exit "$FAKE_BAZEL_EXIT"
fi
name="${@: -1}"
name="${name##*:}"
mkdir -p bazel-bin/tools
{
  echo '#!/bin/bash'
  echo "echo \"{\\\"binary\\\": \\\"$name\\\", \\\"args\\\": \\\"\$*\\\"}\""
  echo 'exit "${FAKE_CLI_EXIT:-0}"'
} >"bazel-bin/tools/$name"
chmod +x "bazel-bin/tools/$name"
echo "INFO: Build completed successfully, 1 total action" >&2
SH
chmod +x "$tmp/bin/bazel"
export CALLS="$tmp/calls"

run() {  # run ARGS...: scripts/knapformer with the stand-ins; sets $code
  rm -rf "$CALLS" "$repo/bazel-bin"
  mkdir -p "$CALLS"
  touch "$CALLS/setup" "$CALLS/bazel"
  PATH="$tmp/bin:$PATH" bash "$repo/scripts/knapformer" "$@" >"$tmp/out" 2>"$tmp/err"
  code=$?
}

# An up-to-date build: the command's own output and exit code, nothing else,
# and no wait for the long-build notice.
start=$SECONDS
run plan --input req.json --pretty
elapsed=$((SECONDS - start))
if [[ $code -ne 0 ]]; then
  fail "quiet: exit $code; stderr: $(cat "$tmp/err")"
elif [[ "$(cat "$tmp/out")" != \
      '{"binary": "knapformer", "args": "plan --input req.json --pretty"}' ]]; then
  fail "quiet: stdout is not the command's alone: $(cat "$tmp/out")"
elif [[ -s "$tmp/err" ]]; then
  fail "quiet: stderr is not empty: $(cat "$tmp/err")"
elif [[ $elapsed -ge 10 ]]; then
  fail "quiet: took $elapsed s (waited for the notice's timer?)"
else
  echo "ok   quiet"
fi
[[ "$(cat "$CALLS/setup")" == "--profile cli" ]] &&
  echo "ok   cli-profile" || fail "cli-profile: setup.sh got '$(cat "$CALLS/setup")'"
grep -q -- "^build -c opt .*//tools:knapformer$" "$CALLS/bazel" &&
  echo "ok   builds-knapformer-opt" || fail "builds-knapformer-opt: bazel got $(cat "$CALLS/bazel")"

FAKE_CLI_EXIT=2 run simulate --bogus 1
[[ $code -eq 2 ]] && echo "ok   exit-code-passes-through" || fail "exit-code-passes-through: $code"

# A failed build: all of Bazel's output on stderr, a line naming the build,
# nothing on stdout, the command not run.
FAKE_BAZEL_EXIT=1 run simulate
if [[ $code -eq 0 ]]; then
  fail "build-failure: exit 0"
elif [[ -s "$tmp/out" ]]; then
  fail "build-failure: stdout: $(cat "$tmp/out")"
elif ! grep -qF "ERROR: tools/simulate.cc:12:1: expected ';'" "$tmp/err" ||
     ! grep -qF "INFO: Invocation ID" "$tmp/err" ||
     ! grep -qF "knapformer: bazel build -c opt //tools:knapformer failed (exit 1" "$tmp/err"; then
  fail "build-failure: stderr lacks the build's output: $(cat "$tmp/err")"
else
  echo "ok   build-failure"
fi

# A long build says so once, on stderr.
KNAPFORMER_BUILD_NOTICE_SECONDS=1 FAKE_BAZEL_SECONDS=3 run simulate
if [[ $code -eq 0 && $(wc -l <"$tmp/err") -eq 1 ]] &&
   grep -q "^knapformer: building //tools:knapformer " "$tmp/err" &&
   [[ "$(cat "$tmp/out")" == '{"binary": "knapformer", "args": "simulate"}' ]]; then
  echo "ok   long-build-notice"
else
  fail "long-build-notice: exit $code, stdout $(cat "$tmp/out"), stderr $(cat "$tmp/err")"
fi

# train-sim: its own profile and binary.
run train-sim --procs 2
if [[ $code -eq 0 && "$(cat "$CALLS/setup")" == "--profile train-sim" &&
      "$(cat "$tmp/out")" == '{"binary": "train_sim", "args": "--procs 2"}' ]] &&
   grep -q -- "//tools:train_sim$" "$CALLS/bazel"; then
  echo "ok   train-sim"
else
  fail "train-sim: exit $code, setup $(cat "$CALLS/setup"), stdout $(cat "$tmp/out")"
fi
run help train-sim
[[ $code -eq 0 && "$(cat "$tmp/out")" == '{"binary": "train_sim", "args": "--help"}' ]] &&
  echo "ok   help-train-sim" || fail "help-train-sim: stdout $(cat "$tmp/out")"

# setup.sh failing stops before the build.
FAKE_SETUP_EXIT=1 run simulate
[[ $code -ne 0 && ! -s "$CALLS/bazel" && ! -s "$tmp/out" ]] &&
  echo "ok   setup-failure" || fail "setup-failure: exit $code, bazel $(cat "$CALLS/bazel")"

# setup.sh: what each profile installs (--print), with stand-ins that record
# any apt-get call and say which packages are installed.
cat >"$tmp/bin/apt-get" <<'SH'
#!/bin/bash
echo "$*" >>"$CALLS/apt-get"
SH
cat >"$tmp/bin/dpkg-query" <<'SH'
#!/bin/bash
for missing in ${FAKE_MISSING:-}; do [[ "${@: -1}" == "$missing" ]] && exit 1; done
printf 'install ok installed'
SH
cat >"$tmp/bin/id" <<'SH'
#!/bin/bash
echo "${FAKE_UID:-0}"
SH
chmod +x "$tmp/bin/apt-get" "$tmp/bin/dpkg-query" "$tmp/bin/id"
setup() {  # setup ARGS...: the real setup.sh with the stand-ins; sets $code
  rm -rf "$CALLS"
  mkdir -p "$CALLS"
  touch "$CALLS/apt-get"
  PATH="$tmp/bin:$PATH" bash "$setup" "$@" >"$tmp/out" 2>"$tmp/err"
  code=$?
}
has() { grep -qx -- "$1" "$tmp/out"; }

setup --profile cli --print
missing="" extra=""
for package in bazel-bootstrap g++ libabsl-dev nlohmann-json3-dev libgrpc++-dev \
    protobuf-compiler-grpc libprotobuf-dev protobuf-compiler prometheus-cpp-dev; do
  has "$package" || missing+=" $package"
done
for package in podman buildah runc mmdebstrap clang nodejs npm cmake prometheus libtorch-dev \
    python3-torch libgtest-dev python3-pytest python3-matplotlib openssl; do
  has "$package" && extra+=" $package"
done
if [[ $code -ne 0 || -n "$missing$extra" || -s "$CALLS/apt-get" ]]; then
  fail "cli-print: exit $code, lacks:$missing, has:$extra, apt-get: $(cat "$CALLS/apt-get")"
else
  echo "ok   cli-print ($(wc -l <"$tmp/out") packages)"
fi
cli_packages="$(cat "$tmp/out")"

setup --print --profile train-sim
missing="" extra=""
for package in $cli_packages libtorch-dev libgloo-dev python3-torch pybind11-dev python3-dev; do
  has "$package" || missing+=" $package"
done
for package in podman clang nodejs npm libgtest-dev python3-pytest; do
  has "$package" && extra+=" $package"
done
[[ $code -eq 0 && -z "$missing$extra" ]] && echo "ok   train-sim-print" ||
  fail "train-sim-print: exit $code, lacks:$missing, has:$extra"

# The profiles of CI keep what they had.
setup --profile all --print
[[ $code -eq 0 ]] && has podman && has clang && has libgtest-dev && has python3-pytest &&
  has libtorch-dev && has mmdebstrap && echo "ok   all-print" || fail "all-print: $(cat "$tmp/out")"
setup --profile torch --print
[[ $code -eq 0 ]] && has libtorch-dev && has libgtest-dev && ! has podman && ! has clang &&
  echo "ok   torch-print" || fail "torch-print: $(cat "$tmp/out")"

# Idempotent: all installed, nothing said, nothing run.
setup --profile cli
[[ $code -eq 0 && ! -s "$tmp/out" && ! -s "$tmp/err" && ! -s "$CALLS/apt-get" ]] &&
  echo "ok   cli-installed-is-silent" ||
  fail "cli-installed-is-silent: exit $code, $(cat "$tmp/out" "$tmp/err" "$CALLS/apt-get")"
# One missing: apt-get installs that one alone.
FAKE_MISSING=prometheus-cpp-dev setup --profile cli
if [[ $code -eq 0 &&
      "$(cat "$CALLS/apt-get")" == $'update -qq\ninstall -y -qq prometheus-cpp-dev' ]]; then
  echo "ok   cli-installs-the-missing"
else
  fail "cli-installs-the-missing: exit $code, apt-get: $(cat "$CALLS/apt-get"), $(cat "$tmp/err")"
fi
FAKE_UID=1000 FAKE_MISSING=libabsl-dev setup --profile cli
[[ $code -eq 1 ]] && grep -q "missing packages (libabsl-dev); run as root" "$tmp/err" &&
  echo "ok   cli-not-root" || fail "cli-not-root: exit $code, $(cat "$tmp/err")"
setup --profile everything
[[ $code -eq 2 ]] && grep -q "unknown profile 'everything' (.*train-sim or trainer)" "$tmp/err" &&
  echo "ok   unknown-profile" || fail "unknown-profile: exit $code, $(cat "$tmp/err")"
setup --help
[[ $code -eq 0 ]] && grep -q -- "--profile cli" "$tmp/out" && echo "ok   setup-help" ||
  fail "setup-help: exit $code"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
