"""The command's harness: its arguments and which checks run here, the machine's facts,
the report's header, one rank's Context, the checks run in order under a watchdog,
the worlds it starts (knapformer.launch) and the modes it runs in (one GPU, a
torchrun world, the CPU self-test, the dry run), each ending in the report."""
import argparse
import datetime
import faulthandler
import math
import os
import platform
import socket
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

import knapformer
from knapformer import _C
from knapformer._torch_compat import tcp_store
from knapformer.gpu_check import cuda_checks, fsdp_checks, hub_checks, killed_rank, step_checks
from knapformer.gpu_check.report import (BAD_ARGUMENTS, FAILED, FAULT_ENV, NO_GPU, OK, finish,
                                         last_line, merge_ranks, one_line, result,
                                         write_json_saying_where)
from knapformer.launch import report, run_ranks

CHECKS = ("nccl_group", "raw_nccl", "python_step", "side_stream", "host_syncs",
          "sync_debug", "exchange_cost", "copy_bandwidth", "hub_layout", "route_vs_all_to_all",
          "fsdp2_checkpoint", "compiled_block", "killed_rank")
CUDA_ONLY = ("nccl_group", "raw_nccl", "side_stream", "host_syncs", "sync_debug")
FAULTS = ("corrupt_route", "corrupt_compiled", "hang")

GAMMA = 0.49


def _group_timeout_s(opts):
    # Past the per-check bound, so that a hang is reported by the watchdog
    # (_Watchdog) before a timeout ends the process.
    return opts.timeout_s + 60


# -- arguments, and what runs here --------------------------------------------------------

def _bounded(kind, low, high):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low <= value <= high) or (isinstance(value, float) and math.isnan(value)):
            raise argparse.ArgumentTypeError(f"{text} is outside [{low:g}, {high:g}]")
        return value
    return parse


def _sizes(text):
    sizes = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} in {text!r} is not a number of MB") \
                from None
        if not 0 < value <= 4096:
            raise argparse.ArgumentTypeError(f"{part} MB is outside (0, 4096]")
        sizes.append(value)
    return sizes


def _skip_list(text):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check {unknown[0]!r} (checks: "
                                         f"{', '.join(CHECKS)})")
    return names


def _parser():
    # The package's docstring (the docs are written from it) is the command's help.
    doc = sys.modules[__package__].__doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m knapformer.gpu_check",
        description=doc[0].split("\n")[0] + "\n\n" + doc[1],
        epilog="exit status: 0 nothing FAILed, 1 a check FAILed, 2 bad arguments, 3 no GPU\n"
               "found (nothing was checked). What each check does and when it passes:\n"
               "python3 -c 'import knapformer.gpu_check as g; help(g)'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would run here, write the JSON with every check SKIP, "
                             "exit 0")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): the GPU checks; cpu: a self-test of this "
                             "command's own logic on CPU processes over Gloo, for CI")
    parser.add_argument("--ranks", type=_bounded(int, 1, 64), default=None,
                        help="--device cpu only: processes of the self-test's world "
                             "(default 4)")
    parser.add_argument("--json", default="gpu_check.json", metavar="PATH",
                        help="where rank 0 writes every figure, verdict and detail "
                             "(default ./gpu_check.json)")
    parser.add_argument("--timeout-s", type=_bounded(float, 1, 86400), default=300.0,
                        help="bound on each check: one that runs longer is reported as hung "
                             "(FAIL) and the run ends; the process groups' and the raw "
                             "transport's timeout is this + 60 s (default 300)")
    parser.add_argument("--kill-timeout-s", type=_bounded(float, 1, 3600), default=30.0,
                        help="killed_rank: its world's process-group and transport timeout "
                             "(default 30)")
    parser.add_argument("--sizes-mb", type=_sizes, default=None, metavar="MB[,MB...]",
                        help="route_vs_all_to_all: payloads per rank (default 1,16; "
                             "--device cpu 0.25,1)")
    parser.add_argument("--copy-mb", type=_bounded(float, 0.0625, 65536), default=None,
                        help="copy_bandwidth: bytes routed and copied (default 64; "
                             "--device cpu 4)")
    parser.add_argument("--repeats", type=_bounded(int, 1, 1000), default=None,
                        help="timed repeats, medians reported (default 10; --device cpu 5)")
    parser.add_argument("--skip", type=_skip_list, default=[], metavar="NAME[,NAME...]",
                        help=f"checks not to run (SKIP): {', '.join(CHECKS)}")
    return parser


