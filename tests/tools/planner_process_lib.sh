# Shell helpers shared by the tests that run `knapformer serve` and
# train-sim as real processes (planner_faults_test, planner_replicas_test,
# planner_auth_test, planner_memory_test).
# Sourced, before anything can fail: it starts the count of failures.

failures=0
# Reports a failure ("FAIL ..."), counted in $failures.
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# Waits (bounded, 30 s) until `serve --port-file` $1 is written; fails
# naming the log $2 otherwise.
wait_for_port_file() {
  for _ in $(seq 300); do
    [[ -s "$1" ]] && return 0
    sleep 0.1
  done
  fail "the planner did not start: $(cat "$2")"
  return 1
}

# Waits (bounded) until train-sim's output $1 shows step $2's balanced row.
wait_for_step() {
  for _ in $(seq 600); do
    [[ "$(last_step "$1")" -ge "$2" ]] && return 0
    sleep 0.05
  done
  return 1
}

# The last step train-sim's output $1 shows (-1 before the first).
last_step() {
  python3 - "$1" <<'PY'
import re, sys
rows = re.findall(r"^(\d+)\s+unbalanced", open(sys.argv[1]).read(), re.M)
print(rows[-1] if rows else -1)
PY
}

# Checks run output $1: name $2, steps $3..$4, every step done, at most $5
# steps planned longer than the deadline (KNAPFORMER_PLANNER_DEADLINE_SECONDS,
# the one the run was given); prints each step's source.
# Remaining args: "service-after STEP" (some step after STEP, and the last,
# come from the service), then "local STEP..." or "service STEP..." (these
# steps were planned locally / by the service).
check_run() {
  python3 - "$@" <<'PY' || return 1
import os, re, sys
path, name, first, last, slow_allowed, *rest = sys.argv[1:]
deadline_ms = 1000 * float(os.environ["KNAPFORMER_PLANNER_DEADLINE_SECONDS"])
text = open(path).read()
steps = re.findall(r"^(\d+)\s+unbalanced.*\n\s+balanced.*\((local planner|planner service)"
                   r"(, ahead)?, waited ([\d.]+) ms\)$", text, re.M)
ahead = {int(s): bool(a) for s, _, a, _ in steps}
steps = [(s, src, ms) for s, src, _, ms in steps]
got = [int(s) for s, _, _ in steps]
assert got == list(range(int(first), int(last) + 1)), f"{name}: steps {got}\n{text}"
assert "FAILED" not in text and "largest relative loss difference" in text, f"{name}:\n{text}"
source = {int(s): src for s, src, _ in steps}
slow = [int(s) for s, _, ms in steps if float(ms) > deadline_ms]
print(f"{name}: " + " ".join(f"{s}:{'S' if source[s] == 'planner service' else 'L'}" for s in got)
      + f"; steps planned > {deadline_ms / 1000:g} s: {slow}")
assert len(slow) <= int(slow_allowed), f"{name}: steps {slow} waited past the deadline"
i = 0
while i < len(rest):
    if rest[i] == "ahead":  # every step but the first was planned ahead
        assert not ahead[got[0]] and all(ahead[s] for s in got[1:]), f"{name}: {ahead}"
        i += 1
    elif rest[i] == "service-after":
        after = int(rest[i + 1])
        assert any(source[s] == "planner service" for s in got if s > after), \
            f"{name}: the service was not used again after step {after}"
        assert source[got[-1]] == "planner service", f"{name}: the last step was not the service's"
        i += 2
    elif rest[i] in ("local", "service"):
        want = "local planner" if rest[i] == "local" else "planner service"
        for s in rest[i + 1:]:
            assert source[int(s)] == want, f"{name}: step {s} was not planned by the {want}"
        break
PY
}

# Makes TLS files in directory $1 (made if missing): a CA (ca.pem), the
# planner's certificate for 127.0.0.1 (server.pem, server.key), and for each
# further argument NAME=SAN a client certificate NAME.pem, NAME.key with that
# subjectAltName (e.g. victim=DNS:victim). Fails naming openssl's output.
make_tls() {
  local dir="$1"
  shift
  (
    set -e
    mkdir -p "$dir"
    cd "$dir"
    printf 'subjectAltName=IP:127.0.0.1\n' >server.ext
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key -out ca.pem
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
      -extfile server.ext -out server.pem
    for client in "$@"; do
      local name="${client%%=*}"
      printf 'subjectAltName=%s\n' "${client#*=}" >"$name.ext"
      openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout "$name.key" -out "$name.csr"
      openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
        -extfile "$name.ext" -out "$name.pem"
    done
  ) >"$dir.openssl.log" 2>&1 || { fail "openssl: $(cat "$dir.openssl.log")"; return 1; }
}
