"""The host_syncs check: host-synchronising CUDA runtime calls inside each call of a
balanced step, counted in a torch.profiler trace."""
import re

import torch

import knapformer
from knapformer.gpu_check.common import GAMMA, _one_line, _result


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy")
STEP_CALLS = ("plan_routing", "route", "pre_attn", "post_attn", "reverse_route", "backward")


def _runtime_name(name):
    return re.sub(r"_v\d+$", "", str(name))  # CUPTI's versioned names: cudaMemcpy_v3020


def _on_host(event):
    kind = getattr(event, "device_type", None)
    return kind is None or str(kind).endswith("CPU")


def count_host_syncs(events, labels=STEP_CALLS):
    """Host-synchronising CUDA runtime calls inside each labelled range (record_function)
    of a profile: ({label: {call: count}}, whether any CUDA runtime call was recorded at
    all, how many labelled ranges there were). A call belongs to the range its start
    falls in, so calls made by the autograd engine's threads during a labelled
    backward count for it."""
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in events
              if e.name in labels and _on_host(e)]
    counts = {label: {call: 0 for call in SYNC_CALLS} for label in labels}
    saw_runtime = False
    for event in events:
        name = _runtime_name(event.name)
        if name.startswith("cuda"):
            saw_runtime = True
        if name not in SYNC_CALLS:
            continue
        start = event.time_range.start
        for low, high, label in ranges:
            if low <= start <= high:
                counts[label][name] += 1
                break
    return counts, saw_runtime, len(ranges)


def _check_host_syncs(ctx):
    from torch.profiler import ProfilerActivity, profile, record_function

    topology = ctx.topologies[-1]  # the one with the widest bag: pre/post_attn exchange
    heads, head_dim = 2 * ctx.size, 64
    width = heads * head_dim
    balancer = knapformer.SequenceBalancer(topology, gamma=GAMMA)
    lens = [1024, 256, 256] if ctx.rank == 0 else [256, 256]
    x0 = torch.randn(sum(lens), width, device=ctx.device)

    def step():
        with record_function("plan_routing"):
            balancer.plan_routing(lens, token_dim=width)
        x = x0.clone().requires_grad_(True)
        with record_function("route"):
            _, h, _ = balancer.route(x)
        q, k, v = (h * c for c in (1, 2, 3))
        with record_function("pre_attn"):
            _, q, k, v = balancer.pre_attn(q.view(-1, heads, head_dim),
                                           k.view(-1, heads, head_dim),
                                           v.view(-1, heads, head_dim))
        o = q * k + v  # stands in for attention, which syncs nothing here
        with record_function("post_attn"):
            _, o = balancer.post_attn(o)
        with record_function("reverse_route"):
            _, out, _ = balancer.reverse_route(o.reshape(-1, width))
        with record_function("backward"):
            out.sum().backward()

    for _ in range(2):
        step()
    ctx.synchronize()
    ctx.barrier()
    steps = 3
    profiler, reason = None, None
    try:
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.__enter__()
    except Exception as error:  # noqa: BLE001
        profiler, reason = None, f"the profiler did not start: {_one_line(error)}"
    try:
        for _ in range(steps):  # profiled or not, every rank runs the same collectives
            step()
        ctx.synchronize()
    finally:
        if profiler is not None:
            try:
                profiler.__exit__(None, None, None)
            except Exception as error:  # noqa: BLE001
                profiler, reason = None, f"the profiler failed: {_one_line(error)}"
    if profiler is None:
        return _result("host_syncs", "SKIP", reason)
    counts, saw_runtime, ranges = count_host_syncs(profiler.events())
    if not saw_runtime:
        return _result("host_syncs", "SKIP",
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
    return _result("host_syncs", "INFO",
                   f"{total:g} host syncs per step in route, pre_attn, post_attn, "
                   f"reverse_route and backward ({topology}, {ctx.size} rank(s), mean of "
                   f"{steps} after 2 warm-up): {where or 'none'}; by call: {kinds or 'none'}; "
                   f"plan_routing {per_call['plan_routing']:g} more{note}", figures)