def parse_options(argv):
    """The command's options from argv (argparse exits 2 on bad ones)."""
    parser = _parser()
    opts = parser.parse_args(argv)
    if opts.ranks is not None and opts.device != "cpu":
        parser.error("--ranks: only with --device cpu (on GPUs the world is torchrun's "
                     "--nproc_per_node)")
    cpu = opts.device == "cpu"
    if opts.ranks is None:
        opts.ranks = 4
    if opts.sizes_mb is None:
        opts.sizes_mb = [0.25, 1.0] if cpu else [1.0, 16.0]
    if opts.repeats is None:
        opts.repeats = 5 if cpu else 10
    if opts.copy_mb is None:
        opts.copy_mb = 4.0 if cpu else 64.0
    opts.warmup = 1 if cpu else 2
    return opts


def _killed_world_size(opts, gpus):
    return min(opts.ranks, 3) if opts.device == "cpu" else min(gpus, 4)


def skip_reasons(opts, gpus, world_size, transport_built):
    """{check: None (it runs) or why it is skipped} for this machine and these options.
    Every rank computes the same answer, so every rank runs the same collectives."""
    cpu = opts.device == "cpu"
    size = opts.ranks if cpu else world_size
    reasons = {}
    for name in CHECKS:
        reason = None
        if name in opts.skip:
            reason = "skipped (--skip)"
        elif cpu and name in CUDA_ONLY:
            reason = ("CUDA only; --device cpu runs python_step, exchange_cost, "
                      "copy_bandwidth, hub_layout, route_vs_all_to_all, fsdp2_checkpoint, "
                      "compiled_block and killed_rank on CPU processes")
        elif not cpu and gpus == 0:
            reason = "no GPU: " + _no_gpu_text()
        elif name == "raw_nccl" and not transport_built:
            reason = ("this build has no raw NCCL transport (knapformer._C."
                      "nccl_transport_available is false: built without CUDA and NCCL)")
        elif name == "route_vs_all_to_all" and size < 2:
            reason = ("needs 2 or more ranks: --ranks 2 or more" if cpu else
                      "needs 2 or more ranks: torchrun --nproc_per_node N -m "
                      "knapformer.gpu_check (N >= 2)")
        elif name == "fsdp2_checkpoint" and fsdp_checks.fsdp2_missing() is not None:
            reason = fsdp_checks.fsdp2_missing()
        elif name == "compiled_block" and fsdp_checks.compile_missing() is not None:
            reason = fsdp_checks.compile_missing()
        elif name == "killed_rank" and _killed_world_size(opts, gpus) < 2:
            reason = ("needs 2 or more processes: --ranks 2 or more" if cpu else
                      f"needs 2 or more GPUs on this node (found {gpus}): it starts a world "
                      "of its own, one process per GPU")
        reasons[name] = reason
    return reasons


# -- the machine --------------------------------------------------------------------------

def _gpu_count():
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001  (a broken driver is "no GPU" here, with its reason)
        return 0


def _no_gpu_text():
    """What torch says about its GPUs, for the no-GPU messages."""
    version = torch.__version__
    hip = getattr(torch.version, "hip", None)
    if torch.version.cuda is None and not hip:
        return f"torch {version} (CPU build: torch.version.cuda is None)"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {hip}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return (f"torch {version} ({build}, but no device visible: torch.cuda.is_available() "
            f"is False{shown})")


def _nccl_version():
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001  (CPU builds have no NCCL)
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version if str(v) != "")
    if isinstance(version, int):
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9 on, major*1000 before.
        if version >= 10000:
            return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
        return f"{version // 1000}.{version // 100 % 10}.{version % 100}"
    return str(version)


