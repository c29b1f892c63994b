"""The CUDA-path checks: nccl_group (ProcessGroupNCCL under a SequenceBalancer),
raw_nccl (the extension's own NCCL transport), side_stream (the exchanges ordered
with the caller's stream), host_syncs (host-synchronising CUDA runtime calls in a
balanced step, counted in a torch.profiler trace), sync_debug (the same step under
torch.cuda.set_sync_debug_mode("error")), exchange_cost (kernels, memcpys and host
microseconds of each exchange) and copy_bandwidth (route against plain copies and
all_to_all_single on one device). Each takes the rank's Context and returns its result."""
import re
import statistics
import time

import torch
import torch.distributed as dist

import knapformer
from knapformer import _C
from knapformer._torch_compat import device_backend
from knapformer.gpu_check.report import one_line, problems_text, result


# -- nccl_group ---------------------------------------------------------------------------

def _check_nccl_group(ctx):
    problems = []
    backend = device_backend(dist.distributed_c10d._get_default_group())
    if backend != "nccl":
        problems.append(f"the default group moves CUDA tensors over {backend!r}, not 'nccl'")
    began = time.monotonic()
    total = torch.full((1,), float(ctx.rank + 1), dtype=torch.float64, device=ctx.device)
    dist.all_reduce(total)
    got = total.item()  # the first collective: NCCL's communicator is made now (torch 2.x)
    init_s = ctx.init_seconds + time.monotonic() - began
    if got != ctx.size * (ctx.size + 1) / 2:
        problems.append(f"all_reduce of 1..{ctx.size} gave {got}")
    topology = f"g1n{ctx.size}"
    balancer = knapformer.SequenceBalancer(topology, gamma=ctx.gamma)
    expected = ctx.device.index if ctx.device.type == "cuda" else ctx.device
    if balancer.this_device != expected:
        problems.append(f"SequenceBalancer.this_device is {balancer.this_device!r}, not "
                        f"{expected!r} (this rank's GPU)")
    lens = [3 + ctx.rank, 5]
    everyone = ctx.gather(lens)
    balancer.plan_routing(lens, token_dim=8)
    _, want_ids = ctx.planned_ids(knapformer.plan(everyone, topology, d_model=8,
                                                  gamma=ctx.gamma))
    x = torch.randn(sum(lens), 8, device=ctx.device)
    ids = ctx.token_ids(lens).to(ctx.device)
    _, routed, (routed_ids,) = balancer.route(x, [ids])
    if not torch.equal(routed_ids.cpu(), want_ids):
        problems.append("the routed token ids are not the planner's chunk table")
    _, back, (back_ids,) = balancer.reverse_route(routed, [routed_ids])
    if not (torch.equal(back, x) and torch.equal(back_ids, ids)):
        problems.append("route + reverse_route did not return the same tensors")
    figures = {"init_s": init_s, "ranks": ctx.size}
    if problems:
        return result("nccl_group", "FAIL", problems_text(problems), figures)
    return result("nccl_group", "PASS",
                  f"ProcessGroupNCCL of {ctx.size} rank(s) (cuda:{ctx.local_rank} here), "
                  f"all_reduce right, a SequenceBalancer over it on this GPU: routed rows are "
                  f"the planner's and come back bit-exact", figures)


# -- raw_nccl -----------------------------------------------------------------------------

def _rows_between(src, dst, size):
    # Some pairs move nothing; every rank moves at least its own row, so that every
    # rank has rows of the same size (the transport compares them).
    return (src + 2 * dst) % 3 + (1 if src == dst else 0) if size > 1 else 3


def _raw_rows(src, dst, count, width, dtype):
    # Values name their source, destination and position: a misplaced row cannot pass.
    index = torch.arange(count * width, dtype=torch.int64).reshape(count, width)
    if dtype == torch.uint8:
        return ((index * 7 + src * 31 + dst * 101) % 251).to(torch.uint8)
    return (index | (src << 40) | (dst << 24)).to(dtype)


