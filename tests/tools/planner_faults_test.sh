#!/bin/bash
# train-sim (4 Gloo processes, every step's loss and gradients checked
# against unbalanced training by the binary itself) against a planner
# service in its own process, while the planner is
#   (a) stopped with SIGSTOP for longer than the client's deadline, then resumed,
#   (b) killed with SIGKILL and restarted on the same port,
#   (c) live while a run crashes after step 12 and resumes from step 8,
#   (d) asked for a step of the run's job first by a stranger with another spec,
#   (e) slow: every answer (steps and probes) held back past the deadline
#       for 6 s (serve --answer-delay-file), then prompt again,
#   (f) killed and restarted as in (b), while the run plans every step
#       ahead (train-sim --plan-ahead 1).
# Every step must complete; at most one step per fault plans for longer than
# the deadline; after (a), (b) and (e) later steps come from the service
# again; the resumed run's replayed steps and the stranger's step come from
# the service (other incarnations never meet the run).
# 127.0.0.1 only; every wait bounded; every process cleaned up.
set -u
knapformer="$1"
train_sim="$2"
drive="$3"
tmp="$(mktemp -d)"
server=""
cleanup() {
  for pid in $server $(jobs -p); do
    kill -CONT "$pid" 2>/dev/null
    kill -9 "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# fail, wait_for_port_file, wait_for_step, check_run
source "$(dirname "${BASH_SOURCE[0]}")/planner_process_lib.sh"
export KNAPFORMER_PLANNER_DEADLINE_SECONDS=2

# Starts the planner on port $1 (0: any), sets $server and $port.
start_server() {
  rm -f "$tmp/port"
  "$knapformer" serve --listen "127.0.0.1:$1" --metrics off --rendezvous-timeout-ms 30000 \
    --log-level warning --port-file "$tmp/port" --answer-delay-file "$tmp/delay" \
    >>"$tmp/server.log" 2>&1 &
  server=$!
  wait_for_port_file "$tmp/port" "$tmp/server.log" || return 1
  port="$(cut -d' ' -f1 <"$tmp/port")"
}

run_sim() {  # output file, job id, then train-sim flags
  local out="$1" job="$2"
  shift 2
  KNAPFORMER_JOB_ID="$job" timeout 300 "$train_sim" --procs 4 --scale 32 \
    --planner "127.0.0.1:$port" "$@" >"$out" 2>"$out.err"
}

start_server 0 || exit 1

# A 30-step run ($2, job id $3) that meets fault $4 (a function) once it has
# done step 5; it must finish every step with at most one past the deadline,
# and come back to the service after step 6. Further arguments are
# train-sim flags; with --plan-ahead 1 every step after the first must have
# been planned ahead, through the fault too.
run_through_fault() {
  local name="$1" out="$2" job="$3" fault="$4"
  shift 4
  local expect=()
  [[ "$*" == *"--plan-ahead 1"* ]] && expect=(ahead)
  run_sim "$out" "$job" --steps 30 "$@" &
  local sim=$!
  if wait_for_step "$out" 5; then
    "$fault"
  else
    fail "$name the run did not reach step 5: $(cat "$out" "$out.err")"
  fi
  wait "$sim" || fail "$name train-sim exited non-zero: $(cat "$out.err")"
  if ! check_run "$out" "$name" 0 29 1 "${expect[@]}" service-after 6; then
    failures=$((failures + 1))
    # Why each step went local (the client logs it), for the next reader.
    grep "planned locally" "$out.err" | head -5
  fi
}

# (a) SIGSTOP for 5 s (the deadline is 2 s), then SIGCONT.
stop_for_5s() {
  kill -STOP "$server"
  sleep 5
  kill -CONT "$server"
}
run_through_fault "(a) SIGSTOP" "$tmp/a" stop-job stop_for_5s

# (b) SIGKILL, and a new planner on the same port 1 s later.
kill_and_restart() {
  kill -9 "$server"
  wait "$server" 2>/dev/null
  sleep 1
  start_server "$port" || fail "(b) the planner did not restart on port $port"
}
run_through_fault "(b) SIGKILL" "$tmp/b" kill-job kill_and_restart

# (f) as (b), planning each step while the previous one computes.
run_through_fault "(f) SIGKILL, planning ahead" "$tmp/f" ahead-job kill_and_restart --plan-ahead 1

# (c) steps 0..12, a crash, and the run again from its checkpoint of step 8
# with the same job id: the replayed steps 8..12 were answered already, for
# the first run's incarnation.
run_sim "$tmp/c1" resume-job --steps 13 || fail "(c) first run: $(cat "$tmp/c1.err")"
run_sim "$tmp/c2" resume-job --first-step 8 --steps 12 ||
  fail "(c) resumed run exited non-zero: $(cat "$tmp/c2.err")"
check_run "$tmp/c2" "(c) resumed" 8 19 0 service-after 12 service 8 9 10 11 12 ||
  failures=$((failures + 1))

# (d) a stranger asks for step 3 of the run's job first, with its own spec.
"$drive" "$port" stranger-job stranger 3 >"$tmp/stranger" 2>&1 &
for _ in $(seq 100); do grep -q "asking" "$tmp/stranger" && break; sleep 0.1; done
sleep 0.5
run_sim "$tmp/d" stranger-job --steps 6 || fail "(d) train-sim exited non-zero: $(cat "$tmp/d.err")"
check_run "$tmp/d" "(d) stranger" 0 5 0 service-after 3 service 3 || failures=$((failures + 1))

# (e) answers held back 4 s (the deadline is 2 s) for 6 s.
slow_for_6s() {
  echo 4000 >"$tmp/delay"
  sleep 6
  rm -f "$tmp/delay"
}
run_through_fault "(e) slow" "$tmp/e" slow-job slow_for_6s

echo "$failures failures"
[[ $failures -eq 0 ]]
