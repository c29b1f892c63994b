#!/bin/bash
# A planner that checks who may act as a job, attacked while it serves a
# 4-rank train-sim (every step's loss and gradients checked by the binary):
#   (token) knapformer serve --auth=token; the run's token minted by
#           `knapformer token`, given as KNAPFORMER_PLANNER_TOKEN;
#   (mtls)  --auth=mtls over TLS; the run's client certificate names its
#           job (DNS:victim), given as KNAPFORMER_PLANNER_TLS_*.
# Meanwhile a stranger with a valid credential for its own job (job_stranger)
# reads the run's job, opens its next per-rank steps, resets its group with
# another incarnation and sends timings for its gamma fit, over and over:
# every call must be refused; the run must plan every step from the service;
# no gamma fit may appear for the run's job (it sends no timings, so any fit
# would be the stranger's) while the stranger's own job, sent the same
# timings, gets one; and the stranger's own steps are answered. Also: a run
# without a token, or with another job's, plans locally, with the reason.
# 127.0.0.1 only; every wait bounded; every process cleaned up.
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
# fail, wait_for_port_file, wait_for_step, check_run
source "$(dirname "${BASH_SOURCE[0]}")/planner_process_lib.sh"
export KNAPFORMER_PLANNER_DEADLINE_SECONDS=2

# Starts the planner with flags "$@", sets $server, $port and $metrics.
start_server() {
  rm -f "$tmp/port"
  "$knapformer" serve --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --log-level warning \
    --port-file "$tmp/port" "$@" >>"$tmp/server.log" 2>&1 &
  server=$!
  wait_for_port_file "$tmp/port" "$tmp/server.log" || return 1
  read -r port metrics <"$tmp/port"
}

stop_server() {
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  server=""
}

# The fitted gamma the metrics page shows for job $1 ("none" without one).
fitted_gamma() {
  python3 - "$metrics" "$1" <<'PY'
import re, sys, urllib.request
page = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
found = re.findall(r'^knapformer_planner_fitted_gamma\{[^}]*job_id="%s"[^}]*\} (\S+)$'
                   % re.escape(sys.argv[2]), page, re.M)
print(found[0] if found else "none")
PY
}

# The attack on a 10-step run of job "victim" ($1 names the case); the
# variables that carry the credentials are set by the caller per process.
attack() {
  local name="$1" victim_env="$2" stranger_env="$3"
  env $victim_env KNAPFORMER_JOB_ID=victim timeout 300 "$train_sim" --procs 4 --scale 32 \
    --steps 10 --planner "127.0.0.1:$port" >"$tmp/$name" 2>"$tmp/$name.err" &
  local sim=$!
  wait_for_step "$tmp/$name" 0 || fail "($name) the run did not reach step 0: $(cat "$tmp/$name.err")"
  env $stranger_env timeout 120 "$stranger" "$port" victim stranger 4 >"$tmp/$name.stranger" 2>&1 ||
    fail "($name) the stranger was not refused everywhere: $(cat "$tmp/$name.stranger")"
  wait "$sim" || fail "($name) train-sim exited non-zero: $(cat "$tmp/$name.err")"
  check_run "$tmp/$name" "($name)" 0 9 0 service 0 1 2 3 4 5 6 7 8 9 || failures=$((failures + 1))
  cat "$tmp/$name.stranger"
  [[ "$(fitted_gamma victim)" == none ]] || fail "($name) the victim's job has a gamma fit"
  local own
  own="$(fitted_gamma stranger)"
  [[ "$own" != none ]] || fail "($name) the stranger's own timings gave its job no fit"
  echo "($name) fitted gamma: victim none, stranger $own"
}

# (token)
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$tmp/keys"
start_server --auth token --auth-key-file "$tmp/keys" || exit 1
victim_token="$("$knapformer" token --job victim --key-file "$tmp/keys")" ||
  fail "knapformer token failed"
stranger_token="$("$knapformer" token --job stranger --key-file "$tmp/keys")"
attack token "KNAPFORMER_PLANNER_TOKEN=$victim_token" "KNAPFORMER_PLANNER_TOKEN=$stranger_token"

# A run with no token, or the stranger's, plans every step locally, naming why.
for case in none:"" other:"KNAPFORMER_PLANNER_TOKEN=$stranger_token"; do
  env ${case#*:} KNAPFORMER_JOB_ID=victim timeout 120 "$train_sim" --procs 4 --scale 32 \
    --steps 3 --planner "127.0.0.1:$port" >"$tmp/refused" 2>"$tmp/refused.err" ||
    fail "(${case%%:*} token) train-sim exited non-zero: $(cat "$tmp/refused.err")"
  check_run "$tmp/refused" "(${case%%:*} token)" 0 2 0 local 0 1 2 || failures=$((failures + 1))
  grep -q -e UNAUTHENTICATED -e PERMISSION_DENIED -e "job token" -e "token is not" \
    "$tmp/refused" "$tmp/refused.err" ||
    fail "(${case%%:*} token) the run did not say why it planned locally: $(cat "$tmp/refused.err")"
done
stop_server

# (mtls)
(
  set -e
  cd "$tmp"
  printf 'subjectAltName=IP:127.0.0.1\n' >server.ext
  openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key -out ca.pem
  openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
    -extfile server.ext -out server.pem
  for job in victim stranger; do
    printf 'subjectAltName=DNS:%s\n' "$job" >"$job.ext"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$job" -keyout "$job.key" -out "$job.csr"
    openssl x509 -req -in "$job.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
      -extfile "$job.ext" -out "$job.pem"
  done
) >"$tmp/openssl.log" 2>&1 || { fail "openssl: $(cat "$tmp/openssl.log")"; exit 1; }
start_server --auth mtls --tls-cert "$tmp/server.pem" --tls-key "$tmp/server.key" \
  --tls-client-ca "$tmp/ca.pem" || exit 1
tls_of() {
  echo "KNAPFORMER_PLANNER_TLS_CA=$tmp/ca.pem KNAPFORMER_PLANNER_TLS_CERT=$tmp/$1.pem" \
    "KNAPFORMER_PLANNER_TLS_KEY=$tmp/$1.key"
}
attack mtls "$(tls_of victim)" "$(tls_of stranger)"
stop_server

echo "$failures failures"
[[ $failures -eq 0 ]]