def _device_text(index):
    try:
        return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    except Exception as error:  # noqa: BLE001
        return f"cuda:{index} (name unavailable: {one_line(error)})"


def _transport_built():
    return bool(getattr(_C, "nccl_transport_available", False))


def _torchrun_env():
    """(world size, rank, local rank) from torchrun's variables, (1, 0, 0) without them."""
    def read(name, default):
        value = os.environ.get(name, "")
        if value == "":
            return default
        try:
            return int(value)
        except ValueError:
            raise _UsageError(f"{name}={value!r} in the environment is not an integer "
                              "(torchrun sets it)") from None
    world = read("WORLD_SIZE", 1)
    rank = read("RANK", 0)
    return world, rank, read("LOCAL_RANK", rank)


class _UsageError(Exception):
    pass


def report_header(mode, world_size, devices, fault, argv):
    """The report's header: the mode, the devices, torch and knapformer's build."""
    build = getattr(knapformer, "build_info", None) or {}
    return {
        "tool": "knapformer.gpu_check",
        "mode": mode,
        "world_size": world_size,
        "devices": list(devices),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "knapformer": getattr(knapformer, "__version__", None),
        "build_info": dict(build) if isinstance(build, dict) else {"value": repr(build)},
        "nccl_transport_available": _transport_built(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(argv),
        "fault": fault,
    }


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


# -- the modes, and main ------------------------------------------------------------------

def _world_names():
    return [name for name, _ in _WORLD_CHECKS]


def _rows_from(per_check, reasons):
    rows = []
    for name in _world_names():
        if reasons.get(name):
            rows.append(result(name, "SKIP", reasons[name]))
        else:
            rows.append(merge_ranks(name, per_check[name]))
    return rows


def _killed_row(opts, reasons, cuda, gpus):
    if reasons.get("killed_rank"):
        return result("killed_rank", "SKIP", reasons["killed_rank"])
    return killed_rank.run_killed_rank(_killed_world_size(opts, gpus), cuda, _transport_built(),
                                       opts.kill_timeout_s, GAMMA)


def _cpu_rank(rank, size, opts, fault, reasons):
    """One rank of the CPU self-test, in knapformer.launch's Gloo group."""
    host_group = dist.new_group(backend="gloo")
    ctx = Context(rank, size, torch.device("cpu"), opts, host_group, fault)
    ctx.on_hang = _report_hung
    return run_world_checks(ctx, reasons)


def _report_hung(results):
    report(results)  # to the parent, before this process ends
    return OK


def _world_results(outcomes, names):
    """{check: {rank: result, or why that rank has none}} from a world's outcomes (by
    rank, as knapformer.launch.run_ranks gives them)."""
    per_check = {name: {} for name in names}
    for rank, (kind, value) in enumerate(outcomes):
        by_name = {r["name"]: r for r in value} if kind == "ok" else {}
        why = (f"rank {rank} failed outside the checks: {last_line(value)}" if kind == "error"
               else f"rank {rank} exited with status {value} without reporting"
               if kind == "exited" else str(value))
        for name in names:
            per_check[name][rank] = by_name.get(name, why)
    return per_check


def _run_cpu(opts, fault, argv):
    size = opts.ranks
    reasons = skip_reasons(opts, 0, size, _transport_built())
    header = report_header(f"CPU self-test of the checks: {size} Gloo processes (--device cpu)",
                           size, [f"cpu ({size} processes)"], fault, argv)
    names = _world_names()
    if any(reasons[name] is None for name in names):
        # One check may take up to --timeout-s before the ranks report it hung; the
        # self-test's ranks share few cores: one thread each.
        outcomes = run_ranks(_cpu_rank, size, (opts, fault, reasons),
                             timeout_s=2 * opts.timeout_s + 120, backend="gloo",
                             group_timeout_s=_group_timeout_s(opts), threads=1,
                             exit_together=True)
        per_check = _ended_at_a_hang(_world_results(outcomes, names), names, reasons)
    else:
        per_check = {name: {} for name in names}
    rows = _rows_from(per_check, reasons)
    rows.append(_killed_row(opts, reasons, False, 0))
    return finish(opts.json, header, rows)


def _teardown(timeout_s=10.0):
    """destroy_process_group, waited for at most timeout_s: with NCCL it can wait on a
    peer that has gone."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    worker = threading.Thread(target=dist.destroy_process_group, daemon=True)
    worker.start()
    worker.join(timeout_s)


def _gpu_rank(opts, fault, reasons, rank, size, local_rank, init, on_hang):
    """This rank's results in a GPU world (init makes the default NCCL group)."""
    if local_rank >= torch.cuda.device_count():
        failure = (f"LOCAL_RANK {local_rank}, but this process sees "
                   f"{torch.cuda.device_count()} GPU(s)")
    else:
        began = time.monotonic()
        try:
            torch.cuda.set_device(local_rank)
            init(datetime.timedelta(seconds=_group_timeout_s(opts)))
            host_group = dist.new_group(backend="gloo")
            failure = None
        except Exception as error:  # noqa: BLE001
            failure = f"the NCCL process group was not made: {type(error).__name__}: " \
                      f"{one_line(error)}"
    if failure is not None:
        results = [result("nccl_group", "FAIL", failure)]
        results += [result(name, "SKIP", reasons.get(name) or "no NCCL process group "
                           "(nccl_group failed)") for name in _world_names()[1:]]
        return results, None
    ctx = Context(rank, size, torch.device("cuda", local_rank), opts, host_group, fault,
                  local_rank=local_rank, init_seconds=time.monotonic() - began)
    ctx.on_hang = on_hang
    return run_world_checks(ctx, reasons), ctx


def _run_single_gpu(opts, fault, argv, gpus):
    reasons = skip_reasons(opts, gpus, 1, _transport_built())
    header = report_header("one GPU, world size 1 (torchrun --nproc_per_node N for N >= 2)", 1,
                           [_device_text(0)], fault, argv)

    def init(timeout):
        store = tcp_store("127.0.0.1", 0, 1, True, timeout=timeout, wait_for_workers=False)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1, timeout=timeout)

    def on_hang(results):
        rows = _rows_from({r["name"]: {0: r} for r in results}, {})
        rows.append(result("killed_rank", "SKIP", _AFTER_A_HANG))
        finish(opts.json, header, rows)
        return FAILED

    results, _ = _gpu_rank(opts, fault, reasons, 0, 1, 0, init, on_hang)
    _teardown()  # before the killed-rank world takes this GPU too
    rows = _rows_from({r["name"]: {0: r} for r in results}, reasons)
    rows.append(_killed_row(opts, reasons, True, gpus))
    return finish(opts.json, header, rows)