def _raw_exchange(ctx, transport, width, dtype, extra_row=False, stream=None, fill=None):
    """One all_to_all_rows; returns (received, expected). extra_row: rank 0 declares one
    row more from the last rank than that rank sends."""
    send_rows = [_rows_between(ctx.rank, p, ctx.size) for p in range(ctx.size)]
    recv_rows = [_rows_between(p, ctx.rank, ctx.size) for p in range(ctx.size)]
    if extra_row and ctx.rank == 0:
        recv_rows[-1] += 1
    send = torch.cat([_raw_rows(ctx.rank, p, n, width, dtype)
                      for p, n in enumerate(send_rows)]).to(ctx.device)
    want = torch.cat([_raw_rows(p, ctx.rank, n, width, dtype)
                      for p, n in enumerate(recv_rows)]).to(ctx.device)
    recv = torch.full_like(want, 13)
    if fill is not None:
        send = fill(send)
    handle = stream if stream is not None else torch.cuda.current_stream(ctx.device).cuda_stream
    transport.all_to_all_rows(send, send_rows, recv, recv_rows, handle)
    return recv, want


def _make_transport(ctx, timeout_s):
    box = [_C.nccl_unique_id() if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=ctx.host_group)
    return _C.NcclTransport(box[0], ctx.rank, ctx.size, ctx.device.index,
                            timeout_seconds=float(timeout_s), check_counts=True)


def _check_raw_nccl(ctx):
    problems = []
    ctx.transport = transport = _make_transport(ctx, ctx.group_timeout_s)
    if (transport.rank, transport.size, transport.device) != \
            (ctx.rank, ctx.size, ctx.device.index):
        problems.append(f"the transport says rank {transport.rank} of {transport.size} on "
                        f"device {transport.device}")
    for width, dtype in ((3, torch.int64), (7, torch.uint8)):
        got, want = _raw_exchange(ctx, transport, width, dtype)
        if not torch.equal(got, want):
            problems.append(f"rows of {width * want.element_size()} bytes arrived wrong")
    try:
        _raw_exchange(ctx, transport, 3, torch.int64, extra_row=True)
        outcome = ("no error", "")
    except ValueError as error:
        outcome = ("ValueError", str(error))
    except RuntimeError as error:
        outcome = ("RuntimeError", str(error))
    everyone = ctx.gather(outcome)
    kinds = {kind for kind, _ in everyone}
    messages = {text for _, text in everyone}
    if kinds != {"ValueError"}:
        problems.append(f"a row-count mismatch raised {sorted(kinds)} across the ranks, not "
                        f"ValueError on every rank ({outcome[1][:120]})")
    elif len(messages) != 1:
        problems.append(f"the ranks' errors for one mismatch differ: {sorted(messages)[:2]}")
    if transport.aborted:
        problems.append("the mismatch aborted the transport")
    else:
        got, want = _raw_exchange(ctx, transport, 3, torch.int64)
        if not torch.equal(got, want):
            problems.append("the exchange after the mismatch arrived wrong")
    mine = bytes([65 + ctx.rank % 26]) * (3 * ctx.rank + 1)
    gathered = transport.all_gather_bytes(mine)
    if [bytes(b) for b in gathered] != [bytes([65 + r % 26]) * (3 * r + 1)
                                          for r in range(ctx.size)]:
        problems.append("all_gather_bytes did not return every rank's bytes")
    if problems:
        return result("raw_nccl", "FAIL", problems_text(problems), {"ranks": ctx.size})
    return result("raw_nccl", "PASS",
                  f"all_to_all_rows between {ctx.size} rank(s) bit-exact (24- and 7-byte "
                  f"rows, empty pairs); one rank's extra row raised ValueError on every rank "
                  f"({outcome[1][:80]}), the transport stayed usable; all_gather_bytes exact",
                  {"ranks": ctx.size})


