#!/bin/bash
# The wheel installs with pip into a fresh virtualenv made with
# --system-site-packages (so that it sees Debian's torch), and the installed
# package works from outside the source tree: its files come from the venv,
# it plans, and two Gloo processes route and reverse-route through it.
#   wheel_install_test.sh PYTHON WHEEL   (the interpreter it was built for)
set -euo pipefail
python="$1"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
wheel="$runfiles/$2"
venv="$TEST_TMPDIR/venv"
fail() { echo "FAIL: $*"; exit 1; }

unzip -l "$wheel" >"$TEST_TMPDIR/contents" 2>/dev/null || "$python" -m zipfile -l "$wheel" >"$TEST_TMPDIR/contents"
for member in knapformer/__init__.py knapformer/_C.so knapformer-0.1.0.dist-info/RECORD; do
  grep -q "$member" "$TEST_TMPDIR/contents" || fail "the wheel lacks $member"
done

"$python" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --no-index --no-deps "$wheel" || fail "pip install refused the wheel"

cd "$TEST_TMPDIR"  # nothing of the source tree on the path
unset PYTHONPATH
# A file, not stdin: spawned workers import the main module again.
cat >check_installed.py <<'PY'
import sys, datetime, multiprocessing, os
import torch
import knapformer
from knapformer._torch_compat import tcp_store

venv = sys.argv[1]
assert knapformer.__file__.startswith(venv), knapformer.__file__
assert knapformer._C.__file__.startswith(venv), knapformer._C.__file__
plan = knapformer.plan([[5, 9], [30]], "g1n2", d_model=16, gamma=1.0)
assert plan["total_tokens"] == 44, plan


def worker(rank, port, results):
    import torch.distributed as dist
    store = tcp_store("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    balancer = knapformer.SequenceBalancer("g2n1")
    lens = [[5, 9], [30]][rank]
    balancer.plan_routing(lens, 8)
    x = torch.randn(sum(lens), 8)
    _, routed, _ = balancer.route(x)
    seq_lens, back, _ = balancer.reverse_route(routed)
    results.put((rank, torch.equal(back, x) and seq_lens.tolist() == lens))


if __name__ == "__main__":
    import torch.distributed as dist
    store = tcp_store("127.0.0.1", 0, 3, True, timeout=datetime.timedelta(seconds=60),
                      wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=worker, args=(r, store.port, results)) for r in range(2)]
    for p in procs:
        p.start()
    outcomes = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    assert outcomes == {0: True, 1: True}, outcomes
    print("installed package: plan and a 2-process route round trip work")
PY
timeout 300 "$venv/bin/python3" check_installed.py "$venv" || fail "the installed package does not work"
echo "PASS"