def _run_torchrun(opts, fault, argv, gpus, world, rank, local_rank):
    reasons = skip_reasons(opts, gpus, world, _transport_built())

    def init(timeout):
        dist.init_process_group("nccl", init_method="env://", timeout=timeout)

    def on_hang(results):
        if rank != 0:
            return OK  # a non-zero exit would make torchrun stop rank 0 before it reports
        why = "rank 0 ended the run when a check hung"
        per_check = {r["name"]: {0: r, **{p: f"rank {p}: no result ({why})"
                                          for p in range(1, world)}} for r in results}
        rows = _rows_from(per_check, {})
        rows.append(result("killed_rank", "SKIP", _AFTER_A_HANG))
        header = report_header(f"torchrun, {world} ranks", world,
                               [f"rank 0: {mine['host']} {mine['device']}"], fault, argv)
        finish(opts.json, header, rows)
        return FAILED

    mine = {"rank": rank, "host": socket.gethostname(), "device": _device_text(local_rank)
            if local_rank < gpus else "none"}
    results, ctx = _gpu_rank(opts, fault, reasons, rank, world, local_rank, init, on_hang)
    mine["results"] = results
    gathered, why = None, "no process group to send its results over"
    if ctx is not None:
        try:
            gathered = [None] * world if rank == 0 else None
            dist.gather_object(mine, gathered, dst=0, group=ctx.host_group)
        except Exception as error:  # noqa: BLE001
            gathered, why = None, f"gathering the results failed: {one_line(error)}"
    if rank != 0:
        _teardown()
        return OK  # rank 0 carries the verdict; a non-zero exit here would stop it
    if gathered is None:
        gathered = [mine] + [None] * (world - 1)
    per_check = {name: {} for name in _world_names()}
    for r, info in enumerate(gathered):
        by_name = {x["name"]: x for x in info["results"]} if info else {}
        for name in per_check:
            per_check[name][r] = by_name.get(name, f"rank {r}'s results did not arrive ({why})")
    devices = [f"rank {i['rank']}: {i['host']} {i['device']}" if i else f"rank {r}: ?"
               for r, i in enumerate(gathered)]
    header = report_header(f"torchrun, {world} ranks", world, devices, fault, argv)
    _teardown()
    rows = _rows_from(per_check, reasons)
    rows.append(_killed_row(opts, reasons, True, gpus))
    return finish(opts.json, header, rows)


