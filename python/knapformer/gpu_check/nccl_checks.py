"""The CUDA-only checks of communication: nccl_group (ProcessGroupNCCL under a
SequenceBalancer) and raw_nccl (the extension's own NCCL transport)."""
import time

import torch
import torch.distributed as dist

import knapformer
from knapformer import _C
from knapformer._torch_compat import device_backend
from knapformer.gpu_check.common import GAMMA, _group_timeout_s, _problems_text, _result
from knapformer.gpu_check.context import _planned_ids, _token_ids


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
    balancer = knapformer.SequenceBalancer(topology, gamma=GAMMA)
    expected = ctx.device.index if ctx.device.type == "cuda" else ctx.device
    if balancer.this_device != expected:
        problems.append(f"SequenceBalancer.this_device is {balancer.this_device!r}, not "
                        f"{expected!r} (this rank's GPU)")
    lens = [3 + ctx.rank, 5]
    everyone = ctx.gather(lens)
    balancer.plan_routing(lens, token_dim=8)
    _, want_ids = _planned_ids(knapformer.plan(everyone, topology, d_model=8, gamma=GAMMA),
                               ctx.rank)
    x = torch.randn(sum(lens), 8, device=ctx.device)
    ids = _token_ids(ctx.rank, lens).to(ctx.device)
    _, routed, (routed_ids,) = balancer.route(x, [ids])
    if not torch.equal(routed_ids.cpu(), want_ids):
        problems.append("the routed token ids are not the planner's chunk table")
    _, back, (back_ids,) = balancer.reverse_route(routed, [routed_ids])
    if not (torch.equal(back, x) and torch.equal(back_ids, ids)):
        problems.append("route + reverse_route did not return the same tensors")
    figures = {"init_s": init_s, "ranks": ctx.size}
    if problems:
        return _result("nccl_group", "FAIL", _problems_text(problems), figures)
    return _result("nccl_group", "PASS",
                   f"ProcessGroupNCCL of {ctx.size} rank(s) (cuda:{ctx.local_rank} here), "
                   f"all_reduce right, a SequenceBalancer over it on this GPU: routed rows are "
                   f"the planner's and come back bit-exact", figures)


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
    ctx.transport = transport = _make_transport(ctx, _group_timeout_s(ctx.opts))
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
        return _result("raw_nccl", "FAIL", _problems_text(problems), {"ranks": ctx.size})
    return _result("raw_nccl", "PASS",
                   f"all_to_all_rows between {ctx.size} rank(s) bit-exact (24- and 7-byte "
                   f"rows, empty pairs); one rank's extra row raised ValueError on every rank "
                   f"({outcome[1][:80]}), the transport stayed usable; all_gather_bytes exact",
                   {"ranks": ctx.size})
