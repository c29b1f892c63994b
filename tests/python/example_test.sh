#!/bin/bash
# examples/train_dit.py under torchrun (the README's command, on a free
# rendezvous port): it exits 0 only when the balanced and unbalanced runs
# agree on losses and gradients; every step is reported, and the planned
# max/mean after balancing is below the unbalanced one. Timings are figures,
# not checked here. --scale 32 (lengths / 32, the example's default is 8):
# what is checked does not depend on the lengths, and a run costs 2.5x less.
#   example_test.sh PYTHON   (the interpreter the package was built for)
# torchrun, or knapformer.launch where torchrun cannot start (see
# tests/testing/launcher.sh); the log says which ran.
set -euo pipefail
python="$1"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="$runfiles/python"
out="$TEST_TMPDIR/train_dit.log"
cd "$TEST_TMPDIR"
status=0
# shellcheck source=tests/testing/launcher.sh
source "$runfiles/tests/testing/launcher.sh"
choose_launcher "$python" 4
timeout 600 "$python" "${launcher[@]}" \
  "$runfiles/examples/train_dit.py" --steps 2 --scale 32 --print-imbalance >"$out" 2>&1 || status=$?
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
[[ $status -eq 0 ]] || fail "train_dit.py exited $status"
for step in 0 1; do
  grep -q "step $step unbalanced: compute per rank" "$out" || fail "no unbalanced line for step $step"
  grep -q "step $step   balanced: compute per rank" "$out" || fail "no balanced line for step $step"
done
grep -q "losses and gradients agree" "$out" || fail "losses and gradients do not agree"
"$python" - "$out" <<'PY' || fail "planned max/mean did not improve"
import re, sys
pairs = re.findall(r"max/mean ([0-9.]+) ---> ([0-9.]+)", open(sys.argv[1]).read())
assert len(pairs) == 2, pairs
assert all(float(after) < float(before) for before, after in pairs), pairs
PY
echo "PASS: $(grep 'slowest-rank compute' "$out")"

# Block-causal attention planned with the masks: the balancer names the
# masks of the sequences each rank holds after pre_attn, and attention
# built from them agrees with the unbalanced run.
status=0
timeout 600 "$python" "${launcher[@]}" \
  "$runfiles/examples/train_dit.py" --steps 2 --scale 32 --block-causal 16 >"$out" 2>&1 || status=$?
[[ $status -eq 0 ]] || fail "train_dit.py --block-causal 16 exited $status"
grep -q "\[block-causal 16\] slowest-rank compute" "$out" || fail "no --block-causal summary"
grep -q "losses and gradients agree" "$out" || fail "--block-causal: losses and gradients do not agree"
echo "PASS: $(grep 'slowest-rank compute' "$out")"
