"""The checks of the training setup around the balancer (issue 35), on any device:
fsdp2_checkpoint, a model sharded with FSDP2 (fully_shard) and non-reentrant
activation checkpointing on every block, and compiled_block, one attention block
under torch.compile. Both run every step twice on the same weights, unbalanced and
balanced, in float64, and must agree within rtol 1e-10; where torch lacks what a
check needs, its row is SKIP with the reason. The models (Model, Block, StreamMLP;
CompiledBlock, masked_attention) are also what tests/python/test_fsdp.py and
test_compile.py run on CPU, so the GPU check runs what CI proves there."""
import functools
import math

import torch
import torch.distributed as dist

import knapformer
from knapformer import _compile
from knapformer.gpu_check.report import one_line, problems_text, result
from knapformer.gpu_check.step_checks import ATOL, RTOL
from knapformer.side_by_side import compare, masked_attention, run_both, varlen_attention

HEAD_DIM = 4
TEXT, IMAGE = 0, 1
FSDP_STEPS = 3  # an ordinary step, one where only rank 0 has a (short) sequence, another
COMPILE_STEPS = 8
SETTLED_AFTER = 3  # no step after this one (counted from 0) may compile


# -- what this torch offers ---------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def fully_shard_or_reason():
    """(fully_shard, None), or (None, why not: the import errors)."""
    errors = []
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = __import__(where, fromlist=["fully_shard"])
        except Exception as error:  # noqa: BLE001  (any import failure is the reason)
            errors.append(f"{where}: {type(error).__name__}: {one_line(error)}")
            continue
        if hasattr(module, "fully_shard"):
            return module.fully_shard, None
        errors.append(f"{where} has no fully_shard")
    return None, f"torch {torch.__version__} has no usable fully_shard (FSDP2): " + \
        "; ".join(errors)


def fsdp2_missing():
    """None when this torch has fully_shard, else why not (the same on every rank)."""
    return fully_shard_or_reason()[1]


def compile_missing():
    """None when the balancer's exchanges can be traced by torch.compile here."""
    if not _compile.available():
        return (f"torch {torch.__version__} has no torch.library.custom_op (2.4+): the "
                "balancer's exchanges cannot be custom ops there, and torch.compile would "
                "break the graph at each")
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
        supported = is_dynamo_supported()
    except Exception:  # noqa: BLE001  (no such probe in this torch: assume it works)
        supported = True
    if not supported:
        return f"torch.compile is not supported by torch {torch.__version__} on this Python"
    return None


def _topology(ctx):
    """One with multi-GPU bags where the world has 2 or more ranks (the mix where it
    fits, else one bag of every rank); one-GPU bags on one rank."""
    mixed = [t for t in ctx.topologies if "+" in t]
    return mixed[0] if mixed else ctx.topologies[-1]


def _heads(topology):
    """4, or a multiple of the topology's largest bag (attention splits the heads over
    a bag's GPUs): 4 heads of 4 on 4 ranks, as in tests/python/test_fsdp.py."""
    bag = max(int(term[1:].split("n")[0]) for term in topology.split("+"))
    return math.lcm(4, bag)


def _row(name, worst, problems, figures, passed):
    """FAIL naming the largest difference and the problems, else PASS saying `passed`."""
    if problems:
        largest = f"largest relative difference {worst:.3g}: " if worst > RTOL else ""
        return result(name, "FAIL", largest + problems_text(problems), figures)
    return result(name, "PASS", passed, figures)


# -- fsdp2_checkpoint ---------------------------------------------------------------------

class StreamMLP(torch.nn.Module):
    """One modality's MLP (MMDiT-style): an FSDP unit of its own, so every rank runs
    it every step, with or without tokens of its modality."""

    def __init__(self, d_model):
        super().__init__()
        self.up = torch.nn.Linear(d_model, 2 * d_model)
        self.down = torch.nn.Linear(2 * d_model, d_model)

    def forward(self, h):
        return self.down(torch.nn.functional.gelu(self.up(h)))


