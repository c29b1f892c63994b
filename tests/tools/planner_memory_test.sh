#!/bin/bash
# The shared planner (--auth token over TLS) under a 1 GiB memory limit
# (prlimit's RLIMIT_DATA: the heap and every private writable mapping,
# thread stacks included) serves a 4-rank train-sim while request_flood
# sends it, each flood 8 requests at once on connections of their own:
#   (nested)  from a tenant with a valid token (a prefix token, two job ids),
#             8 of 30 MiB whose spec's measured attention table holds only
#             unknown fields (parsed, each would take about 1 GiB: the attack
#             a hand-written scan let through): refused before parsing;
#   (zeros)   the same tenant, 8 of 48 MiB of zero lengths: refused by count;
#   (anonymous) 8 of 32 MiB without a token: refused (by the token check, or
#             shed by gRPC's memory quota before it);
#   (oversize) 8 of 80 MiB: over the receive limit, refused by gRPC;
#   (held)    the flood tenant, 48 valid one-rank steps of 13 MB parsed
#             each over its two job ids, waiting in the rendezvous for ranks
#             that never come: the tenant's share (256 MiB) holds about 20,
#             the rest are refused naming it, and another tenant's step
#             still gets in (with shares per job id alone, the two ids held
#             the whole 512 MiB and it was refused).
# The planner must stay up under the limit, and the run must finish every
# step exactly (loss and gradients checked by the binary), planned by the
# service before the floods, and a run after them entirely by the service. Prints the planner's peak RSS and the
# run's planning latency before and during the floods: the figures of
# docs/service.md ("Memory"). 127.0.0.1 only; every wait bounded; every
# process cleaned up.
set -u
knapformer="$1"
train_sim="$2"
flood="$3"
tmp="$(mktemp -d)"
server=""
cleanup() {
  for pid in $server $(jobs -p); do kill -9 "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# fail, wait_for_port_file, wait_for_step, last_step, check_run, make_tls
source "$(dirname "${BASH_SOURCE[0]}")/planner_process_lib.sh"
export KNAPFORMER_PLANNER_DEADLINE_SECONDS=10
limit=$((1 << 30))

make_tls "$tmp/tls" || exit 1
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$tmp/keys"
prlimit --data=$limit -- "$knapformer" serve --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
  --log-level warning --port-file "$tmp/port" --auth token --auth-key-file "$tmp/keys" \
  --tls-cert "$tmp/tls/server.pem" --tls-key "$tmp/tls/server.key" >"$tmp/server.log" 2>&1 &
server=$!
wait_for_port_file "$tmp/port" "$tmp/server.log" || exit 1
read -r port metrics <"$tmp/port"
grep -q "^Max data size *$limit " "/proc/$server/limits" ||
  fail "the planner runs without the 1 GiB limit: $(grep 'Max data' "/proc/$server/limits")"
export KNAPFORMER_PLANNER_TLS_CA="$tmp/tls/ca.pem"
run_token="$("$knapformer" token --job memory --ttl 1h --key-file "$tmp/keys" 2>/dev/null)"
flood_token="$("$knapformer" token --prefix flood/ --ttl 1h --key-file "$tmp/keys" 2>/dev/null)"
other_token="$("$knapformer" token --job other-tenant --ttl 1h --key-file "$tmp/keys" 2>/dev/null)"

KNAPFORMER_PLANNER_TOKEN="$run_token" KNAPFORMER_JOB_ID=memory timeout 300 "$train_sim" \
  --procs 4 --scale 32 --steps 40 --planner "127.0.0.1:$port" >"$tmp/run" 2>"$tmp/run.err" &
sim=$!
wait_for_step "$tmp/run" 4 || fail "the run did not reach step 4: $(cat "$tmp/run.err")"
flood_from="$(last_step "$tmp/run")"
# name shape MiB codes token: 8 requests, each refused with one of codes.
send() {
  KNAPFORMER_PLANNER_TOKEN="$5" timeout 120 "$flood" "$port" 8 $(($3 << 20)) "$2" "$4" \
    flood/a flood/b >"$tmp/flood" 2>&1 || fail "($1) the flood was not refused everywhere:"
  echo "($1) $(tail -1 "$tmp/flood")"
  grep -m1 "^request" "$tmp/flood"
}
send nested nested 30 8 "$flood_token"
send zeros zeros 48 8 "$flood_token"
send anonymous zeros 32 16,8 ""
send oversize zeros 80 8 "$flood_token"
# (held): the tenant's 48 one-rank steps wait in the rendezvous for ranks
# that never come, holding their memory; once its refusals stop coming,
# another tenant's such step must get in (held too: DEADLINE_EXCEEDED, not
# RESOURCE_EXHAUSTED). Then the flood is stopped, which frees its memory.
KNAPFORMER_FLOOD_DEADLINE_MS=120000 KNAPFORMER_PLANNER_TOKEN="$flood_token" timeout 150 \
  "$flood" "$port" 48 $((192 << 10)) held 4,8 flood/a flood/b >"$tmp/held" 2>&1 &
held=$!
refused=-1
for _ in $(seq 60); do  # until the count of refusals holds still for 1 s
  sleep 1
  now="$(grep -c "^request.*: 8 " "$tmp/held")"
  [[ "$now" -gt 0 && "$now" -eq "$refused" ]] && break
  refused="$now"
done
KNAPFORMER_FLOOD_DEADLINE_MS=5000 KNAPFORMER_PLANNER_TOKEN="$other_token" timeout 60 \
  "$flood" "$port" 1 $((192 << 10)) held 4 other-tenant >"$tmp/other" 2>&1 ||
  fail "(held) another tenant's step was refused: $(cat "$tmp/other")"
kill "$held" 2>/dev/null
wait "$held" 2>/dev/null
refused="$(grep -c "^request.*: 8 " "$tmp/held")"
per_tenant="$(grep -c "max_request_memory_per_tenant: tenant 'flood/'" "$tmp/held")"
echo "(held) the flood tenant's 48 steps: $((48 - refused)) held, $refused refused" \
  "($per_tenant for its share); another tenant's: $(grep "^request" "$tmp/other" | cut -c1-80)"
[[ "$refused" -gt 0 && "$per_tenant" -eq "$refused" ]] ||
  fail "(held) not held to the tenant's share: $(grep -v ": 4 " "$tmp/held" | head -5)"
flood_to="$(last_step "$tmp/run")"
kill -0 "$server" 2>/dev/null || fail "the planner died: $(cat "$tmp/server.log")"
peak_kib="$(awk '/^VmHWM/ {print $2}' "/proc/$server/status" 2>/dev/null)"
wait "$sim" || fail "train-sim exited non-zero: $(cat "$tmp/run.err")"
# Every step done and exact, and the service planned the run before the
# floods. A step may fall back to the local planner while a flood holds the
# machine: it is counted and its reason printed.
check_run "$tmp/run" "(memory)" 0 39 0 service $(seq 0 "$flood_from") ||
  fail "the run did not use the service before the floods: $(tail -20 "$tmp/run.err")"
local_steps="$(grep -c "local planner" "$tmp/run")"
echo "steps planned locally: $local_steps of 40"
[[ "$local_steps" -eq 0 ]] || grep "local planner" "$tmp/run.err" | head -3
kill -0 "$server" 2>/dev/null || fail "the planner died after the floods: $(cat "$tmp/server.log")"
# After them, a new run plans every step from the service.
KNAPFORMER_PLANNER_TOKEN="$run_token" KNAPFORMER_JOB_ID=memory timeout 120 "$train_sim" \
  --procs 4 --scale 32 --steps 4 --planner "127.0.0.1:$port" >"$tmp/after" 2>"$tmp/after.err" ||
  fail "the run after the floods exited non-zero: $(cat "$tmp/after.err")"
check_run "$tmp/after" "(after the floods)" 0 3 0 service 0 1 2 3 ||
  fail "the run after the floods did not use the service: $(tail -20 "$tmp/after.err")"

# The figures: peak RSS, and the run's planning latency ("waited" per step)
# before the floods and while they were sent and refused.
python3 - "$tmp/run" "$flood_from" "$flood_to" "${peak_kib:-0}" <<'PY'
import re, statistics, sys
path, first, last, peak_kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
waited = {int(s): float(ms) for s, ms in re.findall(
    r"^(\d+)\s+unbalanced.*\n\s+balanced.*waited ([\d.]+) ms\)$", open(path).read(), re.M)}
before = [waited[s] for s in waited if 1 <= s <= first]
during = [waited[s] for s in waited if first < s <= last + 1]
print(f"planner peak RSS {peak_kib / 1024:.0f} MiB under a {1 << 10} MiB limit; "
      f"planning latency p50 before {statistics.median(before):.1f} ms "
      f"(steps 1-{first}), during the floods {statistics.median(during):.1f} ms "
      f"(steps {first + 1}-{last + 1}, max {max(during):.1f} ms)" if during else
      f"planner peak RSS {peak_kib / 1024:.0f} MiB; the floods ended within one step")
PY
[[ "${peak_kib:-0}" -gt 0 && "$peak_kib" -lt $((limit / 1024)) ]] ||
  fail "the planner's peak RSS (${peak_kib:-?} KiB) is not under the limit"

echo "$failures failures"
[[ $failures -eq 0 ]]
