"""The checks of a balanced step that run on any device (--device cpu too): python_step,
a whole step in float64 against the same model run unbalanced (knapformer.side_by_side),
and route_vs_all_to_all, the exchange's time against bare all_to_all_single calls. Each
takes the rank's Context and returns its result."""
import math
import statistics
import time

import torch
import torch.distributed as dist

import knapformer
from knapformer.gpu_check.report import problems_text, result
from knapformer.side_by_side import run_both, varlen_attention

# How close a balanced float64 step must be to the unbalanced one (torch.allclose).
RTOL, ATOL = 1e-10, 1e-12
D_MODEL = 32
HEAD_DIM = 4


def _positions(lens):
    rows = [[float(s), float(t)] for s, n in enumerate(lens) for t in range(n)]
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 2)


def _step_lengths(rank, size, step, scale):
    """Ordinary lengths with one long sequence on rank 0 (even steps), and awkward
    ones (odd: a rank with nothing, zero-length sequences, one shorter than a bag)."""
    g = torch.Generator().manual_seed(rank * 1000 + step)
    if step % 2 == 0:
        count = int(torch.randint(1, 5, (1,), generator=g))
        lens = [int(v) for v in torch.randint(1, 48 * scale, (count,), generator=g)]
        return lens + [150 * scale] if rank == 0 else lens
    if rank == 1:
        return []
    lens = [0, int(torch.randint(1, 30 * scale, (1,), generator=g)), 0]
    return lens + [3] if rank == size - 1 else lens


def _route(ctx, balancer, x, features, victim):
    """balancer.route, with the test-only fault applied on the victim rank."""
    chunk_lens, routed, routed_features = balancer.route(x, features)
    if ctx.fault == "corrupt_route" and ctx.rank == victim and routed.numel() > 0:
        bump = torch.zeros_like(routed)
        bump.view(-1)[0] = 1
        routed = routed + bump
    return chunk_lens, routed, routed_features


def _model(ctx, balancer, x, features, lens, params, upstream, heads, victim):
    """One attention block, forward and backward; balancer None = each rank on its own
    sequences. Returns the output."""
    w_qkv, w_out, w_pos, w_stamp = params
    positions, ids, stamp = features
    seq_lens = lens
    h = x
    if balancer is not None:
        _, h, (positions, ids, stamp) = _route(ctx, balancer, x, [positions, ids, stamp], victim)
    # The features enter the computation, so a feature routed wrong changes the result.
    h = h + (positions.double() * 0.01) @ w_pos + stamp.double() * w_stamp
    q, k, v = (h @ w_qkv).reshape(-1, 3, heads, HEAD_DIM).unbind(1)
    if balancer is not None:
        seq_lens, q, k, v = balancer.pre_attn(q, k, v)
    o = varlen_attention(q, k, v, seq_lens)
    if balancer is not None:
        _, o = balancer.post_attn(o)
    out = h + o.reshape(-1, heads * HEAD_DIM) @ w_out
    if balancer is not None:
        _, out, _ = balancer.reverse_route(out)
    (out * upstream).sum().backward()
    return [out.detach()]


