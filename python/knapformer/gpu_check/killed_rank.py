"""The killed_rank check: a world of its own whose last rank exits mid-step; every
survivor's next calls must raise within the timeout, not hang."""
import datetime
import math
import os
import time

import torch
import torch.distributed as dist

import knapformer
from knapformer import _C
from knapformer.gpu_check.report import last_line, one_line, problems_text, result
from knapformer.launch import run_ranks, store_barrier


def _timed(fn):
    """(exception type or None, its message, seconds)."""
    began = time.monotonic()
    try:
        fn()
    except Exception as error:  # noqa: BLE001
        return type(error).__name__, one_line(error), time.monotonic() - began
    return None, "", time.monotonic() - began


def _killed_rank(rank, size, store, cuda, timeout_s, transport_built, gamma):
    if cuda:
        # Without blocking wait, torch's NCCL watchdog ends the process at the timeout
        # instead of raising in it, and a survivor could not report.
        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
        os.environ["NCCL_BLOCKING_WAIT"] = "1"
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=timeout_s))
    transport, exchange = None, None
    if cuda and transport_built:
        key = "knapformer_gpu_check/killed/nccl_id"
        if rank == 0:
            store.set(key, _C.nccl_unique_id())
        transport = _C.NcclTransport(bytes(store.get(key)), rank, size, rank,
                                     timeout_seconds=float(timeout_s), check_counts=True)
        ones = [1] * size
        send = torch.full((size, 8), rank, dtype=torch.int64, device=device)
        recv = torch.empty_like(send)

        def exchange():
            transport.all_to_all_rows(send, ones, recv, ones,
                                      torch.cuda.current_stream(device).cuda_stream)
            torch.cuda.synchronize(device)
    balancer = knapformer.SequenceBalancer(f"g1n{size}", gamma=gamma)
    lens = [5 + rank, 7]
    balancer.plan_routing(lens, token_dim=8)
    x = torch.randn(sum(lens), 8, device=device)
    _, routed, _ = balancer.route(x)
    if exchange is not None:
        exchange()  # the communicator works while every rank is there
    if cuda:
        torch.cuda.synchronize(device)
    # Every rank has finished its route before the victim goes.
    store_barrier(store, "knapformer_gpu_check/killed/routed", size, timeout_s + 60)
    if rank == size - 1:
        os._exit(0)  # mid-step, as a crashed trainer does
    first = _timed(lambda: balancer.reverse_route(routed))
    later = _timed(lambda: balancer.plan_routing(lens, token_dim=8))
    raw = None
    if exchange is not None:
        raw = _timed(exchange) + (bool(transport.aborted),)
    return {"first": first, "later": later, "raw": raw}


def _kill_slack(timeout_s):
    return 15.0 + 0.25 * timeout_s


def _duration(seconds):
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _killed_rank_row(outcomes, size, timeout_s, backend, raw_tested):
    """The killed_rank row from its world's outcomes, by rank (the last rank is the
    victim)."""
    victim = size - 1
    bound = timeout_s + _kill_slack(timeout_s)
    problems, first_s, later_s, raw_s, sample = [], [], [], [], ""
    kind, value = outcomes[victim]
    if (kind, value) != ("exited", 0):
        shown = last_line(value) if kind == "error" else value
        problems.append(f"the victim (rank {victim}) did not exit as planned: {kind}: {shown}")
    for rank in range(size - 1):
        kind, value = outcomes[rank]
        if kind != "ok":
            shown = last_line(value) if kind == "error" else value
            problems.append(f"rank {rank}: {kind}: {shown}")
            continue
        checks = [("reverse_route", value["first"], first_s),
                  ("the next plan_routing", value["later"], later_s)]
        if value.get("raw") is not None:
            checks.append(("the raw transport's next exchange", value["raw"][:3], raw_s))
            if not value["raw"][3]:
                problems.append(f"rank {rank}: the raw transport was not aborted after it "
                                "failed")
        for what, (error_type, message, seconds), times in checks:
            times.append(seconds)
            if error_type is None:
                problems.append(f"rank {rank}: {what} returned although rank {victim} was gone")
            elif seconds > bound:
                problems.append(f"rank {rank}: {what} raised only after {seconds:.1f} s (bound "
                                f"{bound:g} s)")
            elif not sample and what == "reverse_route":
                sample = f"{error_type}: {message[:100]}"
    figures = {"max_error_s": max(first_s) if first_s else math.nan, "timeout_s": timeout_s,
               "survivors": size - 1}
    if later_s:
        figures["max_next_call_s"] = max(later_s)
    if raw_tested and raw_s:
        figures["max_raw_error_s"] = max(raw_s)
    if problems:
        return result("killed_rank", "FAIL", problems_text(problems), figures)
    raw = (f"; the raw transport's exchange raised within {_duration(max(raw_s))} and it "
           "is aborted") if raw_tested and raw_s else ""
    return result("killed_rank", "PASS",
                  f"{size} {backend} processes, rank {victim} exited after route: every "
                  f"survivor's reverse_route raised within {_duration(max(first_s))} and "
                  f"its next call within {_duration(max(later_s))} (bound {bound:g} s = "
                  f"timeout {timeout_s:g} + slack){raw}; {sample}", figures)


def run_killed_rank(size, cuda, transport_built, timeout_s, gamma):
    """The killed_rank row: a world of `size` processes (one per GPU with cuda, else
    Gloo on CPU) whose process groups and raw transport (where built and cuda) time
    out after timeout_s; its balancers plan with gamma."""
    raw = cuda and transport_built
    # start-up, the timeout itself (twice with the raw transport), the slack
    deadline_s = 120 + (2 if raw else 1) * (timeout_s + _kill_slack(timeout_s))
    began = time.monotonic()
    try:
        outcomes = run_ranks(_killed_rank, size, (cuda, timeout_s, raw, gamma),
                             timeout_s=deadline_s, threads=None if cuda else 1)
    except Exception as error:  # noqa: BLE001
        return result("killed_rank", "FAIL", f"its world did not start: {one_line(error)}")
    row = _killed_rank_row(outcomes, size, timeout_s, "NCCL" if cuda else "Gloo", raw)
    row["seconds"] = round(time.monotonic() - began, 3)
    row["ranks"] = {str(r): {"outcome": kind, "value": value if kind == "ok" else
                             last_line(value) if kind == "error" else value}
                    for r, (kind, value) in enumerate(outcomes)}
    return row
