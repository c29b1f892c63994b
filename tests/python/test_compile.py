"""torch.compile around the balancer on 4 Gloo processes: the exchanges are
torch custom ops (knapformer/_compile.py), so a compiled block with
pre_attn -> attention -> post_attn, or a whole compiled forward with route
and reverse_route, traces as one graph (fullgraph=True: any graph break is
an error), its backward runs each exchange's backward (the exchange_backward
op: the eager autograd node's own, SequenceBalancer::BackwardOf), and 20 steps of changing
lengths compile a fixed number of times. Everything is float64 and checked
against the unbalanced computation (1e-10)."""
import pytest
import torch

# The GPU check's compiled_block runs this same block and lengths.
from knapformer.gpu_check.fsdp_checks import CompiledBlock, compile_lengths
from knapformer.launch import run_world

pytestmark = pytest.mark.skipif(
    not (hasattr(torch, "library") and hasattr(torch.library, "custom_op")),
    reason=f"torch {torch.__version__} has no torch.library.custom_op (2.4+): the exchanges "
           "cannot be custom ops there, and torch.compile would break the graph at each")

D_MODEL, HEADS, STEPS = 16, 4, 20
SPARSE_STEP = 10  # where a sparse run has one sequence in all
TOL = 1e-10


def lengths_of(rank, step, sparse=False):
    """The GPU check's lengths (4..7 sequences of 3..40 tokens, so that no
    row set has 0 or 1 rows or lengths, which torch specialises); ``sparse``:
    rank 0 has one sequence of 5 tokens, the others none, so that whole bags
    receive no tokens."""
    if sparse:
        return [5] if rank == 0 else []
    return compile_lengths(rank, step)


def whole_forward(blocks, x, positions, seq_lens, balancer):
    """route -> blocks -> reverse_route, positions travelling as a feature."""
    if balancer is not None:
        seq_lens, x, (positions,) = balancer.route(x, [positions])
    h = x + positions[:, None].to(x.dtype) / 100.0
    for block in blocks:
        h = block(h, seq_lens, balancer)
    if balancer is not None:
        _, h, _ = balancer.reverse_route(h)
    return h


def one_step(blocks, forward, lengths, step, rank, balancer):
    """Output, input gradient and all-reduced parameter gradients of one step."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(7 * step + rank)
    x = torch.randn(sum(lengths), D_MODEL, generator=g, dtype=torch.float64)
    x.requires_grad_(True)
    positions = torch.cat([torch.arange(n) for n in lengths]) if lengths else \
        torch.zeros(0, dtype=torch.long)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    blocks.zero_grad(set_to_none=False)
    out = forward(blocks, x, positions, seq_lens, balancer)
    (out ** 2).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in blocks.parameters()])
    dist.all_reduce(grads)
    return out.detach(), x.grad, grads


def worst(a, b):
    return max(((x - y).abs().max().item() if x.numel() else 0.0) for x, y in zip(a, b))


def compiled_world(rank, size, what, dynamic, sparse):
    """Every step twice, unbalanced eager and balanced compiled; the largest
    difference and how dynamo fared."""
    import knapformer
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    balancer = knapformer.SequenceBalancer("g1n2+g2n1")
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(CompiledBlock(D_MODEL, HEADS) for _ in range(2)).double()
    counter = CompileCounterWithBackend("aot_eager")
    if what == "block":  # the usual: each block compiled, routes eager
        compiled_block = torch.compile(CompiledBlock.forward, backend=counter, fullgraph=True,
                                       dynamic=dynamic)

        def forward(blocks, x, positions, seq_lens, balancer):
            if balancer is None:
                return whole_forward(blocks, x, positions, seq_lens, None)
            seq_lens, x, (positions,) = balancer.route(x, [positions])
            h = x + positions[:, None].to(x.dtype) / 100.0
            for block in blocks:
                h = compiled_block(block, h, seq_lens, balancer)
            return balancer.reverse_route(h)[1]
    else:  # the whole forward, routes included
        compiled_whole = torch.compile(whole_forward, backend=counter, fullgraph=True,
                                       dynamic=dynamic)

        def forward(blocks, x, positions, seq_lens, balancer):
            if balancer is None:
                return whole_forward(blocks, x, positions, seq_lens, None)
            return compiled_whole(blocks, x, positions, seq_lens, balancer)

    differences, compiles = [], []
    for step in range(STEPS):
        lengths = lengths_of(rank, step, sparse and step == SPARSE_STEP)
        plain = one_step(blocks, forward, lengths, step, rank, None)
        balancer.plan_routing(lengths, token_dim=D_MODEL)
        balanced = one_step(blocks, forward, lengths, step, rank, balancer)
        differences.append(worst(plain, balanced))
        compiles.append(counter.frame_count)
    return {"worst": max(differences), "compiles": compiles,
            "graph_breaks": sum(counters["graph_break"].values())}


def check(results, most, settled_from):
    """Exact, no graph break, at most ``most`` compiles, none from step
    ``settled_from`` on."""
    print(f"compiles per rank over {STEPS} steps: {[r['compiles'][-1] for r in results]}; "
          f"largest difference from unbalanced {max(r['worst'] for r in results):.1e}")
    for rank, r in enumerate(results):
        assert r["worst"] < TOL, f"rank {rank}: compiled differs from unbalanced by {r['worst']}"
        assert r["graph_breaks"] == 0, f"rank {rank}: {r['graph_breaks']} graph breaks"
        compiles = r["compiles"]
        assert 1 <= compiles[-1] <= most, f"rank {rank}: compiled {compiles[-1]} times"
        assert compiles[settled_from - 1] == compiles[-1], \
            f"rank {rank}: compiles per step {compiles}, some after step {settled_from - 1}"


def test_a_compiled_block_over_20_steps_compiles_at_most_3_times_all_in_the_first_steps():
    """dynamic=None (torch's default): the first step compiles with static
    shapes, the second, seeing other sizes, once more with dynamic ones;
    one more where two sizes happened to be equal when traced (torch's duck
    sizing assumes they always are). No step after the fourth compiles."""
    check(run_world(compiled_world, 4, "block", None, False, timeout=600), 3, 4)


def test_with_dynamic_shapes_from_the_start_it_compiles_at_most_twice():
    check(run_world(compiled_world, 4, "block", True, False, timeout=600), 2, 3)


def test_a_compiled_forward_with_the_routes_inside_is_exact():
    check(run_world(compiled_world, 4, "whole", True, False, timeout=600), 2, 3)


def test_a_step_where_whole_bags_receive_no_tokens_is_exact_and_compiles_only_then():
    """At step 10 only rank 0 has a sequence (5 tokens): most ranks route,
    attend and return nothing. Torch specialises sizes of 0, so a rank may
    compile once more at that step (locally), and none after it."""
    results = run_world(compiled_world, 4, "whole", True, True, timeout=600)
    check(results, 3, SPARSE_STEP + 2)
    for rank, r in enumerate(results):
        compiles = r["compiles"]
        assert compiles[SPARSE_STEP] - compiles[SPARSE_STEP - 1] <= 1, (rank, compiles)