def _check_routing(ctx, balancer, lens, plan, victim, where, problems):
    rows = sum(lens)
    mine, want_ids = ctx.planned_ids(plan)
    g = torch.Generator().manual_seed(ctx.rank + 17)
    x = torch.randn(rows, D_MODEL, dtype=torch.float64, generator=g).to(ctx.device)
    x.requires_grad_(True)
    ids = ctx.token_ids(lens).to(ctx.device)
    positions = _positions(lens).to(ctx.device)
    stamp = torch.rand(rows, 1, generator=g).to(torch.bfloat16).to(ctx.device)
    chunk_lens, routed, features = _route(ctx, balancer, x, [positions, ids, stamp], victim)
    if chunk_lens.dtype != torch.int32 or chunk_lens.device != x.device:
        problems.append(f"{where}: chunk lengths are {chunk_lens.dtype} on {chunk_lens.device}")
    if chunk_lens.tolist() != [c["length"] for c in mine]:
        problems.append(f"{where}: chunk lengths {chunk_lens.tolist()} are not the planner's")
    if [f.dtype for f in features] != [torch.float32, torch.int64, torch.bfloat16]:
        problems.append(f"{where}: the features came back as {[f.dtype for f in features]}")
    if not torch.equal(features[1].cpu(), want_ids):
        problems.append(f"{where}: the routed token ids are not the planner's chunk table")
    seq_lens, back, back_features = balancer.reverse_route(routed, features)
    if seq_lens.tolist() != lens:
        problems.append(f"{where}: reverse_route's lengths {seq_lens.tolist()} are not {lens}")
    if not torch.equal(back.detach(), x.detach()):
        problems.append(f"{where}: route + reverse_route changed the float64 tokens")
    for name, got, want in zip(("float32 positions", "int64 ids", "bf16 column"),
                               back_features, (positions, ids, stamp)):
        if got.dtype != want.dtype or not torch.equal(got, want):
            problems.append(f"{where}: the {name} did not come back bit for bit")
    weight = torch.randn(rows, D_MODEL, dtype=torch.float64, generator=g).to(ctx.device)
    (back * weight).sum().backward()
    grad = x.grad if x.grad is not None else torch.zeros_like(weight)
    if not torch.equal(grad, weight):
        problems.append(f"{where}: the round trip's gradients did not come back exactly")


def _check_model(ctx, balancer, lens, heads, step, victim, where, problems):
    rows = sum(lens)
    g = torch.Generator().manual_seed(1000 + step)  # the same weights on every rank
    width = heads * HEAD_DIM
    params = [torch.randn(D_MODEL, 3 * width, generator=g) / math.sqrt(D_MODEL),
              torch.randn(width, D_MODEL, generator=g) / math.sqrt(width),
              torch.randn(2, D_MODEL, generator=g), torch.randn(1, D_MODEL, generator=g)]
    params = [p.double().to(ctx.device).requires_grad_(True) for p in params]
    mine = torch.Generator().manual_seed(7919 * (ctx.rank + 1) + step)
    x = torch.randn(rows, D_MODEL, dtype=torch.float64, generator=mine).to(ctx.device)
    x.requires_grad_(True)
    upstream = torch.randn(rows, D_MODEL, dtype=torch.float64, generator=mine).to(ctx.device)
    features = [_positions(lens).to(ctx.device), ctx.token_ids(lens).to(ctx.device),
                torch.rand(rows, 1, generator=mine).to(torch.bfloat16).to(ctx.device)]
    # The weights' gradients summed over the ranks: each rank holds a part.
    runs = run_both(lambda b: _model(ctx, b, x, features, lens, params, upstream, heads, victim),
                    balancer, inputs=[x], parameters=params, reduce=True)
    names = ("output", "input gradient", "qkv weight gradient", "output weight gradient",
             "position weight gradient", "bf16-column weight gradient")
    return runs.compare(names, problems, RTOL, ATOL, where=f"{where}: ")


def _check_python_step(ctx):
    while ctx.fault == "hang" and ctx.rank == 0:
        time.sleep(1)  # what the watchdog must turn into a report
    heads = 2 * ctx.size  # a multiple of every bag size of every topology here
    problems, worst, moved, steps = [], 0.0, 0, 0
    for topology in ctx.topologies:
        balancer = knapformer.SequenceBalancer(topology, gamma=ctx.gamma)
        for step in range(2):
            where = f"{topology} step {step}"
            lens = _step_lengths(ctx.rank, ctx.size, step, ctx.scale)
            everyone = ctx.gather(lens)
            balancer.plan_routing(lens, token_dim=D_MODEL)
            plan = knapformer.plan(everyone, topology, d_model=D_MODEL, gamma=ctx.gamma)
            moved += plan["moved_tokens"]
            steps += 1
            victim = min((c["dst_rank"] for c in plan["chunks"] if c["length"] > 0), default=-1)
            _check_routing(ctx, balancer, lens, plan, victim, where, problems)
            worst = max(worst, _check_model(ctx, balancer, lens, heads, step, victim, where,
                                            problems))
        del balancer
    figures = {"max_rel_diff": worst, "steps": steps, "moved_tokens": moved}
    if problems:
        return result("python_step", "FAIL", problems_text(problems), figures)
    return result("python_step", "PASS",
                  f"{', '.join(ctx.topologies)} x 2 steps on {ctx.size} rank(s): routed rows "
                  f"are the planner's, round trips bit-exact (float64, float32, int64, bf16), "
                  f"outputs and gradients equal the unbalanced model's (max relative "
                  f"difference {worst:.2g})", figures)


