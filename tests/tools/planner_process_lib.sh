# Shell helpers shared by the tests that run `knapformer serve` and
# train-sim as real processes (planner_faults_test, planner_replicas_test).
# Sourced; uses the caller's `fail`.

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
