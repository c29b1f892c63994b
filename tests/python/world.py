"""N processes on one TCPStore and a Gloo process group over 127.0.0.1, for
the Python package's multi-process tests.

run_world(fn, size, *args) starts `size` spawned processes, runs
fn(rank, size, *args) in each after torch.distributed.init_process_group,
and returns every rank's result. Every wait is bounded: a world that does
not finish within `timeout` seconds is killed and the test fails naming the
ranks that were still running; a rank that raises fails the test with its
traceback. The ranks see no GPU (CUDA_VISIBLE_DEVICES=""), also on a host
that has some.
"""
import datetime
import faulthandler
import multiprocessing
import os
import queue
import signal
import time
import traceback


class WorldFailure(AssertionError):
    pass


def _worker(rank, size, port, fn, args, results, group_timeout, backend):
    import torch
    import torch.distributed as dist
    from knapformer._torch_compat import tcp_store

    torch.set_num_threads(1)  # two cores shared by up to 8 ranks
    # A straggler's stack, printed when run_world gives up on it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        store = tcp_store("127.0.0.1", port, size, False,
                          timeout=datetime.timedelta(seconds=group_timeout))
        # backend None: torch 2.x's default, one backend per device.
        dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=group_timeout))
        value = fn(rank, size, *args)
        results.put(("ok", rank, value))
    except BaseException:  # noqa: BLE001  (report everything to the parent)
        results.put(("error", rank, traceback.format_exc()))
        return
    # The report is on its way before the teardown: on Debian's CUDA torch
    # 2.6 destroy_process_group() was seen to block now and then, holding
    # the GIL, which kept the queue's feeder thread from sending it.
    results.close()
    results.join_thread()
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass


def timed(fn):
    """(error type name, message, seconds) of fn(); (None, None, seconds) when
    it raises no ValueError or RuntimeError (the balancer's agreed errors)."""
    start = time.monotonic()
    try:
        fn()
    except (ValueError, RuntimeError) as e:
        return type(e).__name__, str(e), time.monotonic() - start
    return None, None, time.monotonic() - start


def run_world(fn, size, *args, timeout=240, group_timeout=60, allow_errors=False,
              backend="gloo"):
    """fn's result by rank. With allow_errors, a rank that raised gives
    ("error", traceback) and one that exited without a report ("exited",
    exit code) instead of failing the run."""
    from knapformer._torch_compat import tcp_store

    context = multiprocessing.get_context("spawn")
    store = tcp_store("127.0.0.1", 0, size + 1, True,
                      timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False)
    results = context.Queue()
    processes = [context.Process(target=_worker,
                                 args=(r, size, store.port, fn, args, results, group_timeout,
                                       backend),
                                 daemon=True)
                 for r in range(size)]
    # These are CPU worlds: on a host with GPUs, a backend-less group or FSDP2
    # would otherwise put every rank on cuda:0 (NCCL refuses two ranks on one
    # device). The children take the environment at start.
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        for p in processes:
            p.start()
    finally:
        if shown is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = shown
    outcomes = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(size)) - set(outcomes))
                for r in missing:  # their stacks go to the test log
                    if processes[r].is_alive():
                        os.kill(processes[r].pid, signal.SIGUSR1)
                time.sleep(2)
                raise WorldFailure(f"ranks {missing} did not finish within {timeout} s; "
                                   f"finished: {sorted(outcomes)}")
            try:
                kind, rank, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(processes)
                        if not p.is_alive() and r not in outcomes and p.exitcode not in (0, None)]
                if dead:
                    # Give the queue a moment: a rank's report may still be in flight.
                    time.sleep(1.0)
                    while True:
                        try:
                            kind, rank, value = results.get_nowait()
                            outcomes[rank] = (kind, value)
                        except queue.Empty:
                            break
                    dead = [r for r in dead if r not in outcomes]
                    if dead:
                        raise WorldFailure(f"ranks {dead} died without a report (exit codes "
                                           f"{[processes[r].exitcode for r in dead]})")
                if allow_errors:
                    # A rank meant to die (os._exit) is an outcome of its own.
                    for r, p in enumerate(processes):
                        if r not in outcomes and not p.is_alive() and p.exitcode is not None:
                            time.sleep(0.5)
                            try:
                                kind, rank, value = results.get_nowait()
                                outcomes[rank] = (kind, value)
                            except queue.Empty:
                                pass
                            if r not in outcomes:
                                outcomes[r] = ("exited", p.exitcode)
                continue
            outcomes[rank] = (kind, value)
    finally:
        for p in processes:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        del store
    errors = {r: v for r, (k, v) in outcomes.items() if k == "error"}
    if errors and not allow_errors:
        raise WorldFailure("\n".join(f"---- rank {r}\n{tb}" for r, tb in sorted(errors.items())))
    if allow_errors:
        return [outcomes[r] for r in range(size)]
    return [outcomes[r][1] for r in range(size)]

