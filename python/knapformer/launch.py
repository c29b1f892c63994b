"""Local ranks on this machine: the package's one launcher of them.

As a command, it starts N copies of a training script, as torchrun does for
one node, where torchrun cannot:

    python3 -m knapformer.launch --nproc_per_node 4 examples/train_dit.py --steps 2

torch 2.4+ makes TCPStores on libuv by default, and a torch built without
libuv (Debian's 2.6) refuses them, torchrun's own rendezvous stores among
them. This launcher gives each copy torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and a free
MASTER_PORT, where rank 0's init_process_group("env://") starts the job's
store), plus USE_LIBUV=0 where libuv is missing. When a copy fails, the
others are stopped and the launcher exits with the failed copy's status.

As a library, run_ranks(target, size, ...) runs a function in N spawned
processes over one TCPStore on 127.0.0.1 and returns every rank's outcome,
every wait bounded (the GPU check, the benchmarks), and run_world(fn, size,
...) does so inside a process group, failing on any rank's error (the
package's multi-process tests).
"""
import argparse
import datetime
import faulthandler
import multiprocessing
import multiprocessing.reduction
import os
import queue
import signal
import socket
import subprocess
import sys
import time
import traceback

from knapformer._torch_compat import default_tcp_store_works, tcp_store

# In a rank started by run_ranks: sends this rank's outcome to the parent.
_report = None


class WorldFailure(AssertionError):
    """A world run by run_world failed: a rank raised, died or overstayed."""


def report(value):
    """In a rank started by run_ranks: this rank's outcome is ("ok", value)
    from now on, whatever the rank does next (a check that is about to hang
    reports what it has first). The rank's later outcome is ignored."""
    if _report is None:
        raise RuntimeError("knapformer.launch.report: not in a rank started by run_ranks")
    _report(value)


def store_barrier(store, key, size, timeout_s):
    """Returns once `size` processes have called it with this key on this
    store (a barrier without a process group); raises RuntimeError after
    timeout_s."""
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every process reached {key} within {timeout_s:g} s")
        time.sleep(0.05)


class _ParentStdio:
    """The parent's stdout and stderr as they are when a rank starts, passed
    to the rank (a forkserver's child would otherwise write where the server
    did when it started, not where the parent writes now: a test capturing
    its ranks' output would see nothing)."""

    def __reduce__(self):
        return _adopt_stdio, (multiprocessing.reduction.DupFd(1),
                              multiprocessing.reduction.DupFd(2))


def _adopt_stdio(out, err):
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.detach(), 1)
    os.dup2(err.detach(), 2)


def _rank_main(target, rank, size, port, args, results, options):
    global _report
    # The parent's environment as it is now (a forkserver's child starts
    # with the environment the server started with).
    os.environ.clear()
    os.environ.update(options["environ"])
    # A straggler's stack, printed when the parent gives up on it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    reported = []

    def send(kind, value):
        if reported:
            return
        reported.append(kind)
        results.put((kind, rank, value))
        results.close()
        results.join_thread()

    _report = lambda value: send("ok", value)  # noqa: E731
    store = None
    try:
        import torch
        import torch.distributed as dist
        if options["threads"]:
            torch.set_num_threads(options["threads"])
        store = tcp_store("127.0.0.1", port, size + 1, False,
                          timeout=datetime.timedelta(seconds=options["store_timeout_s"]))
        if options["backend"] is not None or options["group"]:
            # backend None: torch 2.x's default, one backend per device.
            dist.init_process_group(
                options["backend"], store=store, rank=rank, world_size=size,
                timeout=datetime.timedelta(seconds=options["group_timeout_s"]))
            send("ok", target(rank, size, *args))
            # The report is on its way before the teardown: on Debian's CUDA
            # torch 2.6 destroy_process_group() was seen to block now and then.
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        else:
            send("ok", target(rank, size, store, *args))
    except BaseException:  # noqa: BLE001  (everything goes to the parent)
        send("error", traceback.format_exc())
    if store is not None and options["exit_together"]:
        # Exit together: a rank gone early can break its peers' last collective.
        try:
            store_barrier(store, "knapformer_launch/done", size, 30)
        except Exception:  # noqa: BLE001
            pass
    # Not torch's teardown at exit: with a dead or stuck peer it can wait for ever.
    os._exit(0)


_CONTEXT = None


