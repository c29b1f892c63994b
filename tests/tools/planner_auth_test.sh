#!/bin/bash
# The shared planner attacked by its own tenants while it serves a 4-rank
# train-sim (every step's loss and gradients checked by the binary):
#   (token) knapformer serve --auth=token over TLS, with a revocation list;
#           the run's token minted by `knapformer token`, given as
#           KNAPFORMER_PLANNER_TOKEN with the CA as KNAPFORMER_PLANNER_TLS_CA;
#   (mtls)  --auth=mtls in trust domain cluster.test; the run's certificate
#           names its namespace team-v by its SPIFFE id.
# Meanwhile a stranger with a valid credential for its own job (job_stranger)
# reads the run's job, opens its next per-rank steps, resets its group with
# another incarnation and sends timings for its gamma fit, over and over,
# with its own token, with none, and with tokens that must not act at all:
# its own stretched into a prefix token (the kf1 attack: a job token acting
# as its namespace's), expired, revoked, and another planner's. Every call
# must be refused; the run must plan every step from the service; no gamma
# fit may appear for the run's job (it sends no timings, so any fit would be
# the stranger's) while the stranger's own job, sent the same timings, gets
# one; and the stranger's own steps are answered. Under mtls the stranger's
# certificate also carries another trust domain's SPIFFE id for team-v.
# Also: a key rotated mid-run keeps the run's token acting (the overlap) and
# the new key's tokens act at once; a run with no token, another planner's
# or another job's plans locally from its first step without probing, naming
# the code, the job id and the credential's kind, and fails with that code
# under require_planner; a token without the CA plans locally, naming the
# TLS setting; a token bound for plaintext off loopback
# fails the run at its start, and so does `serve --auth` without TLS off
# loopback. 127.0.0.1 only; every wait bounded; every process cleaned up.
set -u
knapformer="$1"
train_sim="$2"
stranger="$3"
tmp="$(mktemp -d)"
server=""
cleanup() {
  for pid in $server $(jobs -p); do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# fail, wait_for_port_file, wait_for_step, check_run, make_tls
source "$(dirname "${BASH_SOURCE[0]}")/planner_process_lib.sh"
export KNAPFORMER_PLANNER_DEADLINE_SECONDS=2

# Starts the planner with flags "$@", sets $server, $port and $metrics.
start_server() {
  rm -f "$tmp/port"
  "$knapformer" serve --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --log-level warning \
    --port-file "$tmp/port" --tls-cert "$tmp/tls/server.pem" --tls-key "$tmp/tls/server.key" \
    "$@" >>"$tmp/server.log" 2>&1 &
  server=$!
  wait_for_port_file "$tmp/port" "$tmp/server.log" || return 1
  read -r port metrics <"$tmp/port"
}

stop_server() {
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  server=""
}

# The value of metric $1 for job $2 ("none" without one; "" for a metric
# without labels).
metric() {
  python3 - "$metrics" "$1" "$2" <<'PY'
import re, sys
import urllib.request
port, name, job = sys.argv[1:]
page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
labels = r'\{[^}]*job_id="%s"[^}]*\}' % re.escape(job) if job else r"(?:\{\})?"
found = re.findall(r"^%s%s (\S+)$" % (re.escape(name), labels), page, re.M)
print(found[0] if found else "none")
PY
}

# Waits (bounded, 3 s) until metric $1 (no labels) reads $2.
await_metric() {
  for _ in $(seq 30); do
    [[ "$(metric "$1" "")" == "$2" ]] && return 0
    sleep 0.1
  done
  fail "$1 is $(metric "$1" ""), not $2"
}

# mint KEY_FILE ARGS...: a token (its id and expiry to $tmp/minted).
mint() {
  local keys="$1"
  shift
  "$knapformer" token --key-file "$keys" "$@" 2>"$tmp/minted"
}

# The attack on a 10-step run of job $2 ($1 names the case) by a stranger
# whose own job is $3; the variables that carry the credentials are set by
# the caller per process.
attack() {
  local name="$1" victim="$2" own="$3" victim_env="$4" stranger_env="$5"
  env $victim_env KNAPFORMER_JOB_ID="$victim" timeout 300 "$train_sim" --procs 4 --scale 32 \
    --steps 10 --planner "127.0.0.1:$port" >"$tmp/$name" 2>"$tmp/$name.err" &
  local sim=$!
  wait_for_step "$tmp/$name" 0 || fail "($name) the run did not reach step 0: $(cat "$tmp/$name.err")"
  env $stranger_env timeout 120 "$stranger" "$port" "$victim" "$own" 2 >"$tmp/$name.stranger" 2>&1 ||
    fail "($name) the stranger was not refused everywhere: $(cat "$tmp/$name.stranger")"
  wait "$sim" || fail "($name) train-sim exited non-zero: $(cat "$tmp/$name.err")"
  check_run "$tmp/$name" "($name)" 0 9 0 service 0 1 2 3 4 5 6 7 8 9 || failures=$((failures + 1))
  cat "$tmp/$name.stranger"
  [[ "$(metric knapformer_planner_fitted_gamma "$victim")" == none ]] ||
    fail "($name) the victim's job has a gamma fit"
  local fitted
  fitted="$(metric knapformer_planner_fitted_gamma "$own")"
  [[ "$fitted" != none ]] || fail "($name) the stranger's own timings gave its job no fit"
  echo "($name) fitted gamma: victim none, stranger $fitted"
}

make_tls "$tmp/tls" "team-v=URI:spiffe://cluster.test/ns/team-v/sa/trainer" \
  "stranger=URI:spiffe://cluster.test/ns/team-s/sa/x,URI:spiffe://other-domain/ns/team-v/sa/x" ||
  exit 1
export KNAPFORMER_PLANNER_TLS_CA="$tmp/tls/ca.pem"

# (token)
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$tmp/keys"
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$tmp/other_keys"
: >"$tmp/revoked"
start_server --auth token --auth-key-file "$tmp/keys" --auth-revoked-file "$tmp/revoked" || exit 1
await_metric knapformer_planner_auth_keys 1
victim_token="$(mint "$tmp/keys" --job victim --ttl 1h)" || fail "knapformer token failed"
stranger_token="$(mint "$tmp/keys" --job stranger --ttl 1h)"
# The kf1 attack began with a token for a job id ending in '/': none is minted.
mint "$tmp/keys" --job victim/ --ttl 1h >/dev/null &&
  fail "knapformer token minted a token for job 'victim/'"
grep -q "ends in '/'" "$tmp/minted" || fail "the refusal of job 'victim/' says: $(cat "$tmp/minted")"
expired="$(mint "$tmp/keys" --job stranger --ttl 1s)"
revoked="$(mint "$tmp/keys" --job stranger --ttl 1h)"
sed -n 's/^knapformer token: id \([0-9a-f]*\),.*/\1/p' "$tmp/minted" >>"$tmp/revoked"
foreign="$(mint "$tmp/other_keys" --job stranger --ttl 1h)"
stretched="${stranger_token/kf2.job./kf2.prefix.}/"
bad="$stretched,${stranger_token}.victim/,$expired,$revoked,$foreign"
sleep 1.5  # the expired one expires, the revocation is read
attack token victim stranger "KNAPFORMER_PLANNER_TOKEN=$victim_token" \
  "KNAPFORMER_PLANNER_TOKEN=$stranger_token KNAPFORMER_STRANGER_BAD_TOKENS=$bad"
await_metric knapformer_planner_auth_revoked_tokens 1

# A key rotated mid-run: the new key first, the old one kept for the
# overlap. The run's old-key token keeps acting; a new-key token acts.
KNAPFORMER_PLANNER_TOKEN="$victim_token" KNAPFORMER_JOB_ID=victim timeout 300 \
  "$train_sim" --procs 4 --scale 32 --steps 6 --planner "127.0.0.1:$port" \
  >"$tmp/rotated" 2>"$tmp/rotated.err" &
sim=$!
wait_for_step "$tmp/rotated" 1 || fail "(rotation) the run did not reach step 1"
python3 -c 'import secrets; print(secrets.token_hex(32))' | cat - "$tmp/keys" >"$tmp/keys.new"
mv "$tmp/keys.new" "$tmp/keys"
sleep 1.5  # read again within a second
new_token="$(mint "$tmp/keys" --job stranger --ttl 1h)"
await_metric knapformer_planner_auth_keys 2
KNAPFORMER_PLANNER_TOKEN="$new_token" timeout 60 "$stranger" "$port" victim stranger 0.2 \
  >"$tmp/rotated.stranger" 2>&1 || fail "(rotation) the new key's token: $(cat "$tmp/rotated.stranger")"
wait "$sim" || fail "(rotation) train-sim exited non-zero: $(cat "$tmp/rotated.err")"
check_run "$tmp/rotated" "(rotation)" 0 5 0 service 0 1 2 3 4 5 ||
  failures=$((failures + 1))

# The trainer's mistakes are configuration errors, not outages. A run with no
# token, another planner's, or another job's, plans every step locally from
# its first, naming the code, the job id sent and the credential's kind; it
# asks the service once and never probes (the calls the service refused,
# counted on its page); under KNAPFORMER_REQUIRE_PLANNER every rank fails
# with that code.
refused_calls() {
  python3 - "$metrics" <<'PY'
import re, sys, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(sum(float(v) for v in re.findall(
    r'^knapformer_planner_requests_total\{[^}]*code="(?:UNAUTHENTICATED|PERMISSION_DENIED)"[^}]*\} (\S+)$',
    page, re.M)))
PY
}
for case in "none:UNAUTHENTICATED:no job token:" \
    "foreign:UNAUTHENTICATED:a job token:KNAPFORMER_PLANNER_TOKEN=$foreign" \
    "other:PERMISSION_DENIED:a job token:KNAPFORMER_PLANNER_TOKEN=$stranger_token"; do
  IFS=: read -r name code kind credential <<<"$case"
  before="$(refused_calls)"
  env $credential KNAPFORMER_JOB_ID=victim timeout 120 "$train_sim" --procs 4 --scale 32 \
    --steps 3 --planner "127.0.0.1:$port" >"$tmp/refused" 2>"$tmp/refused.err" ||
    fail "($name token) train-sim exited non-zero: $(cat "$tmp/refused.err")"
  check_run "$tmp/refused" "($name token)" 0 2 0 local 0 1 2 || failures=$((failures + 1))
  for said in "refused the job's credentials ($code" "sent job id 'victim' with $kind over TLS"; do
    grep -qF "$said" "$tmp/refused" "$tmp/refused.err" ||
      fail "($name token) the run did not say '$said': $(cat "$tmp/refused.err")"
  done
  calls="$(python3 -c "print(int($(refused_calls) - $before))")"
  [[ "$calls" == 1 ]] || fail "($name token) the service refused $calls calls, not 1 (probes?)"
  env $credential KNAPFORMER_JOB_ID=victim KNAPFORMER_REQUIRE_PLANNER=1 timeout 120 \
    "$train_sim" --procs 4 --scale 32 --steps 3 --planner "127.0.0.1:$port" \
    >"$tmp/required" 2>&1 && fail "($name token) a required planner's refusal did not fail the run"
  grep -q "^$code: .*require_planner is set" "$tmp/required" ||
    grep -q "$code: step 0: .*require_planner is set" "$tmp/required" ||
    fail "($name token) the required run did not fail with $code: $(tail -5 "$tmp/required")"
done
# A token and no CA to a planner that serves TLS: gRPC says only "Socket
# closed"; the run plans locally and says which setting gives TLS.
KNAPFORMER_PLANNER_TLS_CA="" KNAPFORMER_PLANNER_TOKEN="$victim_token" KNAPFORMER_JOB_ID=victim \
  timeout 120 "$train_sim" --procs 4 --scale 32 --steps 2 --planner "127.0.0.1:$port" \
  >"$tmp/no_ca" 2>"$tmp/no_ca.err" || fail "(no CA) train-sim exited non-zero: $(cat "$tmp/no_ca.err")"
check_run "$tmp/no_ca" "(no CA)" 0 1 0 local 0 1 || failures=$((failures + 1))
grep -qF "if the planner serves TLS, give its CA as planner_tls" "$tmp/no_ca" "$tmp/no_ca.err" ||
  fail "(no CA) the run did not name the TLS setting: $(cat "$tmp/no_ca.err")"
stop_server

# No token in clear off this machine: a trainer refuses to send one without
# TLS to another host (192.0.2.1, never reached), a planner to take one.
KNAPFORMER_PLANNER_TLS_CA="" KNAPFORMER_PLANNER_TOKEN="$victim_token" KNAPFORMER_JOB_ID=victim \
  timeout 120 "$train_sim" --procs 4 --scale 32 --steps 1 --planner 192.0.2.1:50051 \
  >"$tmp/clear" 2>&1 && fail "(plaintext) train-sim sent a token in clear"
grep -q "the token would cross the network in clear to '192.0.2.1:50051'" "$tmp/clear" ||
  fail "(plaintext) train-sim did not say why: $(tail -5 "$tmp/clear")"
"$knapformer" serve --listen 0.0.0.0:0 --metrics off --auth token --auth-key-file "$tmp/keys" \
  >"$tmp/clear_serve" 2>&1 && fail "(plaintext) serve --auth token started without TLS"
grep -q "credentials would cross the network in clear" "$tmp/clear_serve" ||
  fail "(plaintext) serve did not say why: $(cat "$tmp/clear_serve")"

# (mtls)
start_server --auth mtls --tls-client-ca "$tmp/tls/ca.pem" --mtls-trust-domain cluster.test ||
  exit 1
tls_of() {
  echo "KNAPFORMER_PLANNER_TLS_CERT=$tmp/tls/$1.pem KNAPFORMER_PLANNER_TLS_KEY=$tmp/tls/$1.key"
}
attack mtls team-v/victim team-s/stranger "$(tls_of team-v)" "$(tls_of stranger)"
[[ "$(metric knapformer_planner_auth_keys "")" == none ]] ||
  fail "(mtls) a planner without a key file exports knapformer_planner_auth_keys"
stop_server

echo "$failures failures"
[[ $failures -eq 0 ]]
