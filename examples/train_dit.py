"""A small DiT-like transformer trained on the paper's synthetic mixed-resolution
stream, each step twice on the same weights and tokens: without balancing
(every rank on its own sequences) and with knapformer's SequenceBalancer.

    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 --redirects 1 --tee 1 \\
        examples/train_dit.py [--steps 5] [--planner host:port] \\
        [--fsdp] [--checkpoint] [--compile]

(CPU and Gloo here; with a CUDA build of torch, --device cuda uses NCCL.
`--redirects 1 --tee 1` work around torchrun's crash on Python 3.11. On a
torch without libuv, such as Debian's 2.6, torchrun cannot start: use
`python3 -m knapformer.launch --nproc_per_node 4 examples/train_dit.py`.)

--fsdp shards the model (fully_shard, FSDP2, where it runs; torch 2.6's does
not run on CPU, so there FullyShardedDataParallel; --fsdp fsdp1|fsdp2 picks),
--checkpoint recomputes every block in the backward pass (non-reentrant;
--checkpoint reentrant), --compile compiles every block with torch.compile
(torch >= 2.4; --compile-backend, default inductor). The balancer needs
nothing else from them: docs/python.md says in which order to apply them.

--block-causal N trains an autoregressive video-diffusion-like model: every
sequence is cut into chunks of N tokens, each attending fully to itself and
to every earlier chunk. The balancer is told each sequence's mask
(plan_routing's attn_masks), prices its attention by the pairs it attends,
and after pre_attn names the masks of the sequences the rank now holds
(get_attention_masks), from which attention builds its mask.

The integration is the reference implementation's: route once before the
blocks, pre_attn/post_attn around attention inside every block, reverse_route
after them; nothing but those calls (and print_imbalance) touches the
balancer, so a script written for the reference runs with knapformer by
installing it. knapformer.side_by_side runs each step both ways and keeps
their losses, gradients and times. Rank 0 prints every rank's compute time
per step (thread CPU time with one intra-op thread, so that ranks sharing
cores do not blur it), the measured WIR (slowest / fastest rank), the losses
of both runs and how far their gradients differ; the process exits 1 if they
disagree.
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import knapformer
from knapformer import SequenceBalancer
from knapformer.side_by_side import masked_attention, run_both, varlen_attention

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


def block_causal_masks(lengths, chunk):
    """Each sequence in chunks of `chunk` tokens, block-causal: the form
    plan_routing's attn_masks takes."""
    return [{"spans": [[min(chunk, n - start), "full"] for start in range(0, n, chunk)]}
            if n else "full" for n in lengths]


def attends(n, mask):
    """[n, n] booleans, query i attends to key j, for a block-causal mask."""
    if mask == "full":
        return torch.ones(n, n, dtype=torch.bool)
    span = torch.cat([torch.full((m,), s) for s, (m, _) in enumerate(mask["spans"])])
    return span[None, :] <= span[:, None]


def spans_attention(q, k, v, seq_lens, masks):
    """Attention of each sequence on its own, under its mask."""
    return varlen_attention(q, k, v, seq_lens,
                            [attends(n, mask) for n, mask in zip(seq_lens.tolist(), masks)])


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
        self.attention = varlen_attention
        self.chunk = 0  # --block-causal

    def forward(self, x, cond, seq_lens, balancer=None):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(F.silu(cond)).chunk(6, -1)
        h = self.norm1(x) * (1 + scale1) + shift1
        head_dim = x.shape[1] // self.heads
        q, k, v = self.qkv(h).reshape(x.shape[0], 3, self.heads, head_dim).unbind(1)
        if balancer is not None:  # whole sequences, heads / bag size
            seq_lens, q, k, v = balancer.pre_attn(q, k, v)
        if self.chunk:
            # The masks of the sequences held now: the balancer's, or this
            # rank's own without it.
            masks = balancer.get_attention_masks() if balancer is not None else \
                block_causal_masks(seq_lens.tolist(), self.chunk)
            o = spans_attention(q, k, v, seq_lens, masks)
        else:
            o = self.attention(q, k, v, seq_lens)
        if balancer is not None:  # back to this rank's chunks, every head
            _, o = balancer.post_attn(o)
        x = x + gate1 * self.proj(o.reshape(x.shape[0], x.shape[1]))
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
    """Forward and backward (balancer None: unbalanced); returns [this rank's
    share of the loss]."""
    x_t, target, t_per_token, positions = batch
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=x_t.device)
    pred = model(x_t, t_per_token, positions, seq_lens, balancer)
    loss = ((pred - target) ** 2).mean(dim=-1).sum() / world_tokens
    loss.backward()
    return [loss.detach()]


def fully_shard_function():
    """torch's fully_shard (FSDP2) or None."""
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            return __import__(where, fromlist=["fully_shard"]).fully_shard
        except Exception:  # noqa: BLE001  (not there, or not importable on this Python)
            continue
    return None


def dtensor_class():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor
    return DTensor