def _dry_run(opts, fault, argv, gpus, world):
    cpu = opts.device == "cpu"
    size = opts.ranks if cpu else world
    reasons = skip_reasons(opts, gpus, size, _transport_built())
    if cpu:
        found = (f"{gpus} GPU(s) visible, unused: " if gpus else "no GPU (not needed): ") + \
            f"--device cpu runs the self-test on {size} CPU processes over Gloo"
        devices = [f"cpu ({size} processes)"]
    elif gpus == 0:
        found = (f"no GPU: {_no_gpu_text()}; nothing would be checked (exit {NO_GPU} without "
                 "--dry-run); --device cpu runs the check's self-test on CPU processes")
        devices = []
    else:
        devices = [_device_text(i) for i in range(gpus)]
        found = (f"{gpus} GPU(s): {'; '.join(devices)}; "
                 + (f"torchrun world of {world} ranks" if world > 1 else
                    "one process, world size 1"))
    header = report_header("dry run: " + found, size, devices, fault, argv)
    rows = [result(name, "SKIP", "--dry-run: would run" if reasons[name] is None
                   else f"--dry-run; would be skipped: {reasons[name]}") for name in CHECKS]
    print(f"knapformer gpu_check --dry-run: {found}")
    will = [name for name in CHECKS if reasons[name] is None]
    print(f"would run: {', '.join(will) if will else 'nothing'}")
    by_reason = {}
    for name in CHECKS:
        if reasons[name]:
            by_reason.setdefault(reasons[name], []).append(name)
    for reason, names in by_reason.items():
        print(f"would skip {', '.join(names)}: {reason}")
    write_json_saying_where(opts.json, header, rows, OK, label="JSON (every check SKIP)")
    return OK


def main(argv=None):
    """The command; returns its exit status (argparse exits 2 itself)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    opts = parse_options(argv)
    fault = os.environ.get(FAULT_ENV) or None
    if fault is not None and fault not in FAULTS:
        print(f"gpu_check: {FAULT_ENV}={fault!r} is not a known fault ({', '.join(FAULTS)}); "
              "it is for this command's own tests", file=sys.stderr)
        return BAD_ARGUMENTS
    try:
        world, rank, local_rank = _torchrun_env()
    except _UsageError as error:
        print(f"gpu_check: {error}", file=sys.stderr)
        return BAD_ARGUMENTS
    if opts.device == "cpu" and world > 1:
        print("gpu_check: --device cpu starts its own processes; run it without torchrun",
              file=sys.stderr)
        return BAD_ARGUMENTS
    gpus = _gpu_count()
    if opts.dry_run:
        return _dry_run(opts, fault, argv, gpus, world) if rank == 0 else OK
    if opts.device == "cpu":
        return _run_cpu(opts, fault, argv)
    if gpus == 0:
        print(f"gpu_check: no GPU found, nothing was checked: {_no_gpu_text()}. "
              "(--device cpu runs the check's self-test on CPU processes; --dry-run says "
              "what would run.)", file=sys.stderr, flush=True)
        return NO_GPU
    if world > 1:
        return _run_torchrun(opts, fault, argv, gpus, world, rank, local_rank)
    return _run_single_gpu(opts, fault, argv, gpus)
