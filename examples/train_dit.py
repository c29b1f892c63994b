"""A small DiT-like transformer trained on the paper's synthetic mixed-resolution
stream, each step twice on the same weights and tokens: without balancing
(every rank on its own sequences) and with knapformer's SequenceBalancer.

    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 --redirects 1 --tee 1 \\
        examples/train_dit.py [--steps 5] [--planner host:port]

(CPU and Gloo here; with a CUDA build of torch, --device cuda uses NCCL.
`--redirects 1 --tee 1` work around torchrun's crash on Python 3.11. On a
torch without libuv, such as Debian's 2.6, torchrun cannot start: use
`python3 -m knapformer.launch --nproc_per_node 4 examples/train_dit.py`.)

The integration is the reference implementation's: route once before the
blocks, pre_attn/post_attn around attention inside every block, reverse_route
after them; nothing but those calls (and print_imbalance) touches the
balancer, so a script written for the reference runs with knapformer by
installing it. Rank 0 prints every rank's compute time per step (thread CPU
time with one intra-op thread, so that ranks sharing cores do not blur it),
the measured WIR (slowest / fastest rank), the losses of both runs and how far
their gradients differ; the process exits 1 if they disagree.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import knapformer
from knapformer import SequenceBalancer

# The paper's synthetic data codes (section 4.1), g{G}b{B}i{R}f{F}s{S}: a stream
# sharded over G GPUs, B samples per GPU, R x R pixels, F frames, S = 1 for
# temporal compression. The default is a 4-GPU slice of the mixed-resolution
# scenario: 256px images on two ranks, 512px on one, one 2048px image on one.
MIXED_RES_4_GPUS = "g2b4i256f1s0,g1b5i512f1s0,g1b1i2048f1s0"


def rank_lengths(data, world_size, rank, step, seed, scale):
    """This rank's sequence lengths at `step` of the paper's stream (the same
    generator as `knapformer simulate` and train-sim: floor(R/16)^2 * T
    visual tokens times one aspect factor m ~ U[0.96, 1.04] per rank and
    step, plus 0..392 text tokens per sample), divided by `scale` for CPU
    attention."""
    lengths = knapformer.synthetic_lengths(data, world_size, seed, step)[rank]
    return [max(1, n // scale) for n in lengths]


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    angles = t[:, None] * 1000.0 * freqs[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def varlen_attention(q, k, v, seq_lens):
    """Attention of each sequence on its own, [tokens, heads, head_dim]."""
    outs, start = [], 0
    for n in seq_lens.tolist():
        qs, ks, vs = (x[start:start + n].transpose(0, 1) for x in (q, k, v))
        weights = torch.softmax(qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        outs.append((weights @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs) if outs else q[:0] * 0


class DiTBlock(nn.Module):
    """Attention and MLP, each modulated by the token's timestep (adaLN)."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d_model, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(d_model, elementwise_affine=False)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.modulation = nn.Linear(d_model, 6 * d_model)

    def forward(self, x, cond, seq_lens, balancer=None):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(F.silu(cond)).chunk(6, -1)
        h = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = self.qkv(h).reshape(x.shape[0], 3, self.heads, -1).unbind(1)
        if balancer is not None:  # whole sequences, heads / bag size
            seq_lens, q, k, v = balancer.pre_attn(q, k, v)
        o = varlen_attention(q, k, v, seq_lens)
        if balancer is not None:  # back to this rank's chunks, every head
            _, o = balancer.post_attn(o)
        x = x + gate1 * self.proj(o.reshape(x.shape[0], -1))
        return x + gate2 * self.mlp(self.norm2(x) * (1 + scale2) + shift2)


class DiT(nn.Module):
    def __init__(self, d_model, heads, layers):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Linear(d_model, d_model)
        self.time = nn.Sequential(nn.Linear(d_model, d_model), nn.SiLU(),
                                  nn.Linear(d_model, d_model))
        self.blocks = nn.ModuleList(DiTBlock(d_model, heads) for _ in range(layers))
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, t_per_token, positions, seq_lens, balancer=None):
        if balancer is not None:
            # Once before the blocks: tokens and their per-token features travel together.
            seq_lens, x, (t_per_token, positions) = balancer.route(x, [t_per_token, positions])
        cond = self.time(timestep_embedding(t_per_token, self.d_model))
        h = self.embed(x) + timestep_embedding(positions.to(torch.float32) / 1000.0,
                                               self.d_model)
        for block in self.blocks:
            h = block(h, cond, seq_lens, balancer)
        out = self.out(h)
        if balancer is not None:  # every token back where it came from
            _, out, _ = balancer.reverse_route(out)
        return out


def make_batch(lengths, d_model, seed, step, rank):
    """Rectified flow: x_t = (1 - t) x0 + t noise, target noise - x0."""
    g = torch.Generator().manual_seed(seed * 7919 + step * 104729 + rank)
    tokens = sum(lengths)
    x0 = torch.randn(tokens, d_model, generator=g)  # the latents of the images' patches
    noise = torch.randn(tokens, d_model, generator=g)
    t = torch.rand(len(lengths), generator=g)
    t_per_token = torch.repeat_interleave(t, torch.tensor(lengths, dtype=torch.long))
    positions = torch.cat([torch.arange(n) for n in lengths]) if lengths else \
        torch.zeros(0, dtype=torch.long)
    x_t = (1 - t_per_token[:, None]) * x0 + t_per_token[:, None] * noise
    return x_t, noise - x0, t_per_token, positions