def prepare(model, args, device):
    """Compile, checkpoint and shard the model, in that order (innermost
    first): each block's forward is compiled, the checkpoint wrapper
    recomputes it, FSDP shards the wrapped blocks. Returns the model to train."""
    blocks = list(model.blocks)
    if args.compile:
        if not hasattr(torch.library, "custom_op"):
            raise SystemExit(f"--compile: torch {torch.__version__} has no "
                             "torch.library.custom_op (2.4+), which the exchanges need")
        for block in blocks:
            block.attention = masked_attention
            # Dynamic shapes from the start: lengths change every step.
            block.forward = torch.compile(block.forward, backend=args.compile_backend,
                                          dynamic=True)
    if args.checkpoint:
        try:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl, checkpoint_wrapper)
        except Exception as error:  # noqa: BLE001  (torch 1.13 on Python 3.11: ValueError)
            raise SystemExit(f"--checkpoint: torch {torch.__version__}'s checkpoint_wrapper "
                             f"does not import here ({type(error).__name__}: {error})")
        impl = CheckpointImpl.REENTRANT if args.checkpoint == "reentrant" else \
            CheckpointImpl.NO_REENTRANT
        # What apply_activation_checkpointing does (which imports FSDP, and
        # torch 1.13's FSDP does not import on Python 3.11).
        for i, block in enumerate(blocks):
            model.blocks[i] = checkpoint_wrapper(block, checkpoint_impl=impl)
    if args.fsdp == "fsdp2":
        fully_shard = fully_shard_function()
        if fully_shard is None:
            raise SystemExit(f"--fsdp fsdp2: torch {torch.__version__} has no fully_shard")
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif args.fsdp == "fsdp1":
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        except Exception as error:  # noqa: BLE001  (torch 1.13 on Python 3.11: ValueError)
            raise SystemExit(f"--fsdp fsdp1: torch {torch.__version__}'s FSDP does not import "
                             f"here ({type(error).__name__}: {error})")
        wrapped = type(model.blocks[0])  # the checkpoint wrapper's class, if any
        model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({wrapped}),
                                         device_id=device, use_orig_params=True)
    return model


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
    parser.add_argument("--planner", help="a planner service: host:port, or replicas as "
                        "dns:///NAME:PORT or ipv4:A:P,B:Q (default: "
                        "$KNAPFORMER_PLANNER_ADDRESS; none = plan locally)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--print-imbalance", action="store_true",
                        help="rank 0 prints the planned per-rank workloads every step")
    parser.add_argument("--fsdp", nargs="?", const="auto", choices=["auto", "fsdp1", "fsdp2"],
                        help="shard the model: fully_shard (fsdp2), FullyShardedDataParallel "
                        "(fsdp1), or auto: fsdp2 on CUDA, fsdp1 on CPU (torch 2.6's fully_shard "
                        "does not run on CPU)")
    parser.add_argument("--checkpoint", nargs="?", const="non-reentrant",
                        choices=["non-reentrant", "reentrant"],
                        help="activation checkpointing on every block")
    parser.add_argument("--compile", action="store_true", help="torch.compile every block")
    parser.add_argument("--block-causal", type=int, default=0, metavar="N",
                        help="block-causal attention in chunks of N tokens, planned with the "
                        "masks")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile's backend (default inductor; aot_eager needs no "
                        "C++ compiler)")
    args = parser.parse_args()
    if args.fsdp == "auto":
        args.fsdp = "fsdp2" if args.device == "cuda" else "fsdp1"
    if args.steps < 1 or args.scale < 1 or args.d_model % args.heads:
        raise SystemExit("--steps and --scale must be >= 1 and --heads must divide --d-model")
    if args.block_causal < 0 or (args.block_causal and args.compile):
        raise SystemExit("--block-causal: N >= 1 tokens, and not with --compile (its masks "
                         "are Python lists, which would break the graph)")

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
    dit = DiT(args.d_model, args.heads, args.layers).to(device)
    for block in dit.blocks:
        block.chunk = args.block_causal
    model = prepare(dit, args, device)
    sharded = args.fsdp is not None
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

        balancer.plan_routing(lengths, args.d_model,
                              attn_masks=block_causal_masks(lengths, args.block_causal)
                              if args.block_causal else None)
        if args.print_imbalance and rank == 0:
            balancer.print_imbalance()
        # The step twice on the same weights and tokens, unbalanced then balanced,
        # each timed; the gradients kept, summed over the ranks unless FSDP did.
        total = world_tokens.item()
        runs = run_both(lambda b: train_step(model, batch, lengths, total, b), balancer,
                        parameters=model.parameters(), reduce=not sharded)

        losses = torch.stack(runs.plain.outputs + runs.balanced.outputs)
        dist.all_reduce(losses)
        times = [None] * world_size
        dist.all_gather_object(times, (runs.plain.seconds, runs.balanced.seconds, sum(lengths)))
        # Sharded gradients: every rank compared its own shards.
        grad_diff = runs.gradient_difference()
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
        for p, g in zip(model.parameters(), runs.balanced.gradients):
            if hasattr(p, "to_local"):  # FSDP2's DTensor parameters
                g = dtensor_class().from_local(g, p.device_mesh, p.placements)
            p.grad = g
        optimizer.step()

    if rank == 0:
        measured = slice(1, None) if args.steps > 1 else slice(None)  # step 0 warms up
        plain = sum(slowest["unbalanced"][measured]) / len(slowest["unbalanced"][measured])
        balanced = sum(slowest["balanced"][measured]) / len(slowest["balanced"][measured])
        setup = ", ".join(f"{name} {value}" for name, value in
                          (("fsdp", args.fsdp), ("checkpoint", args.checkpoint),
                           ("compile", args.compile_backend if args.compile else None),
                           ("block-causal", args.block_causal or None)) if value)
        first = "1" if args.steps > 1 else "0"
        print(f"[{setup or 'plain'}] slowest-rank compute, mean over steps {first}-"
              f"{args.steps - 1}: unbalanced {plain * 1e3:.0f} ms, balanced "
              f"{balanced * 1e3:.0f} ms ({plain / balanced:.2f}x); losses and gradients "
              f"{'agree' if ok else 'DISAGREE'} (worst relative gradient difference "
              f"{worst_grad_diff:.1e})", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