def _context():
    """Ranks are forked from a server process that has imported torch and
    knapformer once: a rank then starts in milliseconds instead of importing
    torch anew (about a CPU second each). No CUDA is initialised there, so
    ranks may use GPUs."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["torch", "torch.distributed", "knapformer"])
    return _CONTEXT


def run_ranks(target, size, args=(), *, timeout_s, store_timeout_s=None, backend=None,
              group=False, group_timeout_s=60, threads=None, hide_gpus=False,
              exit_together=False, fail_fast=False):
    """Runs target in `size` spawned processes (ranks 0..size-1) over one
    TCPStore on 127.0.0.1 and returns every rank's outcome, by rank:
    ("ok", value), ("error", traceback), ("exited", code) for a process that
    ended without a report, or ("timeout", text) for one still running after
    timeout_s (its stack is printed first) or stopped by fail_fast.

    target(rank, size, store, *args) by default; with a `backend` (or
    group=True for torch 2.x's default one) the rank first joins a process
    group of that backend over the store (group_timeout_s) and target(rank,
    size, *args) runs inside it. threads: torch's intra-op threads per rank
    (ranks share the machine's cores). hide_gpus: the ranks see no GPU (CPU
    worlds on a host with GPUs: NCCL refuses two ranks on one device).
    exit_together: ranks wait for each other before exiting. fail_fast: a
    rank that dies without a report stops the others at once.
    """
    environ = dict(os.environ)
    if hide_gpus:
        environ["CUDA_VISIBLE_DEVICES"] = ""
    options = {"backend": backend, "group": group, "group_timeout_s": group_timeout_s,
               "threads": threads, "exit_together": exit_together,
               "store_timeout_s": store_timeout_s or timeout_s, "environ": environ}
    context = _context()
    store = tcp_store("127.0.0.1", 0, size + 1, True,
                      timeout=datetime.timedelta(seconds=options["store_timeout_s"]),
                      wait_for_workers=False)
    results = context.Queue()
    processes = [context.Process(target=_rank_main, daemon=True,
                                 args=(target, r, size, store.port, args, results,
                                       dict(options, stdio=_ParentStdio())))
                 for r in range(size)]
    for process in processes:
        process.start()
    outcomes, ended_at = {}, {}
    deadline = time.monotonic() + timeout_s
    failed = False
    try:
        while len(outcomes) < size and time.monotonic() < deadline and not failed:
            try:
                kind, rank, value = results.get(timeout=0.5)
                outcomes[rank] = (kind, value)
                continue
            except queue.Empty:
                pass
            now = time.monotonic()
            for rank, process in enumerate(processes):
                if rank in outcomes or process.exitcode is None:
                    continue
                # Its report may still be in the pipe for a moment after it exits.
                if now - ended_at.setdefault(rank, now) > 1.5:
                    outcomes[rank] = ("exited", process.exitcode)
                    failed = fail_fast
        missing = [r for r in range(size) if r not in outcomes]
        for rank in missing:
            if processes[rank].is_alive() and not failed:
                os.kill(processes[rank].pid, signal.SIGUSR1)
            why = "stopped: another rank failed" if failed else \
                f"rank {rank} did not report within {timeout_s:g} s"
            outcomes[rank] = ("timeout", why)
        if missing and not failed:
            time.sleep(1.0)  # the stacks reach stderr
    finally:
        for process in processes:
            process.join(timeout=0 if failed else max(0.1, min(10.0, deadline - time.monotonic())))
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        del store
    return [outcomes[r] for r in range(size)]


def run_world(fn, size, *args, timeout=240, group_timeout=60, allow_errors=False,
              backend="gloo"):
    """fn(rank, size, *args) in `size` CPU processes inside a process group of
    `backend` (None: torch 2.x's default), one intra-op thread each: every
    rank's result, by rank. Raises WorldFailure naming the ranks when one
    raises (with its traceback), dies without a report or does not finish
    within `timeout` s. With allow_errors, a rank that raised gives ("error",
    traceback) and one that exited without a report ("exited", exit code)
    instead, and the others' results are ("ok", value)."""
    # A rank's store waits end with its group's (group_timeout), so a rank
    # waiting on a dead peer raises rather than outliving the world.
    outcomes = run_ranks(fn, size, args, timeout_s=timeout, store_timeout_s=group_timeout,
                         backend=backend, group=backend is None, group_timeout_s=group_timeout,
                         threads=1, hide_gpus=True, fail_fast=not allow_errors)
    if allow_errors:
        late = [r for r, (kind, _) in enumerate(outcomes) if kind == "timeout"]
        if late:
            raise WorldFailure(f"ranks {late} did not finish within {timeout} s")
        return outcomes
    dead = [r for r, (kind, _) in enumerate(outcomes) if kind == "exited"]
    if dead:
        raise WorldFailure(f"ranks {dead} died without a report (exit codes "
                           f"{[outcomes[r][1] for r in dead]})")
    errors = {r: value for r, (kind, value) in enumerate(outcomes) if kind == "error"}
    if errors:
        raise WorldFailure("\n".join(f"---- rank {r}\n{tb}" for r, tb in sorted(errors.items())))
    late = [r for r, (kind, _) in enumerate(outcomes) if kind == "timeout"]
    if late:
        finished = [r for r in range(size) if r not in late]
        raise WorldFailure(f"ranks {late} did not finish within {timeout} s; finished: {finished}")
    return [value for _, value in outcomes]


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m knapformer.launch",
        description="Starts N copies of a training script on this machine, as torchrun does "
                    "for one node, where torchrun cannot.")
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