# -- side_stream --------------------------------------------------------------------------

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
    balancer = knapformer.SequenceBalancer(topology, gamma=ctx.gamma)
    width = 1024
    # Rank 0 holds more than its share, so that with several ranks tokens move.
    lens = [256] * 16 if ctx.rank == 0 else [128] * 2
    everyone = ctx.gather(lens)
    balancer.plan_routing(lens, token_dim=width)
    _, want_ids = ctx.planned_ids(knapformer.plan(everyone, topology, d_model=width,
                                                  gamma=ctx.gamma))
    ids = ctx.token_ids(lens).to(dev)
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
        return result("side_stream", "FAIL", problems_text(problems), figures)
    blocked = " (route waited for the GPU: a host sync)" \
        if figures["route_host_ms"] > 0.8 * SLEEP_MS else ""
    return result("side_stream", "PASS",
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


# -- host_syncs ---------------------------------------------------------------------------

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")
STEP_CALLS = ("plan_routing", "route", "pre_attn", "post_attn", "reverse_route", "backward")


def _runtime_name(name):
    return re.sub(r"_v\d+$", "", str(name))  # CUPTI's versioned names: cudaMemcpy_v3020


def on_host(event):
    """Whether a profiler event is the host's (a range's GPU-side copy is not)."""
    kind = getattr(event, "device_type", None)
    return kind is None or str(kind).endswith("CPU")


LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemsetAsync")


def count_runtime_calls(events, calls, labels=STEP_CALLS):
    """CUDA runtime calls named in `calls` inside each labelled range (record_function)
    of a profile: ({label: {call: count}}, whether any CUDA runtime call was recorded at
    all, how many labelled ranges there were). A call belongs to the range its start
    falls in, so calls made by the autograd engine's threads during a labelled
    backward count for it."""
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in events
              if e.name in labels and on_host(e)]
    counts = {label: {call: 0 for call in calls} for label in labels}
    saw_runtime = False
    for event in events:
        name = _runtime_name(event.name)
        if name.startswith("cuda") or name.startswith("cuLaunch"):
            saw_runtime = True
        if name not in calls:
            continue
        start = event.time_range.start
        for low, high, label in ranges:
            if low <= start <= high:
                counts[label][name] += 1
                break
    return counts, saw_runtime, len(ranges)


def count_host_syncs(events, labels=STEP_CALLS):
    """count_runtime_calls of the host-synchronising calls (SYNC_CALLS)."""
    return count_runtime_calls(events, SYNC_CALLS, labels)


def _balanced_step(ctx):
    """The step the host_syncs, sync_debug and exchange_cost checks look into: the
    topology (the one with the widest bag: pre/post_attn exchange) and step(run), which
    runs plan_routing, route, pre_attn of q, k, v, post_attn, reverse_route and the
    backward, each as run(label, fn) (by default fn()), on a balancer of its own."""
    topology = ctx.topologies[-1]
    heads, head_dim = 2 * ctx.size, 64
    width = heads * head_dim
    balancer = knapformer.SequenceBalancer(topology, gamma=ctx.gamma)
    lens = [1024, 256, 256] if ctx.rank == 0 else [256, 256]
    x0 = torch.randn(sum(lens), width, device=ctx.device)

    def step(run=lambda label, fn: fn()):
        run("plan_routing", lambda: balancer.plan_routing(lens, token_dim=width))
        x = x0.clone().requires_grad_(True)
        _, h, _ = run("route", lambda: balancer.route(x))
        q, k, v = (h * c for c in (1, 2, 3))
        _, q, k, v = run("pre_attn", lambda: balancer.pre_attn(q.view(-1, heads, head_dim),
                                                                 k.view(-1, heads, head_dim),
                                                                 v.view(-1, heads, head_dim)))
        o = q * k + v  # stands in for attention, which syncs nothing here
        _, o = run("post_attn", lambda: balancer.post_attn(o))
        _, out, _ = run("reverse_route", lambda: balancer.reverse_route(o.reshape(-1, width)))
        run("backward", lambda: out.sum().backward())

    return topology, step


