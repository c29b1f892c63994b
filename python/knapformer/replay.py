"""knapformer replay: what balancing buys on the kernels this device runs.

For a data source and a world size, every step is planned with the
project's planner, then each simulated GPU's share of one transformer block
is played on this one device, in turn, as it would run after the route: the
linear layers on the tokens it holds, and attention on whole sequences (all
heads on a one-GPU bag, 1/G of them on each GPU of a G-GPU bag: Ulysses),
forward and backward; on CUDA, unmasked sequences in one fused
variable-length call where torch has one (SDPA over jagged nested tensors,
torch 2.x), masked ones one call each with a dense mask. The same steps are
played without balancing (each GPU its own sequences). Measured: the
slowest GPU's time with and without balancing, and the max/mean of the
GPUs' times against the plan's predicted max/mean. Communication is not
played (one device): it is priced at the link speeds given (a model), and
each step's moved bytes are in --json.
Each topology is planned by the transformer cost model and by the measured
one (this device's attention timed per length, as calibrate --table
tabulates it), to show which balances the measured time better.

    python3 -m knapformer.replay --data mixed-res --world 8 --d-model 256 --heads 4 \\
        --length-scale 8 --topology g1n8,g2n4,g4n2,auto

On CPU the widths and lengths must be small (--length-scale divides every
length); on a GPU, --model flux plays the paper's FLUX block (d_model 3072,
24 heads of 128, bf16). docs/planner.md has the figures and how to read them.
"""
import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

import torch

import knapformer
from knapformer import _C
from knapformer._masks import dense

MODELS = {"flux": (3072, 24)}  # d_model, heads (the paper's FLUX block)
# The default: the world's one-size layouts with bags of up to 4 GPUs (those
# that divide --world; bigger bags cost a real kernel run each), and auto.
DEFAULT_MAX_BAG = 4


class ReplayError(ValueError):
    """A bad argument; the message names it."""


# --- data ---------------------------------------------------------------------------------


def _scaled_codes(data, world):
    """The data codes of ``data`` (a scenario or codes) for ``world`` GPUs:
    as given when the world is a multiple of their GPUs, else each code's
    GPU count divided alike (mixed-res's 32 GPUs at 8: g16 -> g4, ...)."""
    codes = _C.scenario_codes(data) or data
    parts = codes.split(",")
    gpus = []
    for part in parts:
        if not part.startswith("g") or "b" not in part:
            raise ReplayError(f"--data: '{part}' is not a data code g{{G}}b{{B}}i{{R}}f{{F}}s{{S}}")
        gpus.append(int(part[1:part.index("b")]))
    total = sum(gpus)
    if world % total == 0:
        return codes
    if total % world or any(g * world % total for g in gpus):
        raise ReplayError(f"--world {world}: the data's {total} GPUs ({codes}) cannot be "
                          f"scaled to it; use a multiple or a divisor of {total} that divides "
                          f"every code's G")
    return ",".join(f"g{g * world // total}{p[p.index('b'):]}" for g, p in zip(gpus, parts))


