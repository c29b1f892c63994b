"""hub_layout: the device exchange path of an 8-rank layout with multi-GPU bags, played on
this rank's one device. NCCL refuses two ranks on one GPU; a TensorHubTransport
(knapformer._C._SequenceBalancer._over_tensor_hub) makes 8 balancers in this process whose
exchanges copy rows between tensors on the device, so the packing, index and unpacking
kernels that a multi-GPU world runs on each GPU (and its bags' Ulysses exchanges) run here,
one thread per simulated rank."""
import statistics
import threading
import time

import torch

import knapformer
from knapformer.gpu_check.report import one_line, problems_text, result
from knapformer.sequence_balancer import _arguments

HUB_RANKS = 8
HUB_TOPOLOGY = "g1n2+g2n1+g4n1"  # 2 single-GPU bags, a 2-GPU bag and a 4-GPU bag
HUB_HEADS = 8  # a multiple of every bag's size


def _hub_balancers(ctx, width):
    args = _arguments(HUB_TOPOLOGY, ctx.gamma, device=str(ctx.device), planner_address=None,
                      job_id="gpu-check-hub", group_id=None, d_model=width,
                      max_tokens_per_gpu=0, cost_model="transformer", locality=True,
                      planner_deadline=None, planner_mode=None, require_planner=None,
                      first_step=0, use_fitted_gamma=False, agree_on_errors=True, machine=None)
    return knapformer._C._SequenceBalancer._over_tensor_hub(
        HUB_RANKS, args, timeout_seconds=ctx.opts.timeout_s)


def _hub_lengths(scale):
    """Each simulated rank's sequence lengths: uneven, so that the plan moves tokens."""
    return [[(97 * (r + 1) * (s + 3)) % (160 * scale) + 8 for s in range(1 + r % 3)]
            for r in range(HUB_RANKS)]


def _one_rank(ctx, balancer, rank, lens, plan, width, head_dim, problems, times):
    """One simulated rank's step: plan, route (ids and rows), pre_attn of q, k, v,
    post_attn, reverse_route and the exchanges' backward; `problems` gets what is wrong."""
    device = ctx.device
    where = f"rank {rank}"
    ids = ctx.token_ids(lens, rank).to(device)
    # float64 rows that name their token and column exactly: id * 256 + column
    # (ids < 2^43, columns < 256: below 2^53).
    x = ids.double()[:, None] * 256 + torch.arange(width, dtype=torch.float64, device=device)
    balancer.plan_routing(lens, width)
    began = time.perf_counter()
    routed_x, routed_ids = balancer.route([x, ids])
    if not torch.equal(routed_ids.cpu(), ctx.planned_ids(plan, rank)[1]):
        problems.append(f"{where}: the routed token ids are not the planner's chunk table")
    heads = HUB_HEADS
    q = routed_x.view(-1, heads, head_dim)
    k, v = q * 2, q * 3
    pre = balancer.pre_attn([q, k, v])
    bag = balancer.bag_gpus
    attention = balancer.lengths("attention", str(device)).cpu().tolist()
    # Every attention sequence is one sequence's tokens in order, with one bag
    # position's heads on every row: ids and columns come out of the values.
    first = pre[0][:, 0, 0].long().cpu()
    token, column = first // 256, first % 256
    if sum(attention) != pre[0].shape[0]:
        problems.append(f"{where}: pre_attn returned {pre[0].shape[0]} rows, its attention "
                        f"lengths sum to {sum(attention)}")
    elif token.numel() and (bool((column != column[0]).any()) or
                            int(column[0]) % (heads // bag * head_dim) != 0):
        problems.append(f"{where}: pre_attn's rows do not all hold one bag position's heads")
    start = 0
    for n in attention:
        run = token[start:start + n]
        if n and (bool((run[1:] - run[:-1] != 1).any()) or int(run[0]) & ((1 << 20) - 1)):
            problems.append(f"{where}: pre_attn's sequence at row {start} is not one "
                            "sequence's tokens in order")
            break
        start += n
    if pre[0].shape[1] != heads // bag:
        problems.append(f"{where}: pre_attn gave {pre[0].shape[1]} heads in a bag of {bag}")
    back = balancer.post_attn(pre)
    if not all(torch.equal(a, b) for a, b in zip(back, (q, k, v))):
        problems.append(f"{where}: post_attn(pre_attn(q, k, v)) is not q, k, v bit for bit")
    returned = balancer.reverse_route([routed_x, routed_ids])
    if not (torch.equal(returned[0], x) and torch.equal(returned[1], ids)):
        problems.append(f"{where}: reverse_route(route(x)) is not x bit for bit")
    # The exchanges' backward (what autograd runs): a permutation's, so the
    # backward of pre_attn given its outputs is its inputs.
    grads = balancer.backward("pre_attn", pre)
    if not all(torch.equal(a, b) for a, b in zip(grads, (q, k, v))):
        problems.append(f"{where}: the backward of pre_attn did not send the rows back")
    grads = balancer.backward("route", [routed_x])
    if not torch.equal(grads[0], x):
        problems.append(f"{where}: the backward of route did not send the rows back")
    ctx.synchronize()
    times.append((time.perf_counter() - began) * 1e3)


def _check_hub_layout(ctx):
    width = HUB_HEADS * 16
    lens = _hub_lengths(ctx.scale)
    try:
        balancers = _hub_balancers(ctx, width)
    except Exception as error:  # noqa: BLE001
        return result("hub_layout", "FAIL", f"the tensor hub's balancers: {one_line(error)}")
    plan = knapformer.plan(lens, HUB_TOPOLOGY, d_model=width, gamma=ctx.gamma)
    problems, times, crashed = [], [], []

    def run(rank):
        try:
            for _ in range(2):  # the second step: every call's later exchanges
                _one_rank(ctx, balancers[rank], rank, lens[rank], plan, width,
                          width // HUB_HEADS, problems, times)
        except Exception as error:  # noqa: BLE001
            crashed.append(f"rank {rank}: {type(error).__name__}: {one_line(error)}")

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(HUB_RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ctx.opts.timeout_s)
    if any(t.is_alive() for t in threads):
        return result("hub_layout", "FAIL", f"a simulated rank did not finish within "
                      f"{ctx.opts.timeout_s:g} s")
    figures = {"ranks": HUB_RANKS, "moved_tokens": plan["moved_tokens"],
               "step_ms": statistics.median(times) if times else 0.0}
    problems = crashed + problems
    if problems:
        return result("hub_layout", "FAIL", problems_text(problems), figures)
    return result("hub_layout", "PASS",
                  f"{HUB_RANKS} ranks of {HUB_TOPOLOGY} played on {ctx.device} through a tensor "
                  f"hub, 2 steps: routed ids are the planner's, pre_attn gives whole sequences "
                  f"with each bag position's heads, round trips and the exchanges' backward "
                  f"bit-exact (float64 and int64)", figures)


WORLD_CHECKS = {"hub_layout": _check_hub_layout}
