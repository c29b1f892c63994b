"""Starts N copies of a training script on this machine, as torchrun does for
one node, where torchrun cannot:

    python3 -m knapformer.launch --nproc_per_node 4 examples/train_dit.py --steps 2

torch 2.4+ makes TCPStores on libuv by default, and a torch built without
libuv (Debian's 2.6) refuses them, torchrun's own rendezvous stores among
them. This launcher gives each copy torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and a free
MASTER_PORT, where rank 0's init_process_group("env://") starts the job's
store), plus USE_LIBUV=0 where libuv is missing. When a copy fails, the
others are stopped and the launcher exits with the failed copy's status.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from knapformer._torch_compat import default_tcp_store_works


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m knapformer.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc_per_node", "--nproc-per-node", type=int, required=True,
                        help="copies to start (ranks 0..N-1)")
    parser.add_argument("--master_addr", default="127.0.0.1",
                        help="address rank 0 hosts the job's store on (default 127.0.0.1)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1:
        parser.error(f"--nproc_per_node: {args.nproc_per_node} is not a positive count")
    size = args.nproc_per_node

    base = dict(os.environ)
    base.update({
        "MASTER_ADDR": args.master_addr, "MASTER_PORT": str(_free_port(args.master_addr)),
        "WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "GROUP_RANK": "0",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "knapformer-launch",
    })
    base.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # rank 0 hosts the store
    if not default_tcp_store_works():
        base["USE_LIBUV"] = "0"
    copies = []
    for rank in range(size):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank),
                   ROLE_WORLD_SIZE=str(size))
        copies.append(subprocess.Popen([sys.executable, args.script, *args.args], env=env))

    status = 0
    try:
        while True:
            codes = [c.poll() for c in copies]  # every copy, each round
            failed = [code for code in codes if code not in (None, 0)]
            if failed:
                status = failed[0]
                break
            if all(code == 0 for code in codes):
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    finally:
        _stop(copies)
    if status != 0:
        print(f"knapformer.launch: a copy of {args.script} exited {status}; stopped the others",
              file=sys.stderr)
    return status if status >= 0 else 128 - status  # killed by a signal: 128 + its number


def _free_port(address):
    # Free now; rank 0 binds it a moment later (as torchrun's own port pick).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]


def _stop(copies, grace=10.0):
    for c in copies:
        if c.poll() is None:
            c.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for c in copies:
        try:
            c.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            c.wait()


if __name__ == "__main__":
    sys.exit(main())