class Data:
    """Every step's lengths (and masks) of one source, every length divided
    by ``scale`` (at least one token; a mask's spans and window alike)."""

    def __init__(self, args):
        self.scale = args.length_scale
        if args.lengths:
            if (args.samples_per_gpu > 0) == (args.tokens_per_gpu > 0):
                raise ReplayError("--lengths: give --samples-per-gpu N or --tokens-per-gpu T "
                                  "(how your loader fills one GPU's batch)")
            self.stream = knapformer.LengthsStream(
                args.lengths, args.world, samples_per_gpu=args.samples_per_gpu,
                tokens_per_gpu=args.tokens_per_gpu, seed=args.seed, shuffle=args.shuffle)
            self.name = f"{args.lengths} ({self.stream.samples} samples)"
            self.codes = None
        elif args.data in _C.masked_scenario_names():
            self.stream = None
            self.codes = args.data  # its ranks are alike: any world size
            self.name = f"{args.data} (masked)"
        else:
            self.stream = None
            self.codes = _scaled_codes(args.data, args.world)
            self.name = f"{args.data} ({self.codes})"
        self.world = args.world
        self.seed = args.seed

    def step(self, step):
        if self.stream is not None:
            lengths, masks = self.stream.batch(step)
        else:
            lengths, masks = knapformer.synthetic_batch(self.codes, self.world, self.seed, step)
        if self.scale > 1:
            lengths = [[max(1, n // self.scale) for n in rank] for rank in lengths]
            if masks is not None:
                masks = [[_scaled_mask(m, self.scale) for m in rank] for rank in masks]
                lengths = [[_mask_length(m, n) for m, n in zip(mr, lr)]
                           for mr, lr in zip(masks, lengths)]
        return lengths, masks


def _scaled_mask(mask, scale):
    if isinstance(mask, dict) and "window" in mask:
        return {"window": max(1, mask["window"] // scale)}
    if isinstance(mask, dict) and "spans" in mask:
        return {"spans": [[max(1, n // scale), kind] for n, kind in mask["spans"]]}
    return mask


def _mask_length(mask, length):
    """A scaled sequence's length: its spans' sum where it has spans."""
    if isinstance(mask, dict) and "spans" in mask:
        return sum(n for n, _ in mask["spans"])
    return length


def is_full(mask):
    """Whether a sequence with ``mask`` attends every pair (no mask)."""
    return mask is None or mask == "full"


def attends(n, mask):
    """The dense [n, n] mask of who attends whom; None for full attention
    (the kernel's unmasked path)."""
    return None if is_full(mask) else dense(n, mask)


def attended_pairs(n, mask):
    dense = attends(n, mask)
    return n * n if dense is None else int(dense.sum())


# --- what each simulated GPU plays --------------------------------------------------------


class Share:
    """One simulated GPU's part of a block: the tokens its linear layers see,
    and the sequences its attention sees with the fraction of the heads."""

    def __init__(self):
        self.tokens = 0
        self.sequences = []  # (length, mask)
        self.head_fraction = 1.0

    def sequence_pairs(self):
        """Each sequence's attended (query, key) pairs, all heads."""
        return [attended_pairs(n, m) for n, m in self.sequences]

    def pairs(self):
        """Attended (query, key) pairs, times its fraction of the heads."""
        return self.head_fraction * sum(self.sequence_pairs())


def unbalanced_shares(lengths, masks):
    shares = []
    for r, rank in enumerate(lengths):
        share = Share()
        share.tokens = sum(rank)
        share.sequences = [(n, masks[r][i] if masks else None) for i, n in enumerate(rank)]
        shares.append(share)
    return shares


def balanced_shares(result, lengths, masks, world):
    """Each GPU's share under a whole-world plan (knapformer.plan's dict)."""
    shares = [Share() for _ in range(world)]
    for chunk in result["chunks"]:
        shares[chunk["dst_rank"]].tokens += chunk["length"]
    bag_of = {}
    for bag in _C.multi_gpu_bags(result["topology"], world):
        for rank in bag:
            bag_of[rank] = tuple(bag)
    seen = {}
    for chunk in result["chunks"]:
        key = (chunk["src_rank"], chunk["seq_index"])
        dst = chunk["dst_rank"]
        holder = bag_of.get(dst, (dst,))
        if seen.setdefault(key, holder) != holder:
            raise RuntimeError(f"sequence {key} is split over two bags: {seen[key]}, {holder}")
    for (src, index), holder in sorted(seen.items()):
        mask = masks[src][index] if masks else None
        for rank in holder:
            shares[rank].sequences.append((lengths[src][index], mask))
            shares[rank].head_fraction = 1.0 / len(holder)
    return shares


def cost_model_work(share, d_model, gamma, cost_table=None):
    """The cost model's work of a Share: 24*T*d^2 for its tokens, and its
    fraction of the heads of each sequence's attention, gamma*4*pairs*d or
    the measured attention of ``cost_table`` (each sequence priced alone)."""
    return _C.share_work(share.tokens, share.sequence_pairs(), share.head_fraction, d_model,
                         gamma, None if cost_table is None else json.dumps(cost_table))


# --- playing it ---------------------------------------------------------------------------


def varlen_available():
    """Whether this torch has the fused variable-length path: SDPA over
    jagged nested tensors (torch 2.x; not 1.13)."""
    return (getattr(torch.nn.functional, "scaled_dot_product_attention", None) is not None
            and hasattr(torch.nested, "nested_tensor_from_jagged"))


def varlen_sdpa(q, k, v, offsets):
    """Attention of packed sequences in one call: q, k, v are [tokens,
    heads, head_dim], sequence i is rows offsets[i]:offsets[i + 1]; the
    output is packed alike. No sequence attends another."""
    def jagged(t):  # [sequences, heads, ragged, head_dim]
        return torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v))
    return o.transpose(1, 2).values()


class Block:
    """One transformer block's weights: QKV, output projection and a 4x MLP
    (the cost model's 24*d^2 per token), on the device in its dtype.
    ``varlen``: a share's unmasked sequences attend in one fused call
    (varlen_sdpa), as a trainer's variable-length kernel runs them; else,
    and for masked ones, one call per sequence."""

    def __init__(self, d_model, heads, device, dtype, varlen=False):
        if d_model % heads:
            raise ReplayError(f"--heads {heads} does not divide --d-model {d_model}")
        self.d, self.heads, self.device, self.dtype = d_model, heads, device, dtype
        make = lambda i, o: torch.nn.Linear(i, o, device=device, dtype=dtype)  # noqa: E731
        self.qkv, self.proj = make(d_model, 3 * d_model), make(d_model, d_model)
        self.up, self.down = make(d_model, 4 * d_model), make(4 * d_model, d_model)
        self.sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
        self.varlen = varlen

    def linear(self, tokens, checkpoint=False):
        """The linear layers on ``tokens`` rows, forward and backward."""
        x = torch.randn(tokens, self.d, device=self.device, dtype=self.dtype, requires_grad=True)
        passes = 2 if checkpoint else 1  # the recompute of activation checkpointing
        for p in range(passes):
            grad = p == passes - 1
            with torch.set_grad_enabled(grad):
                y = self.proj(self.qkv(x)[:, :self.d]) + self.down(
                    torch.nn.functional.gelu(self.up(x)))
            if grad:
                y.backward(torch.ones_like(y))

    def attention(self, sequences, head_fraction, checkpoint=False):
        """Attention of whole sequences with ``head_fraction`` of the heads."""
        heads = round(self.heads * head_fraction)
        if heads < 1 or abs(heads - self.heads * head_fraction) > 1e-9:
            raise ReplayError(f"--heads {self.heads}: a bag of {round(1 / head_fraction)} GPUs "
                              f"splits the heads unevenly (Ulysses needs a multiple)")
        head_dim = self.d // self.heads
        passes = 2 if checkpoint else 1
        if self.varlen:
            plain = [n for n, mask in sequences if n > 0 and is_full(mask)]
            sequences = [(n, mask) for n, mask in sequences if not is_full(mask)]
            if plain:
                offsets = torch.tensor([0] + list(itertools.accumulate(plain)),
                                       device=self.device)
                q, k, v = (torch.randn(sum(plain), heads, head_dim, device=self.device,
                                       dtype=self.dtype, requires_grad=True) for _ in range(3))
                for p in range(passes):
                    with torch.set_grad_enabled(p == passes - 1):
                        o = varlen_sdpa(q, k, v, offsets)
                o.backward(torch.ones_like(o))
        for n, mask in sequences:
            q, k, v = (torch.randn(1, heads, n, head_dim, device=self.device, dtype=self.dtype,
                                   requires_grad=True) for _ in range(3))
            dense = attends(n, mask)
            if dense is not None:
                dense = dense.to(self.device)
            for p in range(passes):
                grad = p == passes - 1
                with torch.set_grad_enabled(grad):
                    if self.sdpa is not None:
                        o = self.sdpa(q, k, v, attn_mask=dense)
                    else:  # torch 1.13
                        s = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
                        if dense is not None:
                            s = s.masked_fill(~dense, float("-inf"))
                        o = torch.softmax(s, -1) @ v
                if grad:
                    o.backward(torch.ones_like(o))


def _now(device):
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _elapsed(device, start, stop):
    if device.type == "cuda":
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3
    return stop - start


def time_share(block, share, checkpoint, repeat):
    """Seconds of one GPU's share, forward and backward: the median of
    ``repeat`` plays after one untimed."""
    def play():
        if share.tokens:
            block.linear(share.tokens, checkpoint)
        if share.sequences:
            block.attention(share.sequences, share.head_fraction, checkpoint)
    play()
    times = []
    for _ in range(repeat):
        start = _now(block.device)
        play()
        times.append(_elapsed(block.device, start, _now(block.device)))
    return statistics.median(times)


def fit_cost(block, min_length, max_length, checkpoint, repeat, gamma=None):
    """Whole blocks timed alone at lengths a factor sqrt(2) apart from
    ``min_length`` (at least 8) to ``max_length``: calibrate's fit of those
    from max_length / 16 up (k alone with ``gamma`` given; at shorter
    lengths a narrow block's time is mostly overhead, which bends the fit's
    two terms), and the measured cost model's table of all of them
    (``cost_table``, what ``knapformer calibrate --table`` writes)."""
    count = 1 + math.ceil(2 * math.log2(max_length / max(8, min(min_length, max_length))))
    lengths = sorted({max(8, int(max_length / 2 ** (i / 2))) for i in range(max(2, count))})
    seconds = []
    for n in lengths:
        share = Share()
        share.tokens, share.sequences = n, [(n, None)]
        seconds.append(time_share(block, share, checkpoint, repeat))
    long = [i for i, n in enumerate(lengths) if n >= max_length / 16] or range(len(lengths))
    try:
        fit = dict(_C.fit_cost_model([lengths[i] for i in long], [seconds[i] for i in long],
                                     block.d, gamma))
    except RuntimeError as error:  # times that do not grow as the model says
        raise ReplayError(f"the fit of k and gamma failed ({error}); give --gamma G to fit "
                          f"k alone") from None
    fit["cost_table"] = json.loads(_C.cost_table_json(lengths, seconds, block.d, fit["k"],
                                                      fit["gamma"]))
    return fit, lengths, seconds


def _read_cost_table(path, d_model):
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except (OSError, ValueError) as error:
        raise ReplayError(f"--cost-table: {error}") from None
    if not isinstance(table, dict) or table.get("d_model") != d_model:
        raise ReplayError(f"--cost-table: {path} was measured at d_model "
                          f"{table.get('d_model') if isinstance(table, dict) else '?'}, "
                          f"the block has {d_model}")
    return table


# --- the run ------------------------------------------------------------------------------


def _slow_rank_speeds(text, world):
    """--slow-rank R:F as every simulated GPU's speed (1 but R's)."""
    try:
        rank, fraction = text.split(":")
        rank, fraction = int(rank), float(fraction)
    except ValueError:
        raise ReplayError(f"--slow-rank: '{text}' is not R:F (a GPU and its fraction of the "
                          f"others' speed)") from None
    if not 0 <= rank < world:
        raise ReplayError(f"--slow-rank: GPU {rank} is outside [0, {world}) (--world {world})")
    if not 0.05 <= fraction <= 1:
        raise ReplayError(f"--slow-rank: fraction {fraction} is outside [0.05, 1]")
    return [fraction if g == rank else 1.0 for g in range(world)]


def device_name(device):
    """What the figures were measured on: the GPU's name, or the CPU's."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"cpu ({model or 'unknown'}, {torch.get_num_threads()} threads)"


def _max_over_mean(values):
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else 1.0


def replay(args, out=sys.stdout):
    """Runs the replay of ``args`` (parse_args); returns the per-topology
    results (dicts), printing the table to ``out``."""
    if args.world < 1:
        raise ReplayError(f"--world: must be >= 1, got {args.world}")
    for flag in ("steps", "repeat", "length_scale", "blocks"):
        if getattr(args, flag) < 1:
            raise ReplayError(f"--{flag.replace('_', '-')}: must be >= 1, got "
                              f"{getattr(args, flag)}")
    d_model, heads = MODELS[args.model] if args.model else (args.d_model, args.heads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(args.seed)
    if args.attention == "varlen" and not varlen_available():
        raise ReplayError(f"--attention varlen: torch {torch.__version__} has no SDPA over "
                          f"jagged nested tensors (torch 2.x); use per-sequence")
    # On CPU torch 2.6 runs jagged SDPA through a slower fallback (3x one
    # call per sequence at 4096 tokens in sequences of 64-256): auto takes
    # the fused path on CUDA only, where it is flash or memory-efficient.
    varlen = args.attention == "varlen" or (
        args.attention == "auto" and device.type == "cuda" and varlen_available())
    block = Block(d_model, heads, device, dtype, varlen)
    measured_on = device_name(device)
    data = Data(args)
    steps = [data.step(s) for s in range(args.steps)]
    all_lengths = [n for lengths, _ in steps for rank in lengths for n in rank if n > 0]
    if not all_lengths:
        raise ReplayError(f"{data.name}: no tokens in {args.steps} steps")
    models = ["transformer", "measured"] if args.cost_model == "both" else [args.cost_model]
    cost_table = _read_cost_table(args.cost_table, d_model) if args.cost_table else None
    gamma, k, fit_note = args.gamma, None, "given"
    if args.gamma is None or ("measured" in models and cost_table is None):
        fit, _, _ = fit_cost(block, min(all_lengths), max(all_lengths), args.checkpoint,
                             args.repeat, args.gamma)
        k = fit["k"]
        if args.gamma is None:
            gamma, fit_note = fit["gamma"], f"fitted here (r^2 {fit['r_squared']:.3f})"
        if cost_table is None:
            cost_table = fit["cost_table"]
    table_note, table_path = "", args.cost_table
    if "measured" in models:
        if not table_path:  # beside the report: the advice's trainer arguments load it
            table_path = os.path.abspath(args.table_out or (
                f"{args.json[:-5] if args.json.endswith('.json') else args.json}.cost_table.json"
                if args.json else "replay.cost_table.json"))
            try:
                with open(table_path, "w", encoding="utf-8") as f:
                    json.dump(cost_table, f, indent=1)
            except OSError as error:
                raise ReplayError(f"the measured table fitted here: cannot write {table_path} "
                                  f"({error.strerror}); --table-out FILE puts it elsewhere")
        table_note = (f"; measured table of {len(cost_table['measured_attention']['pairs'])} "
                      f"lengths ({'--cost-table ' if args.cost_table else 'fitted here, in '}"
                      f"{table_path})")
    # What auto prices communication against: this device's measured rate
    # and the links given. The planner prices a block's forward pass; the
    # fit timed forward and backward (and the recompute), about 3 (4)
    # forwards: its seconds per unit of work k make passes / k units per
    # second of forward.
    passes = 4 if args.checkpoint else 3
    machine = {}
    if k:
        machine["flops_per_second"] = passes / k
    for flag, field in (("intra_node_gbps", "intra_node_bytes_per_second"),
                        ("inter_node_gbps", "inter_node_bytes_per_second")):
        if getattr(args, flag) is not None:
            machine[field] = getattr(args, flag) * 1e9
    if args.gpus_per_node is not None:
        machine["gpus_per_node"] = args.gpus_per_node
    w = args.world
    speeds = _slow_rank_speeds(args.slow_rank, w) if args.slow_rank else None
    if args.topology:
        topologies = [t for t in args.topology.split(",") if t]
    else:
        topologies = _C.homogeneous_specs(w, DEFAULT_MAX_BAG) + ["auto"]
    print(f"replay: {data.name}, world {w}, {args.steps} steps, lengths / {data.scale}; "
          f"block d_model {d_model}, {heads} heads, {dtype} on {measured_on}, "
          f"attention {'varlen (masked: per sequence)' if varlen else 'per sequence'}"
          f"{', activation checkpointing' if args.checkpoint else ''}; "
          f"gamma {gamma:.3g} ({fit_note}){table_note}"
          f"{f'; auto prices links against {passes * 1e-12 / k:.4g} TFLOP/s measured' if k else ''}",
          file=out, flush=True)  # before the progress lines on stderr

    # Without balancing: the same for every topology. Its time is what each
    # row takes again (the same tokens, played in other shares): the
    # progress lines on stderr say how long the rest should take.
    started = time.monotonic()
    unbalanced = []
    for lengths, masks in steps:
        unbalanced.append([time_share(block, s, args.checkpoint, args.repeat)
                           for s in unbalanced_shares(lengths, masks)])
    if speeds:  # the slowed GPU's played times, unbalanced too
        unbalanced = [[t / speeds[g] for g, t in enumerate(step)] for step in unbalanced]
    # With a slowed GPU each row twice: planned by FLOPs, then by its speed.
    rows = [(t, m, by) for t in topologies for m in models
            for by in ((None, speeds) if speeds else (None,))]
    per_row = time.monotonic() - started
    print(f"replay: {args.steps} steps played unbalanced in {per_row:.1f} s; {len(rows)} rows "
          f"to play, expected about {per_row * len(rows):.0f} s", file=sys.stderr, flush=True)
    results = []
    for done, (topology, model, by_speed) in enumerate(rows, 1):
        table = cost_table if model == "measured" else None
        row = {"topology": topology, "cost_model": model, "steps": [],
               "planned_by": "speed" if by_speed else "FLOPs"}
        for (lengths, masks), before in zip(steps, unbalanced):
            plan = knapformer.plan(lengths, topology, d_model=d_model, gamma=gamma,
                                   attn_masks=masks, machine=machine or None,
                                   cost_model=model, cost_table=table, rank_speeds=by_speed)
            shares = balanced_shares(plan, lengths, masks, w)
            after = [time_share(block, s, args.checkpoint, args.repeat) for s in shares]
            if speeds:
                after = [t / speeds[g] for g, t in enumerate(after)]
            tokens = [s.tokens for s in shares]
            pairs = [s.pairs() for s in shares]  # dense masks: counted once
            row["steps"].append({
                "layout": plan["topology"],
                "tokens": tokens,
                "pairs": pairs,
                "predicted_workload": plan["gpu_workload"],
                "played_workload": [cost_model_work(s, d_model, gamma, table) for s in shares],
                "flops": passes * sum(cost_model_work(s, d_model, 1.0) for s in shares),
                "seconds_before": before, "seconds_after": after,
                "predicted_max_over_mean": plan["after"]["max_over_mean"],
                "measured_max_over_mean": _max_over_mean(after),
                "moved_bytes": plan["moved_bytes"],
                # The slowest GPU's Ulysses and route time of one block's
                # forward, priced on the machine (a model), twice for the
                # backward's mirrored exchanges.
                "comm_model_seconds": 2 * (plan["predicted_step"]["ulysses_seconds"] +
                                           plan["predicted_step"]["route_seconds"]),
            })
        steps_of = row["steps"]
        row["slowest_before"] = statistics.mean(max(s["seconds_before"]) for s in steps_of)
        row["slowest_after"] = statistics.mean(max(s["seconds_after"]) for s in steps_of)
        row["speedup"] = row["slowest_before"] / row["slowest_after"]
        row["predicted_max_over_mean"] = statistics.mean(
            s["predicted_max_over_mean"] for s in steps_of)
        row["measured_max_over_mean"] = statistics.mean(
            s["measured_max_over_mean"] for s in steps_of)
        row["miss"] = row["measured_max_over_mean"] / row["predicted_max_over_mean"] - 1
        row["comm_model_seconds"] = statistics.mean(s["comm_model_seconds"] for s in steps_of)
        mean_tokens = statistics.mean(sum(s["tokens"]) for s in steps_of)
        row["fbl_seconds"] = row["slowest_after"] * args.blocks
        row["tps"] = mean_tokens / row["fbl_seconds"]
        # HFU as the paper defines it: the FLOPs the hardware ran (the
        # block's forward, backward twice its size, the recompute) over what
        # the world's GPUs could run while the slowest one worked.
        flops = statistics.mean(s["flops"] for s in steps_of)
        row["hfu"] = (flops / (w * row["slowest_after"] * args.tflops * 1e12)
                      if args.tflops else None)
        results.append(row)
        elapsed = time.monotonic() - started
        left = (elapsed - per_row) / done * (len(rows) - done)
        print(f"replay: row {done}/{len(rows)} ({topology}, {model}) after {elapsed:.0f} s"
              f"{f', about {left:.0f} s left' if done < len(rows) else ''}", file=sys.stderr,
              flush=True)
    trainer = f"gamma={gamma!r}" + (f", machine={machine!r}" if machine else "")
    if speeds:
        trainer += f", rank_speeds={speeds!r}"
    _print_table(results, args, out, trainer, table_path)
    if args.png:
        _plot(results, args.png)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": measured_on, "gamma": gamma, "k": k,
                       "cost_table": cost_table,
                       "attention": "varlen" if varlen else "per-sequence", "results": results},
                      f, indent=1)
    return results


def _print_table(results, args, out, trainer_arguments, table_path):
    slowed = bool(args.slow_rank)  # a last column: what each row was planned by
    print(f"\n{'topology':<16} {'model':<11} {'slowest unbal.':>14} {'slowest bal.':>12} "
          f"{'buys':>6} "
          f"{'max/mean pred.':>14} {'measured':>9} {'miss':>7} {'comm model':>10} "
          f"{'FBL':>9} {'TPS':>10} {'HFU':>6}{' planned by' if slowed else ''}", file=out)
    for r in results:
        hfu = "-" if r["hfu"] is None else f"{100 * r['hfu']:.1f}%"
        print(f"{r['topology']:<16} {r['cost_model']:<11} {r['slowest_before'] * 1e3:>12.2f}ms "
              f"{r['slowest_after'] * 1e3:>10.2f}ms {r['speedup']:>5.2f}x "
              f"{r['predicted_max_over_mean']:>14.3f} {r['measured_max_over_mean']:>9.3f} "
              f"{100 * r['miss']:>+6.1f}% {r['comm_model_seconds'] * 1e3:>8.3g}ms "
              f"{r['fbl_seconds']:>8.3f}s {r['tps']:>10.0f} "
              f"{hfu:>6}{' ' + r['planned_by'] if slowed else ''}", file=out)
    if slowed:
        print(f"\n--slow-rank {args.slow_rank}: that GPU's played times are divided by its "
              f"fraction, unbalanced and balanced; each row is planned by FLOPs and by speed "
              f"(rank_speeds), and the advice is of the rows planned by speed.", file=out)
        results = [r for r in results if r["planned_by"] == "speed"]
    print(f"\nslowest = the slowest simulated GPU's block, forward and backward, mean over "
          f"steps; FBL = it times {args.blocks} blocks; TPS = tokens per step / FBL; miss = "
          f"measured max/mean against the plan's predicted one (the cost model's error on "
          f"this device); model = what the plan priced by: transformer (24*l*d^2 + "
          f"gamma*4*l^2*d) or measured (the fit's linear term and this device's measured "
          f"attention by length, calibrate --table); HFU = the FLOPs run over --tflops per "
          f"GPU for the slowest GPU's time (- without --tflops). Communication is not "
          f"played: comm model = the slowest GPU's Ulysses and route time, forward and "
          f"backward, priced at the link "
          f"speeds of --intra-node-gbps, --inter-node-gbps, --gpus-per-node (a model, not a "
          f"measurement; not in FBL).", file=out)
    print(f"\n{advice(results, trainer_arguments, table_path)}", file=out)


def advice(results, trainer_arguments="", table_path=None):
    """The line that says which topology (and cost model) to use: the
    fastest block on the slowest GPU, its measured compute plus the
    modelled communication; auto when within 1% of it (it adapts to the
    data). The choice and its line are simulate's (planner/advice.h),
    ending with the SequenceBalancer call that plans as the replay did
    (its gamma, the machine auto priced by, the measured table's file);
    '' without results or with no time."""
    rows = [(r["topology"], r["cost_model"], r["slowest_after"] + r["comm_model_seconds"],
             r["slowest_before"]) for r in results]
    return _C.topology_advice(
        rows, unit="ms", seconds_note=" (measured compute, modelled communication)",
        baseline="without balancing", trainer_arguments=trainer_arguments,
        measured_arguments=f"cost_table=json.load(open({table_path!r}))" if table_path else "")


def _plot(results, path):
    """Each simulated GPU's measured time without and with balancing, first
    step, one panel per topology (needs matplotlib: pip install
    knapformer[plot])."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ReplayError(f"--png: needs matplotlib ({error})") from None
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 2.2 * len(results)), squeeze=False)
    for ax, row in zip(axes[:, 0], results):
        step = row["steps"][0]
        gpus = range(len(step["seconds_after"]))
        ax.bar([g - 0.2 for g in gpus], [t * 1e3 for t in step["seconds_before"]], 0.4,
               label="unbalanced")
        ax.bar([g + 0.2 for g in gpus], [t * 1e3 for t in step["seconds_after"]], 0.4,
               label="balanced")
        ax.set_title(f"{row['topology']} ({step['layout']}), {row['cost_model']} model",
                     fontsize=9)
        ax.set_ylabel("ms")
    axes[0, 0].legend(fontsize=8)
    axes[-1, 0].set_xlabel("simulated GPU")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="knapformer replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", default="mixed-res",
                        help="a scenario (low-res, mixed-res, joint), data codes or a masked "
                        "stream (video-blockcausal, interleaved, llm-packed)")
    source.add_argument("--lengths", help="your own data: one sample per line, tokens[,mask]")
    parser.add_argument("--samples-per-gpu", type=int, default=0)
    parser.add_argument("--tokens-per-gpu", type=int, default=0)
    parser.add_argument("--shuffle", type=lambda v: v == "on", default=True,
                        help="on|off: shuffle the lengths file each epoch")
    parser.add_argument("--world", type=int, default=8, help="simulated GPUs")
    parser.add_argument("--topology", help="comma-separated (default g1nW,g2nW/2,g4nW/4,auto: "
                        "those whose bags divide --world)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=sorted(MODELS), help="a preset block")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=57, help="blocks per model, for FBL")
    parser.add_argument("--length-scale", type=int, default=1,
                        help="divide every length by this (CPU runs)")
    parser.add_argument("--gamma", type=float, help="skip the fit and plan with this gamma")
    parser.add_argument("--cost-model", choices=("transformer", "measured", "both"),
                        default="both", help="plan by the transformer model, the measured one "
                        "(attention timed per length here, or --cost-table), or each in turn")
    parser.add_argument("--cost-table", help="the measured model's table, as calibrate --table "
                        "writes it (default: fitted here)")
    parser.add_argument("--checkpoint", action="store_true", help="play the recompute too")
    parser.add_argument("--attention", choices=("auto", "varlen", "per-sequence"), default="auto",
                        help="unmasked sequences in one fused SDPA call over jagged "
                             "nested tensors (varlen; auto: on CUDA where torch has it) "
                             "or one call each")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when there is one)")
    parser.add_argument("--repeat", type=int, default=3, help="timed plays per share")
    parser.add_argument("--intra-node-gbps", type=float,
                        help="GB/s each way within a node, for auto (planner's default 450)")
    parser.add_argument("--inter-node-gbps", type=float,
                        help="GB/s each way across nodes, for auto (planner's default 50)")
    parser.add_argument("--gpus-per-node", type=int, help="for auto (planner's default 8)")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--table-out", help="where the measured table fitted here goes, for "
                        "SequenceBalancer(cost_table=...) (default: beside --json as "
                        "NAME.cost_table.json, else replay.cost_table.json; none is written "
                        "with --cost-table or without the measured model)")
    parser.add_argument("--png", help="draw each GPU's time before and after (matplotlib)")
    parser.add_argument("--slow-rank", help="R:F: simulated GPU R runs at fraction F of the "
                        "others' speed (its played times / F); every row is then planned by "
                        "FLOPs and by speed (rank_speeds), and both are played")
    parser.add_argument("--tflops", type=float,
                        help="peak TFLOP/s of one GPU in the dtype played, for HFU "
                             "(default: 989.4 on CUDA, an H100's bf16; none on CPU)")
    args = parser.parse_args(argv)
    if args.lengths:
        args.data = None
    if args.tflops is None and (args.device or ("cuda" if torch.cuda.is_available()
                                                 else "cpu")) != "cpu":
        args.tflops = 989.4
    return args


def main(argv=None):
    try:
        replay(parse_args(argv))
    except (ReplayError, ValueError) as error:
        sys.exit(f"knapformer replay: {error}")


if __name__ == "__main__":
    main()
