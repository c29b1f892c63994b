"""Worlds of spawned processes over a TCPStore (the CPU self-test's, killed_rank's):
every rank's outcome, a rank that overstays ended with its stack printed."""
import datetime
import faulthandler
import multiprocessing
import os
import queue
import signal
import time
import traceback

from knapformer._torch_compat import tcp_store
from knapformer.gpu_check.common import OK


def _store_barrier(store, key, size, timeout_s):
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while store.add(key, 0) < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not every process reached {key} within {timeout_s:g} s")
        time.sleep(0.05)


def _spawned(target, rank, size, port, payload, results):
    # A straggler's stack, printed when the parent gives up on it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    store = None

    def report_and_exit(value):
        results.put(("ok", rank, value))
        results.close()
        results.join_thread()
        return OK

    payload = dict(payload, report=report_and_exit)
    try:
        store = tcp_store("127.0.0.1", port, size + 1, False,
                          timeout=datetime.timedelta(seconds=payload["deadline_s"]))
        value = target(rank, size, store, payload)
        results.put(("ok", rank, value))
    except BaseException:  # noqa: BLE001  (everything goes to the parent)
        results.put(("error", rank, traceback.format_exc()))
    results.close()
    results.join_thread()
    if store is not None and payload.get("final_barrier"):
        # Exit together: a rank gone early can break its peers' last collective.
        try:
            _store_barrier(store, "knapformer_gpu_check/done", size, 30)
        except Exception:  # noqa: BLE001
            pass
    # Not torch's teardown: with a dead or stuck peer it can wait for ever.
    os._exit(0)


def _run_world(target, size, payload):
    """Runs target(rank, size, store, payload) in `size` spawned processes; every
    rank's outcome: ("ok", value), ("error", traceback), ("exited", code) for one
    that ended without a report, or ("timeout", text)."""
    deadline_s = payload["deadline_s"]
    context = multiprocessing.get_context("spawn")
    store = tcp_store("127.0.0.1", 0, size + 1, True,
                      timeout=datetime.timedelta(seconds=deadline_s), wait_for_workers=False)
    results = context.Queue()
    processes = [context.Process(target=_spawned, daemon=True,
                                 args=(target, r, size, store.port, payload, results))
                 for r in range(size)]
    for process in processes:
        process.start()
    outcomes, ended_at = {}, {}
    deadline = time.monotonic() + deadline_s
    try:
        while len(outcomes) < size and time.monotonic() < deadline:
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
                if now - ended_at.setdefault(rank, now) > 2.0:
                    outcomes[rank] = ("exited", process.exitcode)
        missing = [r for r in range(size) if r not in outcomes]
        for rank in missing:
            if processes[rank].is_alive():
                os.kill(processes[rank].pid, signal.SIGUSR1)
            outcomes[rank] = ("timeout", f"rank {rank} did not report within {deadline_s:g} s")
        if missing:
            time.sleep(1.0)  # the stacks reach stderr
    finally:
        for process in processes:
            process.join(timeout=max(0.1, min(10.0, deadline - time.monotonic())))
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
        del store
    return outcomes


def _world_results(outcomes, names):
    """{check: {rank: result, or why that rank has none}} from a world's outcomes."""
    per_check = {name: {} for name in names}
    for rank, (kind, value) in sorted(outcomes.items()):
        by_name = {r["name"]: r for r in value} if kind == "ok" else {}
        why = (f"rank {rank} failed outside the checks: {_last_line(value)}" if kind == "error"
               else f"rank {rank} exited with status {value} without reporting"
               if kind == "exited" else str(value))
        for name in names:
            per_check[name][rank] = by_name.get(name, why)
    return per_check


def _last_line(text):
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else str(text)
