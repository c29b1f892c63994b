"""The CUDA-only checks of streams and speed: side_stream (the exchanges ordered with
the caller's stream) and copy_bandwidth (route against plain copies on one GPU)."""
import statistics
import time

import torch
import torch.distributed as dist

import knapformer
from knapformer.gpu_check.common import GAMMA, _problems_text, _result
from knapformer.gpu_check.context import _planned_ids, _split, _time_ms, _token_ids
from knapformer.gpu_check.nccl_checks import _raw_exchange


SLEEP_MS = 50


def _sleep_cycles(ms):
    """torch.cuda._sleep cycles that take about `ms` on this GPU."""
    probe = 1_000_000
    took = 0.0
    for _ in range(2):  # the first launch pays for loading the kernel
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(probe)
        end.record()
        end.synchronize()
        took = start.elapsed_time(end)
    return max(1, int(probe * ms / max(took, 1e-3)))


def _stamped(ids, width, k):
    # Exact in float64 (ids < 2^53), and different in every round, so stale memory
    # from an earlier round cannot look right.
    return ids.double()[:, None] + torch.arange(width, dtype=torch.float64,
                                                device=ids.device)[None, :] + 0.25 * k


def _fill_behind_sleep(current, side, cycles, target, values):
    """target <- values on `side`, behind a kernel that sleeps `cycles`; then the
    `current` stream waits for `side`, as a trainer that fills on a side stream does.
    Until the sleep ends the target still holds what it held before."""
    side.wait_stream(current)
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        target.copy_(values)
    target.record_stream(side)
    values.record_stream(side)
    current.wait_stream(side)


def _check_side_stream(ctx):
    dev = ctx.device
    topology = f"g1n{ctx.size}"
    balancer = knapformer.SequenceBalancer(topology, gamma=GAMMA)
    width = 1024
    # Rank 0 holds more than its share, so that with several ranks tokens move.
    lens = [256] * 16 if ctx.rank == 0 else [128] * 2
    everyone = ctx.gather(lens)
    balancer.plan_routing(lens, token_dim=width)
    _, want_ids = _planned_ids(knapformer.plan(everyone, topology, d_model=width, gamma=GAMMA),
                               ctx.rank)
    ids = _token_ids(ctx.rank, lens).to(dev)
    want_ids = want_ids.to(dev)
    current = torch.cuda.current_stream(dev)
    side = torch.cuda.Stream(device=dev)
    cycles = _sleep_cycles(SLEEP_MS)
    problems, host_ms = [], []
    for k in range(3):
        # a) filled on the side stream behind a slow kernel; the current stream waits.
        values, want = _stamped(ids, width, 4 * k), _stamped(want_ids, width, 4 * k)
        x = torch.full_like(values, -1.0)
        _fill_behind_sleep(current, side, cycles, x, values)
        began = time.perf_counter()
        _, routed, _ = balancer.route(x)
        host_ms.append((time.perf_counter() - began) * 1e3)
        if not torch.equal(routed, want):
            stale = int((routed == -1).sum().item())
            problems.append(f"round {k}: rows filled on a side stream (current stream waiting "
                            f"for it) were routed wrong ({stale} values still the -1 they "
                            "held before the fill): the exchange ran before the caller's "
                            "stream")
        # b) the output used at once on the current stream.
        x2, want2 = _stamped(ids, width, 4 * k + 1), _stamped(want_ids, width, 4 * k + 1)
        _, routed2, _ = balancer.route(x2)
        doubled = routed2 * 2 + 1
        _, back2, _ = balancer.reverse_route(routed2)
        back_diff = back2 - x2
        if not torch.equal(doubled, want2 * 2 + 1):
            problems.append(f"round {k}: route's output read at once on the current stream "
                            "was wrong: the current stream did not wait for the exchange")
        if back_diff.numel() and back_diff.abs().max().item() != 0:
            problems.append(f"round {k}: reverse_route's output read at once was wrong")
        # c) the side stream current for the whole call.
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            x3 = _stamped(ids, width, 4 * k + 2)
            _, routed3, _ = balancer.route(x3)
            wrong3 = (routed3 != _stamped(want_ids, width, 4 * k + 2)).sum()
        current.wait_stream(side)
        if wrong3.item() != 0:
            problems.append(f"round {k}: with a side stream current, route's output on it was "
                            "wrong: the exchange did not follow the current stream")
    raw = ""
    if ctx.transport is not None:
        raw = _check_side_stream_raw(ctx, side, cycles, problems)
    figures = {"route_host_ms": statistics.median(host_ms), "sleep_ms": SLEEP_MS}
    if problems:
        return _result("side_stream", "FAIL", _problems_text(problems), figures)
    blocked = " (route waited for the GPU: a host sync)" \
        if figures["route_host_ms"] > 0.8 * SLEEP_MS else ""
    return _result("side_stream", "PASS",
                   f"route after a {SLEEP_MS} ms side-stream fill, its output read at once, "
                   f"and the call on a side stream: values right, 3 rounds{blocked}{raw}",
                   figures)