def _mb_label(mb):
    return f"{mb:g}MB"


def _check_route_vs_all_to_all(ctx):
    topology = f"g{ctx.size}n1" if f"g{ctx.size}n1" in ctx.topologies else f"g1n{ctx.size}"
    balancer = knapformer.SequenceBalancer(topology, gamma=ctx.gamma)
    width = 1024  # float32 rows of 4 KB
    figures, problems, parts = {}, [], []
    for mb in ctx.opts.sizes_mb:
        label = _mb_label(mb)
        rows = max(4, int(round(mb * 2 ** 20 / (width * 4))))
        lens = ctx.even_lengths(rows, 4)
        everyone = ctx.gather(lens)
        balancer.plan_routing(lens, token_dim=width)
        plan = knapformer.plan(everyone, topology, d_model=width, gamma=ctx.gamma)
        send = [0] * ctx.size
        recv = [0] * ctx.size
        for c in plan["chunks"]:
            if c["src_rank"] == ctx.rank:
                send[c["dst_rank"]] += c["length"]
            if c["dst_rank"] == ctx.rank:
                recv[c["src_rank"]] += c["length"]
        x = torch.randn(rows, width, device=ctx.device)
        out = torch.empty(sum(recv), width, device=ctx.device)
        back = torch.empty_like(x)

        def via_route():
            _, routed, _ = balancer.route(x)
            return routed, balancer.reverse_route(routed)[1]

        def via_all_to_all():
            dist.all_to_all_single(out, x, recv, send)
            dist.all_to_all_single(back, out, send, recv)

        with torch.no_grad():
            routed, returned = via_route()
            via_all_to_all()
            if routed.shape[0] != sum(recv) or not torch.equal(returned, x):
                problems.append(f"{label}: route + reverse_route did not match the plan")
            if not torch.equal(back, x):
                problems.append(f"{label}: the bare all_to_all_single round trip was wrong")
            route_ms, a2a_ms = [], []
            for i in range(ctx.opts.warmup + ctx.opts.repeats):
                pair = [(route_ms, via_route), (a2a_ms, via_all_to_all)]
                for times, fn in (pair if i % 2 == 0 else pair[::-1]):
                    took = ctx.time_ms(fn)
                    if i >= ctx.opts.warmup:
                        times.append(took)
        # Per repeat, the slowest rank is what a step waits for.
        everyone = ctx.gather((route_ms, a2a_ms))
        route = statistics.median(max(t[0][i] for t in everyone) for i in range(len(route_ms)))
        a2a = statistics.median(max(t[1][i] for t in everyone) for i in range(len(a2a_ms)))
        moved = sum(send) - send[ctx.rank]
        figures[f"route_ms[{label}]"] = route
        figures[f"a2a_ms[{label}]"] = a2a
        figures[f"ratio[{label}]"] = route / a2a if a2a > 0 else math.inf
        parts.append(f"{label}: {route:.3g} ms vs {a2a:.3g} ms ({route / a2a:.3g}x, "
                     f"{moved / rows:.0%} of rank {ctx.rank}'s rows leave it)"
                     if a2a > 0 else f"{label}: a2a took no time")
    if problems:
        return result("route_vs_all_to_all", "FAIL", problems_text(problems), figures)
    return result("route_vs_all_to_all", "INFO",
                  f"route + reverse_route vs two all_to_all_single ({topology}, {ctx.size} "
                  f"ranks, slowest rank, median of {ctx.opts.repeats}): " + "; ".join(parts),
                  figures)


# {check: check(ctx) -> its result}: the harness runs them in CHECKS's order.
WORLD_CHECKS = {"python_step": _check_python_step,
                "route_vs_all_to_all": _check_route_vs_all_to_all}
