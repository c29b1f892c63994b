#!/bin/bash
# Proof with real processes (issue 37): three `knapformer serve` on loopback,
# train-sim (4 Gloo processes, group mode, every step's loss and gradients
# checked against unbalanced training by the binary itself) against all
# three through one target (ipv4:a,b,c). Mid-run, one replica is SIGKILLed
# and restarted 1 s later (a pod's restart), then the two others are, one
# after the other, stopped with SIGTERM and restarted (a rolling update),
# then one hangs (SIGSTOP) for 5 s.
# Every step must be planned by the service (0 local steps); each event's
# step-time cost (the plan wait of the steps it touched, above the run's
# median) is printed, and each SIGTERM's exit time is bounded. The same
# kill and restart against one replica shows the steps it loses (planned
# locally, still exact). Then speeds learned by the ranks plan every step
# whichever replica answers (issue 65). 127.0.0.1 only; every wait
# bounded; every process cleaned up.
set -u
knapformer="$1"
train_sim="$2"
tmp="$(mktemp -d)"
declare -a pid port
cleanup() {
  # train-sim runs in its own session (run_sim): its whole process group.
  for f in "$tmp"/*.pgid; do [[ -s "$f" ]] && kill -9 -- "-$(cat "$f")" 2>/dev/null; done
  for p in "${pid[@]}" $(jobs -p); do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  true
  rm -rf "$tmp"
}
trap cleanup EXIT
# fail, wait_for_port_file, wait_for_step, last_step
source "$(dirname "${BASH_SOURCE[0]}")/planner_process_lib.sh"
export KNAPFORMER_PLANNER_DEADLINE_SECONDS=10

# Starts replica $1 on port $2 (0: any); sets pid[$1] and port[$1].
start_replica() {
  local i="$1"
  rm -f "$tmp/port$i"
  "$knapformer" serve --listen "127.0.0.1:$2" --metrics off --log-level warning \
    --port-file "$tmp/port$i" >>"$tmp/replica$i.log" 2>&1 &
  pid[$i]=$!
  wait_for_port_file "$tmp/port$i" "$tmp/replica$i.log" || return 1
  port[$i]="$(cut -d' ' -f1 <"$tmp/port$i")"
}

# SIGKILL replica $1, and start it again on its port 1 s later.
kill_and_restart() {
  kill -9 "${pid[$1]}"
  wait "${pid[$1]}" 2>/dev/null
  sleep 1
  start_replica "$1" "${port[$1]}" || fail "replica $1 did not restart"
}

# SIGSTOP replica $1 for 5 s (a hung process: its connections stay open),
# then SIGCONT.
stop_for_5s() {
  kill -STOP "${pid[$1]}"
  sleep 5
  kill -CONT "${pid[$1]}"
}

# SIGTERM replica $1 (it drains and exits), then start it again on its port:
# one pod of a rolling update. Appends the exit time (ms) to $tmp/exits.
term_and_restart() {
  local start end
  start=$(date +%s%N)
  kill -TERM "${pid[$1]}"
  for _ in $(seq 200); do
    kill -0 "${pid[$1]}" 2>/dev/null || break
    sleep 0.01
  done
  end=$(date +%s%N)
  # Idle, it exits in milliseconds (a step in flight at most waits for its
  # answer); 2 s bounds a loaded CI machine.
  if kill -0 "${pid[$1]}" 2>/dev/null; then
    fail "replica $1 still running 2 s after SIGTERM"
    kill -9 "${pid[$1]}"
  fi
  wait "${pid[$1]}"
  local rc=$?
  [[ $rc -eq 0 ]] || fail "replica $1 exited $rc after SIGTERM"
  echo "$(((end - start) / 1000000))" >>"$tmp/exits"
  start_replica "$1" "${port[$1]}" || fail "replica $1 did not restart"
}

# Checks run output $1 (name $2, steps 0..$3-1, every step done and exact),
# prints each event's cost: event STEP per remaining argument (the last step
# shown when the event began), the cost being the largest plan wait of steps
# STEP+1..STEP+6 above the median wait (STEP>MS<MS: that wait must be over,
# under MS). With $4 = "service", every step must be the service's; else some
# step must have been planned locally.
check_run() {
  python3 - "$@" <<'PY' || return 1
import re, statistics, sys
path, name, steps, want, *events = sys.argv[1:]
text = open(path).read()
rows = re.findall(r"^(\d+)\s+unbalanced.*\n\s+balanced.*\((local planner|planner service)"
                  r"(?:, ahead)?, waited ([\d.]+) ms\)$", text, re.M)
got = [int(s) for s, _, _ in rows]
assert got == list(range(int(steps))), f"{name}: steps {got}\n{text}"
assert "FAILED" not in text and "largest relative loss difference" in text, f"{name}:\n{text}"
local = [int(s) for s, src, _ in rows if src == "local planner"]
wait = {int(s): float(ms) for s, _, ms in rows}
median = statistics.median(wait.values())
costs, slow = [], []
for event in events:
    e, limits = re.match(r"(\d+)(.*)", event).groups()
    worst = max(wait[s] for s in range(int(e) + 1, int(e) + 7) if s in wait)
    costs.append(f"after step {e}: +{worst - median:.1f} ms")
    for bound, ms in re.findall(r"([<>])([\d.]+)", limits):
        if (worst >= float(ms)) if bound == "<" else (worst <= float(ms)):
            slow.append(f"after step {e}: {worst:.0f} ms, not {bound} {ms}")
print(f"{name}: {len(got)} steps, {len(local)} planned locally {local}, "
      f"median plan wait {median:.1f} ms; " + "; ".join(costs))
assert not slow, f"{name}: " + "; ".join(slow)
if want == "service":
    assert not local, f"{name}: steps {local} were planned locally\n{text}"
else:
    assert local, f"{name}: no step was planned locally: the fault was not seen"
PY
}

run_sim() {  # output file, job id, target, then train-sim flags
  local out="$1" job="$2" target="$3"
  shift 3
  KNAPFORMER_JOB_ID="$job" setsid timeout 300 "$train_sim" --procs 4 --scale 32 --layers 1 \
    --planner "$target" "$@" >"$out" 2>"$out.err" &
  local child=$!
  echo "$child" >"$out.pgid"
  wait "$child"
}

for i in 0 1 2; do start_replica "$i" 0 || exit 1; done
target="ipv4:127.0.0.1:${port[0]},127.0.0.1:${port[1]},127.0.0.1:${port[2]}"

# Three replicas: SIGKILL replica 0 after step 8; roll replicas 1 and 2
# after steps 18 and 28; hang replica 0 for 5 s after step 38.
run_sim "$tmp/three" replicas-job "$target" --steps 50 &
sim=$!
events=()
for event in "8 kill_and_restart 0" "18 term_and_restart 1" "28 term_and_restart 2" \
  "38 stop_for_5s 0"; do
  read -r step action replica <<<"$event"
  if wait_for_step "$tmp/three" "$step"; then
    now="$(last_step "$tmp/three")"
    "$action" "$replica"
    # A hung replica holds one of the next steps (the proof it was asked)
    # until the client's keepalive finds it (1 s, then 1 s for the answer),
    # well before the SIGCONT 5 s later.
    if [[ "$action" == stop_for_5s ]]; then events+=("$now>1000<4500"); else events+=("$now"); fi
  else
    fail "three replicas: the run did not reach step $step: $(cat "$tmp/three" "$tmp/three.err")"
  fi
done
wait "$sim" || fail "three replicas: train-sim exited non-zero: $(cat "$tmp/three.err")"
check_run "$tmp/three" "three replicas" 50 service "${events[@]}" || failures=$((failures + 1))
echo "SIGTERM to exit, ms (each replica of the rolling update): $(tr '\n' ' ' <"$tmp/exits")"

# Speeds across replicas: rank 0's request carries the speeds the ranks
# learned, so whichever replica answers (round robin over the three) plans
# by them. Every "by speed" step is the service's, and from the fourth
# step on names rank 1 slow.
run_sim "$tmp/speeds" speeds-job "$target" --steps 8 --topology g1n4 \
  --data g2b16i512f1s0,g2b4i1024f1s0 --rank-speeds learned --slow-rank 1:0.3 ||
  fail "speeds over three replicas: train-sim exited non-zero: $(cat "$tmp/speeds.err")"
python3 - "$tmp/speeds" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
rows = re.findall(r"^\s+by speed\s+.*\((local planner|planner service)[^)]*\)(.*)$", text, re.M)
assert len(rows) == 8 and all(src == "planner service" for src, _ in rows), text
slow = [re.search(r"rank 1 (0\.\d+)", tail) for _, tail in rows[3:]]
assert all(m and float(m.group(1)) < 0.6 for m in slow), text
print("speeds over three replicas: every step planned by the service, rank 1 slow from step 3")
PY

# Prints the first step that run output $1 shows planned by the service
# after a step after $2 planned locally (bounded wait; nothing if none).
service_step_after() {
  for _ in $(seq 600); do
    python3 - "$1" "$2" <<'PY' && return 0
import re, sys
rows = re.findall(r"^(\d+)\s+unbalanced.*\n\s+balanced.*\((local planner|planner service)",
                  open(sys.argv[1]).read(), re.M)
local = [int(s) for s, src in rows if src == "local planner" and int(s) > int(sys.argv[2])]
back = [int(s) for s, src in rows if src == "planner service" and local and int(s) > local[0]]
print(back[0]) if back else sys.exit(1)
PY
    sleep 0.05
  done
}

# One replica (replica 0 alone): the same kill, then, once the run is back
# on the service, a SIGTERM restart.
rm -f "$tmp/exits"
run_sim "$tmp/one" one-replica-job "127.0.0.1:${port[0]}" --steps 40 &
sim=$!
events=()
if wait_for_step "$tmp/one" 8; then
  events+=("$(last_step "$tmp/one")")
  kill_and_restart 0
  back="$(service_step_after "$tmp/one" 8)"
  if [[ -n "$back" ]] && wait_for_step "$tmp/one" $((back + 2)); then
    events+=("$(last_step "$tmp/one")")
    term_and_restart 0
  else
    fail "one replica: the run did not come back to the service: $(cat "$tmp/one")"
  fi
else
  fail "one replica: the run did not reach step 8: $(cat "$tmp/one" "$tmp/one.err")"
fi
wait "$sim" || fail "one replica: train-sim exited non-zero: $(cat "$tmp/one.err")"
check_run "$tmp/one" "one replica" 40 local "${events[@]}" || failures=$((failures + 1))
echo "SIGTERM to exit, ms (one replica): $(tr '\n' ' ' <"$tmp/exits")"

echo "$failures failures"
[[ $failures -eq 0 ]]
