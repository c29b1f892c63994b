"""The command's harness: the modes it runs in (one GPU, a torchrun world, the CPU
self-test, the dry run), the worlds it starts (knapformer.launch) and their results
merged by check, each mode ending in the report, and main.

Its parts, each a module of the package: options (the arguments, the checks' names and
which of them run here), machine (the machine's facts and the report's header) and
world (a rank's Context and the checks run in order under a watchdog). Their public
names stay importable from here."""
import datetime
import os
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

from knapformer._torch_compat import tcp_store
from knapformer.gpu_check import killed_rank
from knapformer.gpu_check.machine import (_device_text, _gpu_count, _no_gpu_text, _torchrun_env,
                                          _transport_built, _UsageError, report_header)
from knapformer.gpu_check.options import (CHECKS, CUDA_ONLY, FAULTS,  # noqa: F401
                                          _killed_world_size, parse_options, skip_reasons)
from knapformer.gpu_check.report import (BAD_ARGUMENTS, FAILED, FAULT_ENV, NO_GPU, OK, finish,
                                         last_line, merge_ranks, one_line, result,
                                         write_json_saying_where)
from knapformer.gpu_check.world import (_AFTER_A_HANG, _WORLD_CHECKS, GAMMA, Context,
                                        _ended_at_a_hang, _group_timeout_s, run_world_checks)
from knapformer.launch import report, run_ranks


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