def _labelled(label, fn):
    from torch.profiler import record_function
    with record_function(label):
        return fn()


def _profile_steps(ctx, step, steps):
    """`steps` runs of step(_labelled) under torch.profiler (CPU and CUDA activities),
    after 2 warm-up runs: (its events, None), or (None, why there are none). Every rank
    runs the same steps, profiled or not, so that every rank makes the same
    collectives."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    ctx.synchronize()
    ctx.barrier()
    profiler, reason = None, None
    try:
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.__enter__()
    except Exception as error:  # noqa: BLE001
        profiler, reason = None, f"the profiler did not start: {one_line(error)}"
    try:
        for _ in range(steps):
            step(_labelled)
        ctx.synchronize()
    finally:
        if profiler is not None:
            try:
                profiler.__exit__(None, None, None)
            except Exception as error:  # noqa: BLE001
                profiler, reason = None, f"the profiler failed: {one_line(error)}"
    return (profiler.events(), None) if profiler is not None else (None, reason)


def _check_host_syncs(ctx):
    topology, step = _balanced_step(ctx)
    steps = 3
    events, reason = _profile_steps(ctx, step, steps)
    if events is None:
        return result("host_syncs", "SKIP", reason)
    counts, saw_runtime, ranges = count_host_syncs(events)
    if not saw_runtime:
        return result("host_syncs", "SKIP",
                      "the profiler recorded no CUDA runtime calls (CUPTI missing or not "
                      "permitted?), so host syncs cannot be counted")
    per_call = {label: sum(counts[label].values()) / steps for label in STEP_CALLS}
    exchanges = [label for label in STEP_CALLS if label != "plan_routing"]
    by_kind = {call: sum(counts[label][call] for label in exchanges) / steps
               for call in SYNC_CALLS}
    total = sum(per_call[label] for label in exchanges)
    # The step is what moves tensors (forward and backward); planning is counted apart.
    figures = {"syncs_per_step": total, "in_plan_routing": per_call["plan_routing"]}
    figures.update({f"in_{label}": per_call[label] for label in exchanges})
    figures.update({f"calls_{call}": value for call, value in by_kind.items()})
    where = ", ".join(f"{label} {per_call[label]:g}" for label in exchanges if per_call[label])
    kinds = ", ".join(f"{call} {value:g}" for call, value in by_kind.items() if value)
    note = "" if ranges == steps * len(STEP_CALLS) else \
        f"; {ranges} labelled ranges seen, {steps * len(STEP_CALLS)} expected"
    return result("host_syncs", "INFO",
                  f"{total:g} host syncs per step in route, pre_attn, post_attn, "
                  f"reverse_route and backward ({topology}, {ctx.size} rank(s), mean of "
                  f"{steps} after 2 warm-up): {where or 'none'}; by call: {kinds or 'none'}; "
                  f"plan_routing {per_call['plan_routing']:g} more{note}", figures)


# -- sync_debug ---------------------------------------------------------------------------

class _Synced(Exception):
    """A call of the step made a synchronising CUDA call under sync_debug's error mode."""


