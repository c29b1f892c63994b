"""The checks that run inside a world, in order on every rank, and the watchdog that
reports one that hangs instead of waiting for ever."""
import faulthandler
import os
import sys
import threading
import time
import traceback

from knapformer.gpu_check.common import FAILED, _one_line, _result
from knapformer.gpu_check.cuda_checks import _check_copy_bandwidth, _check_side_stream
from knapformer.gpu_check.fsdp_checks import _check_compiled_block, _check_fsdp2_checkpoint
from knapformer.gpu_check.host_syncs import _check_host_syncs
from knapformer.gpu_check.nccl_checks import _check_nccl_group, _check_raw_nccl
from knapformer.gpu_check.step_checks import _check_python_step, _check_route_vs_all_to_all


class _Watchdog:
    """Ends the process with a report when one check runs past its bound. The
    exchanges release the GIL, so this thread runs while the main one waits; without
    it a GPU hang would end only at NCCL's watchdog, which reports nothing."""

    def __init__(self, bound_s, on_hang):
        self._bound_s = bound_s
        self._on_hang = on_hang
        self._lock = threading.Lock()
        self._name = None
        self._since = 0.0
        threading.Thread(target=self._run, daemon=True).start()

    def watch(self, name):
        with self._lock:
            self._name, self._since = name, time.monotonic()

    def clear(self):
        with self._lock:
            self._name = None

    def _run(self):
        while True:
            time.sleep(0.5)
            with self._lock:
                name, since = self._name, self._since
            if name is None or time.monotonic() - since <= self._bound_s:
                continue
            print(f"gpu_check: {name} has run for more than {self._bound_s:g} s "
                  "(--timeout-s): reporting it as hung and ending the run; every "
                  "thread's stack follows", file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
            status = FAILED
            try:
                status = self._on_hang(name)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)


def _hung_results(results, name, bound_s, reasons):
    done = list(results)
    done.append(_result(name, "FAIL", f"did not finish within {bound_s:g} s (--timeout-s): "
                                      "hung; the run ended there"))
    for other, _ in _WORLD_CHECKS[len(done):]:
        done.append(_result(other, "SKIP", reasons.get(other) or "not run: an earlier "
                                                                  "check hung"))
    return done


_WORLD_CHECKS = (("nccl_group", _check_nccl_group), ("raw_nccl", _check_raw_nccl),
                 ("python_step", _check_python_step), ("side_stream", _check_side_stream),
                 ("host_syncs", _check_host_syncs), ("copy_bandwidth", _check_copy_bandwidth),
                 ("route_vs_all_to_all", _check_route_vs_all_to_all),
                 ("fsdp2_checkpoint", _check_fsdp2_checkpoint),
                 ("compiled_block", _check_compiled_block))


def _world_checks(ctx, reasons):
    """Every check that runs inside the world, in order, on every rank."""
    results = []
    bound_s = ctx.opts.timeout_s
    watchdog = None
    if ctx.on_hang is not None:
        watchdog = _Watchdog(bound_s, lambda name: ctx.on_hang(
            _hung_results(results, name, bound_s, reasons)))
    for name, check in _WORLD_CHECKS:
        if reasons.get(name):
            results.append(_result(name, "SKIP", reasons[name]))
            continue
        if watchdog is not None:
            watchdog.watch(name)
        began = time.monotonic()
        try:
            result = check(ctx)
        except Exception as error:  # noqa: BLE001  (a check that raises FAILs; the rest go on)
            result = _result(name, "FAIL", f"{type(error).__name__}: {_one_line(error)}")
            result["traceback"] = traceback.format_exc()
        result["seconds"] = round(time.monotonic() - began, 3)
        results.append(result)
        try:
            ctx.synchronize()
            ctx.barrier()  # a check that failed on one rank only must not skew the next
            if name == "raw_nccl":
                # The side-stream check uses the transport only where every rank has it.
                usable = ctx.transport is not None and not ctx.transport.aborted
                if not all(ctx.gather(usable)):
                    ctx.transport = None
        except Exception as error:  # noqa: BLE001
            result["detail"] += f" (the ranks did not meet after it: {_one_line(error)})"
            if result["verdict"] != "SKIP":
                result["verdict"] = "FAIL"
        if watchdog is not None:
            watchdog.clear()
    ctx.transport = None
    return results