def train_step(model, batch, lengths, world_tokens, balancer):
    """Forward and backward; returns (this rank's loss share, compute seconds,
    all-reduced gradients)."""
    x_t, target, t_per_token, positions = batch
    model.zero_grad(set_to_none=True)
    start = time.thread_time()
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=x_t.device)
    pred = model(x_t, t_per_token, positions, seq_lens, balancer)
    loss = ((pred - target) ** 2).mean(dim=-1).sum() / world_tokens
    loss.backward()
    seconds = time.thread_time() - start
    grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
             for p in model.parameters()]
    for grad in grads:
        dist.all_reduce(grad)
    return loss.detach(), seconds, grads


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--data", default=MIXED_RES_4_GPUS)
    parser.add_argument("--scale", type=int, default=8, help="divide every length (CPU attention)")
    parser.add_argument("--topology", default="g1n2+g2n1")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--planner", help="host:port of a planner service "
                        "(default: $KNAPFORMER_PLANNER_ADDRESS; none = plan locally)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--print-imbalance", action="store_true",
                        help="rank 0 prints the planned per-rank workloads every step")
    args = parser.parse_args()
    if args.steps < 1 or args.scale < 1 or args.d_model % args.heads:
        raise SystemExit("--steps and --scale must be >= 1 and --heads must divide --d-model")

    torch.set_num_threads(1)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.planner:
        os.environ["KNAPFORMER_PLANNER_ADDRESS"] = args.planner
    try:
        rank_lengths(args.data, world_size, rank, 0, args.seed, args.scale)
    except ValueError as e:
        raise SystemExit(f"--data: {e}")

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = DiT(args.d_model, args.heads, args.layers).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    balancer = SequenceBalancer(args.topology, gamma=args.gamma)

    slowest = {"unbalanced": [], "balanced": []}
    worst_grad_diff = 0.0
    ok = True
    for step in range(args.steps):
        lengths = rank_lengths(args.data, world_size, rank, step, args.seed, args.scale)
        batch = [t.to(device) for t in make_batch(lengths, args.d_model, args.seed, step, rank)]
        world_tokens = torch.tensor([float(sum(lengths))], device=device)
        dist.all_reduce(world_tokens)

        plain_loss, plain_seconds, plain_grads = train_step(
            model, batch, lengths, world_tokens.item(), None)
        balancer.plan_routing(lengths, args.d_model)
        if args.print_imbalance and rank == 0:
            balancer.print_imbalance()
        loss, seconds, grads = train_step(model, batch, lengths, world_tokens.item(), balancer)

        losses = torch.stack([plain_loss, loss])
        dist.all_reduce(losses)
        times = [None] * world_size
        dist.all_gather_object(times, (plain_seconds, seconds, sum(lengths)))
        grad_diff = max(((g - p).abs().max() / p.abs().max().clamp_min(1e-12)).item()
                        for g, p in zip(grads, plain_grads))
        worst_grad_diff = max(worst_grad_diff, grad_diff)
        loss_diff = abs(losses[0] - losses[1]).item() / max(abs(losses[0].item()), 1e-12)
        ok = ok and grad_diff < 1e-3 and loss_diff < 1e-5
        for name, column in (("unbalanced", 0), ("balanced", 1)):
            slowest[name].append(max(t[column] for t in times))
        if rank == 0:
            for name, column in (("unbalanced", 0), ("balanced", 1)):
                per_rank = [t[column] * 1e3 for t in times]
                print(f"step {step} {name:>10}: compute per rank (ms) "
                      f"[{', '.join(f'{v:.0f}' for v in per_rank)}]  slowest {max(per_rank):.0f}"
                      f"  WIR {max(per_rank) / max(min(per_rank), 1e-9):.2f}"
                      f"  loss {losses[column].item():.6f}", flush=True)
            speedup = slowest["unbalanced"][-1] / slowest["balanced"][-1]
            print(f"step {step}: tokens per rank {[t[2] for t in times]}, slowest rank "
                  f"{speedup:.2f}x faster balanced, relative gradient difference "
                  f"{grad_diff:.1e}", flush=True)
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        optimizer.step()

    if rank == 0:
        measured = slice(1, None) if args.steps > 1 else slice(None)  # step 0 warms up
        plain = sum(slowest["unbalanced"][measured]) / len(slowest["unbalanced"][measured])
        balanced = sum(slowest["balanced"][measured]) / len(slowest["balanced"][measured])
        print(f"slowest-rank compute, mean over steps {'1' if args.steps > 1 else '0'}-"
              f"{args.steps - 1}: unbalanced {plain * 1e3:.0f} ms, balanced {balanced * 1e3:.0f} ms "
              f"({plain / balanced:.2f}x); losses and gradients "
              f"{'agree' if ok else 'DISAGREE'} (worst relative gradient difference "
              f"{worst_grad_diff:.1e})", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
