"""What runs inside a world, on every rank: one rank's Context (the world the checks
run in and what several of them share) and the checks that run inside it
(each check module's WORLD_CHECKS, in CHECKS's order), under a watchdog that reports
a check running past --timeout-s as hung and ends the process.

Apart from the harness, which starts the worlds (knapformer.launch, torchrun, one
GPU) and merges their results: this is what each of their ranks runs."""
import faulthandler
import os
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

from knapformer import _C
from knapformer.gpu_check import cuda_checks, fsdp_checks, hub_checks, step_checks
from knapformer.gpu_check.options import CHECKS
from knapformer.gpu_check.report import FAILED, one_line, result

GAMMA = 0.49


def _group_timeout_s(opts):
    # Past the per-check bound, so that a hang is reported by the watchdog
    # (_Watchdog) before a timeout ends the process.
    return opts.timeout_s + 60


# -- one rank's view of the world ---------------------------------------------------------

class Context:
    """One rank's view of the world the checks run in, and what several checks share:
    the topologies that fit, token ids that name their origin, the planner's table of
    them, timing and splitting rows."""

    def __init__(self, rank, size, device, opts, host_group, fault, local_rank=None,
                 init_seconds=0.0):
        self.rank = rank
        self.size = size
        self.device = device
        self.cuda = device.type == "cuda"
        self.opts = opts
        self.host_group = host_group  # Gloo: the checks' own small collectives
        self.fault = fault
        self.local_rank = rank if local_rank is None else local_rank
        self.init_seconds = init_seconds
        self.gamma = GAMMA
        self.group_timeout_s = _group_timeout_s(opts)  # process groups', the raw transport's
        self.transport = None
        self.on_hang = None  # results so far -> exit status, when a check hangs
        self.topologies = _topologies(size)
        self.scale = 4 if self.cuda else 1  # sequence lengths: small on shared CPU cores

    def gather(self, value):
        everyone = [None] * self.size
        dist.all_gather_object(everyone, value, group=self.host_group)
        return everyone

    def barrier(self):
        dist.barrier(group=self.host_group)

    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def token_ids(self, lens, rank=None):
        # Every token's id names its rank, sequence and offset, so a misplaced row shows.
        # `rank`: another (simulated) rank's, where one process plays several.
        rank = self.rank if rank is None else rank
        return torch.tensor([(rank << 40) | (s << 20) | t for s, n in enumerate(lens)
                             for t in range(n)], dtype=torch.int64)

    def planned_ids(self, plan, rank=None):
        """This rank's (or `rank`'s) chunks in compute order and the ids of the tokens
        they hold."""
        rank = self.rank if rank is None else rank
        mine = [c for c in plan["chunks"] if c["dst_rank"] == rank]
        ids = [(c["src_rank"] << 40) | (c["seq_index"] << 20) | (c["offset"] + t)
               for c in mine for t in range(c["length"])]
        return mine, torch.tensor(ids, dtype=torch.int64)

    def time_ms(self, fn, barrier=True):
        """Milliseconds fn takes on this rank: CUDA events on GPUs, the clock on CPUs;
        with barrier, every rank starts together."""
        if self.cuda:
            self.synchronize()
            if barrier:
                self.barrier()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        if barrier:
            self.barrier()
        began = time.perf_counter()
        fn()
        return (time.perf_counter() - began) * 1e3

    @staticmethod
    def even_lengths(rows, parts):
        """`parts` sequence lengths that hold `rows` tokens, the remainder in the last."""
        base = [rows // parts] * parts
        base[-1] += rows - sum(base)
        return base


def _topologies(size):
    """Topologies that fit `size` ranks: one-GPU bags, a mix, and one bag of every rank."""
    if size == 1:
        return ["g1n1"]
    candidates = [f"g1n{size}"]
    if size % 2 == 0 and size >= 4:
        candidates.append(f"g1n{size // 2}+g{size // 2}n1")
    candidates.append(f"g{size}n1")
    fitting = []
    for topology in candidates:
        try:
            _C.replica_size(topology, size, {})
            fitting.append(topology)
        except (ValueError, RuntimeError):
            pass
    return fitting


# -- the checks in a world, under a watchdog ----------------------------------------------

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


_HUNG = "hung; the run ended there"
_AFTER_A_HANG = "not run: an earlier check hung"


def _hung_results(results, name, bound_s, reasons):
    done = list(results)
    done.append(result(name, "FAIL", f"did not finish within {bound_s:g} s (--timeout-s): "
                                     f"{_HUNG}"))
    for other, _ in _WORLD_CHECKS[len(done):]:
        done.append(result(other, "SKIP", reasons.get(other) or _AFTER_A_HANG))
    return done


def _ended_at_a_hang(per_check, names, reasons):
    """per_check with every check after the first that hung on some rank SKIPped on
    every rank: the run ended there, whatever a peer of the hung rank did once that
    rank had gone (its next collectives fail against a closed connection)."""
    hung = [i for i, name in enumerate(names)
            if any(isinstance(r, dict) and r["verdict"] == "FAIL" and _HUNG in r["detail"]
                   for r in per_check[name].values())]
    if not hung:
        return per_check
    ended = dict(per_check)
    for name in names[hung[0] + 1:]:
        ended[name] = {rank: result(name, "SKIP", reasons.get(name) or _AFTER_A_HANG)
                       for rank in per_check[name]}
    return ended


_BY_NAME = {**cuda_checks.WORLD_CHECKS, **step_checks.WORLD_CHECKS, **fsdp_checks.WORLD_CHECKS,
            **hub_checks.WORLD_CHECKS}
# Every check but killed_rank runs inside the world, in CHECKS's order.
_WORLD_CHECKS = tuple((name, _BY_NAME[name]) for name in CHECKS if name in _BY_NAME)


def run_world_checks(ctx, reasons):
    """Every check that runs inside the world, in order, on every rank: their results.
    reasons: skip_reasons(); ctx.on_hang, where set, is called with the results when a
    check runs past --timeout-s (then the process exits with what it returns)."""
    results = []
    bound_s = ctx.opts.timeout_s
    watchdog = None
    if ctx.on_hang is not None:
        watchdog = _Watchdog(bound_s, lambda name: ctx.on_hang(
            _hung_results(results, name, bound_s, reasons)))
    for name, check in _WORLD_CHECKS:
        if reasons.get(name):
            results.append(result(name, "SKIP", reasons[name]))
            continue
        if watchdog is not None:
            watchdog.watch(name)
        began = time.monotonic()
        try:
            row = check(ctx)
        except Exception as error:  # noqa: BLE001  (a check that raises FAILs; the rest go on)
            row = result(name, "FAIL", f"{type(error).__name__}: {one_line(error)}")
            row["traceback"] = traceback.format_exc()
        row["seconds"] = round(time.monotonic() - began, 3)
        results.append(row)
        try:
            ctx.synchronize()
            ctx.barrier()  # a check that failed on one rank only must not skew the next
            if name == "raw_nccl":
                # The side-stream check uses the transport only where every rank has it.
                usable = ctx.transport is not None and not ctx.transport.aborted
                if not all(ctx.gather(usable)):
                    ctx.transport = None
        except Exception as error:  # noqa: BLE001
            row["detail"] += f" (the ranks did not meet after it: {one_line(error)})"
            if row["verdict"] != "SKIP":
                row["verdict"] = "FAIL"
        if watchdog is not None:
            watchdog.clear()
    ctx.transport = None
    return results