def _sync_debug_mode(mode):
    """torch.cuda.set_sync_debug_mode(mode); the mode before it."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    return before


def _check_sync_debug(ctx):
    topology, step = _balanced_step(ctx)
    for _ in range(2):  # warm-up: the first steps allocate and compile
        step()
    ctx.synchronize()
    try:
        _sync_debug_mode(_sync_debug_mode(0))
    except Exception as error:  # noqa: BLE001
        return result("sync_debug", "SKIP", "torch.cuda.set_sync_debug_mode is not usable "
                      f"here: {one_line(error)}")
    raised = []

    def run(label, fn):
        # Planning may sync (the plan is known after it); every exchange after it must not.
        if label == "plan_routing":
            return fn()
        before = _sync_debug_mode("error")
        mine = None
        try:
            return fn()
        except Exception as error:  # noqa: BLE001
            if "synchroniz" not in str(error).lower():
                raise
            mine = one_line(error)
        finally:
            _sync_debug_mode(before)
            # Every rank stops at the same call (the peers of a rank that raised would
            # otherwise wait for it in the next exchange).
            anyone = [m for m in ctx.gather(mine) if m]
            if anyone:
                raised.append((label, anyone[0]))
                raise _Synced()

    try:
        step(run)
    except _Synced:
        pass
    ctx.synchronize()
    figures = {"raised": len(raised)}
    if raised:
        label, message = raised[0]
        return result("sync_debug", "INFO",
                      f"torch.cuda.set_sync_debug_mode(\"error\") around each exchange of a "
                      f"step ({topology}, {ctx.size} rank(s)): {label} made a synchronising "
                      f"CUDA call: {message}", figures)
    return result("sync_debug", "INFO",
                  f"torch.cuda.set_sync_debug_mode(\"error\") around route, pre_attn, "
                  f"post_attn, reverse_route and the backward of a step ({topology}, "
                  f"{ctx.size} rank(s), after plan_routing and 2 warm-up steps): nothing "
                  f"raised, 0 host syncs", figures)


# -- exchange_cost ------------------------------------------------------------------------

def _check_exchange_cost(ctx):
    """Per exchange of a step: host microseconds while the GPU is still busy with
    earlier work (a sleep kernel enqueued right after plan_routing; on CPU the call's
    own time), and kernel launches and memcpys from the profiler (CUDA only)."""
    topology, step = _balanced_step(ctx)
    exchanges = [label for label in STEP_CALLS if label != "plan_routing"]
    steps = 3
    events, reason = _profile_steps(ctx, step, steps)
    launches = None
    if events is not None:
        counts, saw_runtime, _ = count_runtime_calls(events, LAUNCH_CALLS)
        if saw_runtime:
            launches = counts
        else:
            reason = ("the profiler recorded no CUDA runtime calls" +
                      ("" if ctx.cuda else " (a CPU run: kernels and memcpys are CUDA's)"))
    cycles = _sleep_cycles(SLEEP_MS) if ctx.cuda else 0
    host_us = {label: [] for label in exchanges}

    def timed(label, fn):
        if label == "plan_routing":
            out = fn()
            if ctx.cuda:  # the GPU is busy for SLEEP_MS: each call below only enqueues
                torch.cuda._sleep(cycles)
            return out
        began = time.perf_counter()
        out = fn()
        host_us[label].append((time.perf_counter() - began) * 1e6)
        return out

    for _ in range(steps):
        ctx.synchronize()
        ctx.barrier()
        step(timed)
    ctx.synchronize()
    figures = {f"host_us_{label}": statistics.median(host_us[label]) for label in exchanges}
    parts = [f"{label} {figures['host_us_' + label]:.0f} us" for label in exchanges]
    kernels_text = f"; kernels and memcpys not counted: {reason}"
    if launches is not None:
        memcpys = ("cudaMemcpyAsync", "cudaMemcpy2DAsync", "cudaMemsetAsync")
        for label in exchanges:
            figures[f"kernels_{label}"] = sum(
                n for call, n in launches[label].items() if call not in memcpys) / steps
            figures[f"memcpys_{label}"] = sum(launches[label][c] for c in memcpys) / steps
        kernels_text = "; kernels / memcpys (and memsets) per call: " + ", ".join(
            f"{label} {figures['kernels_' + label]:g} / {figures['memcpys_' + label]:g}"
            for label in exchanges)
    busy = f"while the GPU is busy (a {SLEEP_MS} ms sleep kernel enqueued after " \
        "plan_routing)" if ctx.cuda else "(CPU tensors: the call's own time)"
    return result("exchange_cost", "INFO",
                  f"host time per call {busy}, median of {steps} steps ({topology}, "
                  f"{ctx.size} rank(s)): {', '.join(parts)}{kernels_text}", figures)


# -- copy_bandwidth -----------------------------------------------------------------------

def _check_copy_bandwidth(ctx):
    group = None
    if ctx.size > 1:
        # A group of one per rank: every token stays local. Every process makes every
        # group, in the same order (torch's rule).
        singles = [dist.new_group([r]) for r in range(ctx.size)]
        group = singles[ctx.rank]
    balancer = knapformer.SequenceBalancer("g1n1", gamma=ctx.gamma, process_group=group)
    width = 1024
    rows = max(16, int(ctx.opts.copy_mb * 2 ** 20) // (width * 4))
    lens = ctx.even_lengths(rows, 16)
    balancer.plan_routing(lens, token_dim=width)
    x = torch.randn(rows, width, device=ctx.device)
    a, b = torch.empty_like(x), torch.empty_like(x)

    def via_route():
        _, routed, _ = balancer.route(x)
        return balancer.reverse_route(routed)[1]

    def via_copy():
        a.copy_(x)
        b.copy_(a)

    one = group if group is not None else dist.distributed_c10d._get_default_group()

    def via_all_to_all():  # the collective's own self-exchange, of the same bytes
        dist.all_to_all_single(a, x, group=one)
        dist.all_to_all_single(b, a, group=one)

    times = {"route": [], "copy": [], "a2a": []}
    ways = [("route", via_route), ("copy", via_copy), ("a2a", via_all_to_all)]
    with torch.no_grad():
        exact = torch.equal(via_route(), x)
        for i in range(ctx.opts.warmup + ctx.opts.repeats):
            for name, fn in ways[i % 3:] + ways[:i % 3]:  # each first in turn
                took = ctx.time_ms(fn, barrier=False)
                if i >= ctx.opts.warmup:
                    times[name].append(took)
    moved = 2 * rows * width * 4
    route, copy, a2a = (statistics.median(times[name]) for name in ("route", "copy", "a2a"))
    figures = {"route_GBps": moved / 1e9 / (route / 1e3), "copy_GBps": moved / 1e9 / (copy / 1e3),
               "a2a_GBps": moved / 1e9 / (a2a / 1e3), "ratio": route / copy,
               "ratio_a2a": route / a2a, "route_ms": route, "copy_ms": copy, "a2a_ms": a2a,
               "bytes": moved // 2}
    if not exact:
        return result("copy_bandwidth", "FAIL", "route + reverse_route did not return the "
                      "tensor it was given", figures)
    where = "this GPU" if ctx.cuda else "this CPU process"
    return result("copy_bandwidth", "INFO",
                  f"route + reverse_route of {moved // 2 / 2 ** 20:g} MB kept on {where}: "
                  f"{route:.3g} ms ({figures['route_GBps']:.3g} GB/s) against two copy_ of "
                  f"the same bytes {copy:.3g} ms ({figures['copy_GBps']:.3g} GB/s): "
                  f"{figures['ratio']:.3g}x, and two all_to_all_single on a group of one "
                  f"{a2a:.3g} ms ({figures['a2a_GBps']:.3g} GB/s): {figures['ratio_a2a']:.3g}x; "
                  f"median of {ctx.opts.repeats}", figures)


# {check: check(ctx) -> its result}: the harness runs them in CHECKS's order.
WORLD_CHECKS = {"nccl_group": _check_nccl_group, "raw_nccl": _check_raw_nccl,
                "side_stream": _check_side_stream, "host_syncs": _check_host_syncs,
                "sync_debug": _check_sync_debug, "exchange_cost": _check_exchange_cost,
                "copy_bandwidth": _check_copy_bandwidth}