def _check_side_stream_raw(ctx, side, cycles, problems):
    transport = ctx.transport
    current = torch.cuda.current_stream(ctx.device)

    def behind_sleep(send):
        filled = torch.full_like(send, 5)
        _fill_behind_sleep(current, side, cycles, filled, send)
        return filled

    got, want = _raw_exchange(ctx, transport, 3, torch.int64, fill=behind_sleep)
    if not torch.equal(got, want):
        problems.append("raw transport: rows filled behind a side-stream kernel arrived wrong")
    def sleep_then_fill(send):
        # On the side stream (current here), after the buffers exist: their copies from
        # host memory wait for the host, and would wait out a sleep queued before them.
        torch.cuda._sleep(cycles)
        return send.clone()

    # The caller's stream named explicitly: the side stream, with the fill on it.
    with torch.cuda.stream(side):
        got, want = _raw_exchange(ctx, transport, 3, torch.int64, stream=side.cuda_stream,
                                  fill=sleep_then_fill)
        wrong = (got != want).sum()
    current.wait_stream(side)
    if wrong.item() != 0:
        problems.append("raw transport: an exchange on a named side stream was not ordered "
                        "with it")
    return "; raw transport the same, on the current and on a named stream"


def _check_copy_bandwidth(ctx):
    group = None
    if ctx.size > 1:
        # A group of one per rank: every token stays local. Every process makes every
        # group, in the same order (torch's rule).
        singles = [dist.new_group([r]) for r in range(ctx.size)]
        group = singles[ctx.rank]
    balancer = knapformer.SequenceBalancer("g1n1", gamma=GAMMA, process_group=group)
    width = 1024
    rows = max(16, int(ctx.opts.copy_mb * 2 ** 20) // (width * 4))
    lens = _split(rows, 16)
    balancer.plan_routing(lens, token_dim=width)
    x = torch.randn(rows, width, device=ctx.device)
    a, b = torch.empty_like(x), torch.empty_like(x)

    def via_route():
        _, routed, _ = balancer.route(x)
        return balancer.reverse_route(routed)[1]

    def via_copy():
        a.copy_(x)
        b.copy_(a)

    route_ms, copy_ms = [], []
    with torch.no_grad():
        exact = torch.equal(via_route(), x)
        for i in range(ctx.opts.warmup + ctx.opts.repeats):
            pair = [(route_ms, via_route), (copy_ms, via_copy)]
            for times, fn in (pair if i % 2 == 0 else pair[::-1]):
                took = _time_ms(ctx, fn, barrier=False)
                if i >= ctx.opts.warmup:
                    times.append(took)
    moved = 2 * rows * width * 4
    route, copy = statistics.median(route_ms), statistics.median(copy_ms)
    figures = {"route_GBps": moved / 1e9 / (route / 1e3), "copy_GBps": moved / 1e9 / (copy / 1e3),
               "ratio": route / copy, "route_ms": route, "copy_ms": copy, "bytes": moved // 2}
    if not exact:
        return _result("copy_bandwidth", "FAIL", "route + reverse_route did not return the "
                       "tensor it was given", figures)
    return _result("copy_bandwidth", "INFO",
                   f"route + reverse_route of {moved // 2 / 2 ** 20:g} MB kept on this GPU: "
                   f"{route:.3g} ms ({figures['route_GBps']:.3g} GB/s) against two copy_ of "
                   f"the same bytes {copy:.3g} ms ({figures['copy_GBps']:.3g} GB/s): "
                   f"{figures['ratio']:.3g}x; median of {ctx.opts.repeats}", figures)