class Block(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.streams = torch.nn.ModuleList([StreamMLP(d_model), StreamMLP(d_model)])
        self.balancer = None  # set per run: None = unbalanced

    def forward(self, h, modality, seq_lens):
        d_model = h.shape[1]
        q, k, v = self.qkv(h).reshape(h.shape[0], 3, self.heads,
                                      d_model // self.heads).unbind(1)
        if self.balancer is not None:
            seq_lens, q, k, v = self.balancer.pre_attn(q, k, v)
        # With no sequences still in the graph: every rank's qkv weights get a
        # gradient, and FSDP2 reduce-scatters only the gradients a rank has.
        o = varlen_attention(q, k, v, seq_lens)
        if self.balancer is not None:
            _, o = self.balancer.post_attn(o)
        h = h + self.proj(o.reshape(h.shape[0], d_model))
        mixed = torch.zeros_like(h)
        for kind, stream in enumerate(self.streams):
            rows = (modality == kind).nonzero().squeeze(1)
            # Called on no rows too: FSDP needs every rank in every unit.
            mixed = mixed.index_add(0, rows, stream(h.index_select(0, rows)))
        return h + mixed


class Model(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(d_model, heads) for _ in range(2))

    def forward(self, x, modality, seq_lens, balancer):
        if balancer is not None:
            seq_lens, x, (modality,) = balancer.route(x, [modality])
        for block in self.blocks:
            x = block(x, modality, seq_lens)
        if balancer is not None:
            _, x, _ = balancer.reverse_route(x)
        return x


def _sharded(model, fully_shard, mesh):
    """Non-reentrant activation checkpointing on every block, then fully_shard on every
    stream MLP, every (wrapped) block and the model: torch's own order in its FSDP2
    tests."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                       checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: isinstance(m, Block))
    for block in model.blocks:
        for inner in block.modules():
            if isinstance(inner, StreamMLP):
                fully_shard(inner, mesh=mesh)
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch_of(rank, size, step):
    """(lengths, modality per sequence). Step 1: only rank 0 has a sequence (5 image
    tokens), so whole bags receive nothing. Rank 1 (rank 0 alone in a world of one)
    has no image tokens in the other steps."""
    if step == 1:
        return ([5], [IMAGE]) if rank == 0 else ([], [])
    g = torch.Generator().manual_seed(100 * step + rank)
    count = int(torch.randint(2, 6, (1,), generator=g))
    lengths = torch.randint(1, 30, (count,), generator=g).tolist()
    text_only = rank == min(1, size - 1)
    kinds = [TEXT if text_only else int(k) for k in torch.randint(0, 2, (count,), generator=g)]
    return lengths, kinds


def _fsdp_step(ctx, model, balancer, lengths, kinds, step, d_model):
    """One step run unbalanced and balanced (a SideBySide): the output, the input
    gradient and this rank's shards of the parameters' gradients."""
    g = torch.Generator().manual_seed(7 * step + ctx.rank)
    x = torch.randn(sum(lengths), d_model, generator=g, dtype=torch.float64).to(ctx.device)
    x.requires_grad_(True)
    modality = torch.repeat_interleave(torch.tensor(kinds, dtype=torch.long),
                                       torch.tensor(lengths, dtype=torch.long)).to(ctx.device)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=ctx.device)

    def forward_backward(chosen):
        for block in model.modules():
            if isinstance(block, Block):
                block.balancer = chosen
        out = model(x, modality, seq_lens, chosen)
        (out ** 2).sum().backward()
        return [out.detach()]

    return run_both(forward_backward, balancer, inputs=[x], parameters=model.parameters())


def _fsdp2_cannot_run(ctx, fully_shard):
    """(mesh, None), or (None, why fully_shard does not run here): a plain Linear
    sharded and run forward and backward, agreed by every rank."""
    mesh, failure = None, None
    try:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(ctx.device.type, (ctx.size,))
        probe = torch.nn.Linear(4, 4).double().to(ctx.device)
        fully_shard(probe, mesh=mesh)
        probe(torch.ones(2, 4, dtype=torch.float64, device=ctx.device)).sum().backward()
    except Exception as error:  # noqa: BLE001  (torch's own error is the reason)
        failure = f"{type(error).__name__}: {one_line(error)}"
    failures = [(r, f) for r, f in enumerate(ctx.gather(failure)) if f]
    if not failures:
        return mesh, None
    rank, text = failures[0]
    where = f"rank {rank}: " if ctx.size > 1 else ""
    return None, (f"fully_shard does not run on {ctx.device.type} with torch "
                  f"{torch.__version__} (a plain Linear sharded and run, no balancer): "
                  f"{where}{text}")


def _check_fsdp2_checkpoint(ctx):
    fully_shard, missing = fully_shard_or_reason()
    if fully_shard is None:
        return result("fsdp2_checkpoint", "SKIP", missing)
    mesh, failure = _fsdp2_cannot_run(ctx, fully_shard)
    if failure is not None:
        return result("fsdp2_checkpoint", "SKIP", failure)
    topology = _topology(ctx)
    heads = _heads(topology)
    d_model = heads * HEAD_DIM
    torch.manual_seed(0)  # the same weights on every rank, as FSDP expects
    model = _sharded(Model(d_model, heads).double().to(ctx.device), fully_shard, mesh)
    balancer = knapformer.SequenceBalancer(topology)
    names = ["output", "input gradient"] + [
        f"gradient of {name.replace('_checkpoint_wrapped_module.', '')} (this rank's shard)"
        for name, _ in model.named_parameters()]
    problems, worst, moved = [], 0.0, 0
    for step in range(FSDP_STEPS):
        lengths, kinds = batch_of(ctx.rank, ctx.size, step)
        balancer.plan_routing(lengths, token_dim=d_model)
        moved += balancer.get_routing_plan_summary()["moved_tokens"]
        runs = _fsdp_step(ctx, model, balancer, lengths, kinds, step, d_model)
        worst = max(worst, runs.compare(names, problems, RTOL, ATOL, where=f"step {step}: "))
    # FSDP2's parameters are DTensors, sharded over the ranks.
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                for p in model.parameters())
    whole = sum(p.numel() for p in model.parameters())
    if ctx.size > 1 and local >= whole:
        problems.append(f"not sharded: this rank holds all {whole} parameter elements")
    figures = {"max_rel_diff": worst, "steps": FSDP_STEPS, "moved_tokens": moved,
               "shard_elements": local}
    return _row("fsdp2_checkpoint", worst, problems, figures,
                f"fully_shard (stream MLPs, blocks, model) + non-reentrant checkpointing "
                f"of every block, {topology} on {ctx.size} rank(s), {FSDP_STEPS} steps (one "
                f"where only rank 0 has tokens, a rank without image tokens): outputs, "
                f"input gradients and every rank's gradient shards equal the unbalanced "
                f"run's (max relative difference {worst:.2g})")


# -- compiled_block -----------------------------------------------------------------------

class CompiledBlock(torch.nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)

    def forward(self, h, seq_lens, balancer):
        d_model = h.shape[1]
        q, k, v = self.qkv(h).reshape(h.shape[0], 3, self.heads,
                                      d_model // self.heads).unbind(1)
        if balancer is not None:
            seq_lens, q, k, v = balancer.pre_attn(q, k, v)
        o = masked_attention(q, k, v, seq_lens)
        if balancer is not None:
            _, o = balancer.post_attn(o)
        return h + self.proj(o.reshape(h.shape[0], d_model))


def compile_lengths(rank, step):
    """4..7 sequences of 3..40 tokens, different on every rank and step: no row set of
    0 or 1 rows (torch specialises such sizes, which would add compiles)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    count = int(torch.randint(4, 8, (1,), generator=g))
    return torch.randint(3, 41, (count,), generator=g).tolist()


def _compiled_step(ctx, block, compiled, lengths, step, balancer, d_model):
    """The output, the input gradient and the parameters' gradient (one tensor, summed
    over the ranks) of one step, eager unbalanced and compiled balanced."""
    g = torch.Generator().manual_seed(7 * step + ctx.rank)
    x = torch.randn(sum(lengths), d_model, generator=g, dtype=torch.float64).to(ctx.device)
    x.requires_grad_(True)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=ctx.device)

    def forward_backward(chosen):
        if chosen is None:
            out = block(x, seq_lens, None)
        else:
            routed_lens, h, _ = chosen.route(x)
            h = compiled(block, h, routed_lens, chosen)
            if ctx.fault == "corrupt_compiled" and ctx.rank == 0 and h.numel() > 0:
                bump = torch.zeros_like(h)
                bump.view(-1)[0] = 1
                h = h + bump
            _, out, _ = chosen.reverse_route(h)
        (out ** 2).sum().backward()
        return [out.detach()]

    runs = run_both(forward_backward, balancer, inputs=[x], parameters=block.parameters())
    values = []
    for run in (runs.plain, runs.balanced):
        grads = torch.cat([grad.flatten() for grad in run.gradients[1:]])
        dist.all_reduce(grads)  # each rank holds a partial sum
        values.append(run.outputs + run.gradients[:1] + [grads])
    return values


def _check_compiled_block(ctx):
    missing = compile_missing()
    if missing is not None:
        return result("compiled_block", "SKIP", missing)
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    breaks_before = sum(counters["graph_break"].values())
    topology = _topology(ctx)
    heads = _heads(topology)
    d_model = heads * HEAD_DIM
    torch.manual_seed(0)
    block = CompiledBlock(d_model, heads).double().to(ctx.device)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(CompiledBlock.forward, backend=counter, fullgraph=True,
                             dynamic=None)
    balancer = knapformer.SequenceBalancer(topology)
    problems, worst, compiles = [], 0.0, []
    names = ("output", "input gradient", "the parameters' gradient (summed over the ranks)")
    for step in range(COMPILE_STEPS):
        lengths = compile_lengths(ctx.rank, step)
        balancer.plan_routing(lengths, token_dim=d_model)
        plain, balanced = _compiled_step(ctx, block, compiled, lengths, step, balancer, d_model)
        worst = max(worst, compare(balanced, plain, names, problems, RTOL, ATOL,
                                   where=f"step {step}: "))
        compiles.append(counter.frame_count)
    breaks = sum(counters["graph_break"].values()) - breaks_before
    if breaks:
        problems.append(f"{breaks} graph break(s) (fullgraph=True)")
    late = [s for s in range(SETTLED_AFTER + 1, COMPILE_STEPS) if compiles[s] > compiles[s - 1]]
    if late:
        problems.append(f"compiled again at step(s) {', '.join(map(str, late))} (compiles "
                        f"after each step: {compiles}; none may come after step "
                        f"{SETTLED_AFTER})")
    figures = {"compiles": compiles[-1], "graph_breaks": breaks, "max_rel_diff": worst,
               "steps": COMPILE_STEPS}
    return _row("compiled_block", worst, problems, figures,
                f"torch.compile(fullgraph=True, backend aot_eager) of a block with pre_attn "
                f"and post_attn, {topology} on {ctx.size} rank(s), {COMPILE_STEPS} steps of "
                f"changing lengths: compiled {compiles[-1]} time(s) (after each step: "
                f"{compiles}), none after step {SETTLED_AFTER}, no graph break; outputs "
                f"and gradients equal the unbalanced eager block's (max relative "
                f"difference {worst:.2g})")


# {check: check(ctx) -> its result}: the harness runs them in CHECKS's order.
WORLD_CHECKS = {"fsdp2_checkpoint": _check_fsdp2_checkpoint,
                "compiled_block": _check_compiled_block}
