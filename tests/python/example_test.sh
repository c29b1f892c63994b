#!/bin/bash
# examples/train_dit.py under torchrun (the README's command, on a free
# rendezvous port): it exits 0 only when the balanced and unbalanced runs
# agree on losses and gradients; every step is reported, and the planned
# max/mean after balancing is below the unbalanced one. Timings are figures,
# not checked here.
set -euo pipefail
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="$runfiles/python"
out="$TEST_TMPDIR/train_dit.log"
cd "$TEST_TMPDIR"
status=0
timeout 600 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 --redirects 1 --tee 1 \
  --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:0 \
  "$runfiles/examples/train_dit.py" --steps 2 --print-imbalance >"$out" 2>&1 || status=$?
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
[[ $status -eq 0 ]] || fail "train_dit.py exited $status"
for step in 0 1; do
  grep -q "step $step unbalanced: compute per rank" "$out" || fail "no unbalanced line for step $step"
  grep -q "step $step   balanced: compute per rank" "$out" || fail "no balanced line for step $step"
done
grep -q "losses and gradients agree" "$out" || fail "losses and gradients do not agree"
/usr/bin/python3 - "$out" <<'PY' || fail "planned max/mean did not improve"
import re, sys
pairs = re.findall(r"max/mean ([0-9.]+) ---> ([0-9.]+)", open(sys.argv[1]).read())
assert len(pairs) == 2, pairs
assert all(float(after) < float(before) for before, after in pairs), pairs
PY
echo "PASS: $(grep 'slowest-rank compute' "$out")"
