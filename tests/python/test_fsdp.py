"""The paper's training setup around the balancer on Gloo processes: a model
sharded with FSDP, activation checkpointing on every block (non-reentrant
and reentrant), route/reverse_route around the stack and pre_attn/post_attn
inside every block. Every step is run twice on the same weights, unbalanced
and balanced, and must agree in float64 (outputs, input gradients and every
rank's shard of the parameter gradients) to 1e-10, on 4 and 8 processes,
including a step where whole bags receive no tokens and a rank whose data
has no tokens of one modality (where the reference needed a dummy op to
keep FSDP from hanging).

The same model under DistributedDataParallel (replicated, gradients
averaged by DDP's all-reduce) must agree too, and its averaged gradients be
the same on every rank.

FSDP2 (fully_shard) is tried first; on a torch where it cannot run on CPU
(2.6: its streams have no record_event) those cases skip with torch's own
error, and the GPU check runs them (knapformer.gpu_check). FSDP1
(FullyShardedDataParallel) runs the same cases on CPU.
"""
import functools

import pytest
import torch

# The GPU check's fsdp2_checkpoint runs these same models and batches.
from knapformer.gpu_check.fsdp_checks import Block, Model, StreamMLP, batch_of, \
    fully_shard_or_reason
from knapformer.launch import run_world
from timing import timed

D_MODEL, HEADS = 16, 4
TOL = 1e-10
CHECKPOINTS = ("none", "non_reentrant", "reentrant")


def fsdp1_missing():
    """None when this torch's FullyShardedDataParallel (with the wrap policy
    and checkpoint wrapper used here) imports, else why not. (torch 1.13's
    does not import on Python 3.11: a dataclass default 3.11 refuses.)"""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: F401
        from torch.distributed.algorithms._checkpoint import checkpoint_wrapper  # noqa: F401
    except Exception as error:  # noqa: BLE001  (any import failure is the reason)
        return f"{type(error).__name__}: {error}"
    return None


def fully_shard_function():
    return fully_shard_or_reason()[0]


def blocks_of(model):
    return [m for m in model.modules() if isinstance(m, Block)]


def sharded(model, wrap, checkpoint):
    """``model`` sharded by ``wrap`` ("fsdp1" or "fsdp2": every stream MLP
    and every block a unit of its own) or replicated ("ddp"), with
    ``checkpoint`` on every block."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    if checkpoint != "none":
        impl = CheckpointImpl.REENTRANT if checkpoint == "reentrant" else \
            CheckpointImpl.NO_REENTRANT
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                           checkpoint_impl=impl),
            check_fn=lambda m: isinstance(m, Block))
    if wrap == "fsdp2":  # after the checkpoint wrappers, as torch's own FSDP2 tests do
        fully_shard = fully_shard_function()
        for block in blocks_of(model):
            for stream in block.streams:
                fully_shard(stream)
        for wrapped in model.blocks:
            fully_shard(wrapped)
        fully_shard(model)
    if wrap == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({Block,
                                                                                   StreamMLP}),
                                         device_id=torch.device("cpu"), use_orig_params=True)
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model


def run_step(model, balancer, lengths, kinds, step, rank):
    g = torch.Generator().manual_seed(7 * step + rank)
    x = torch.randn(sum(lengths), D_MODEL, generator=g, dtype=torch.float64,
                    requires_grad=True)
    modality = torch.repeat_interleave(torch.tensor(kinds, dtype=torch.long),
                                       torch.tensor(lengths, dtype=torch.long))
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    for block in blocks_of(model):
        block.balancer = balancer
    model.zero_grad(set_to_none=True)
    out = model(x, modality, seq_lens, balancer)
    (out ** 2).sum().backward()
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    return out.detach(), x.grad, grads


def largest_difference(plain, balanced):
    out, x_grad, grads = plain
    out_b, x_grad_b, grads_b = balanced
    worst = 0.0
    pairs = [(out, out_b), (x_grad, x_grad_b)] + list(zip(grads, grads_b))
    for a, b in pairs:
        if (a is None) != (b is None):
            return float("inf")  # a gradient on one run only
        if a is not None and a.numel():
            worst = max(worst, (a - b).abs().max().item())
    return worst


def fsdp_world(rank, size, wrap, checkpoint):
    import knapformer

    torch.manual_seed(0)
    model = sharded(Model(D_MODEL, HEADS).double(), wrap, checkpoint)
    topology = "g1n2+g2n1" if size == 4 else "g1n2+g2n1+g4n1"
    balancer = knapformer.SequenceBalancer(topology)
    worst, moved = [], []
    for step in range(3):
        lengths, kinds = batch_of(rank, size, step)
        plain = run_step(model, None, lengths, kinds, step, rank)
        balancer.plan_routing(lengths, token_dim=D_MODEL)
        moved.append(balancer.get_routing_plan_summary()["moved_tokens"])
        balanced = run_step(model, balancer, lengths, kinds, step, rank)
        worst.append(largest_difference(plain, balanced))
    shards = sum(p.numel() for p in model.parameters())
    # The last balanced step's gradients, in parameter order (as floats: a
    # tensor would cross to the parent through a file descriptor of this
    # process, which may have exited by then).
    last = [g.flatten() for g in balanced[2] if g is not None]
    return {"worst": worst, "shard_elements": shards, "moved_tokens": moved,
            "gradients": torch.cat(last).tolist() if last else []}


def fsdp2_on_cpu_failure():
    """None when fully_shard runs a step on CPU with Gloo here, else why not
    (torch's error), from one 2-process world."""
    if fully_shard_function() is None:
        return f"torch {torch.__version__} has no fully_shard"
    results = run_world(_fsdp2_probe, 2, timeout=120, allow_errors=True)
    kind, value = results[0]
    return None if kind == "ok" else value.strip().splitlines()[-1]


def _fsdp2_probe(rank, size):
    model = torch.nn.Linear(4, 4).double()
    fully_shard_function()(model)
    model(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
    return True


@functools.lru_cache(maxsize=None)
def fsdp2_failure():
    return fsdp2_on_cpu_failure()


def check(results, size):
    # Tokens did move (else balanced equals unbalanced trivially), and at
    # the sparse step they all went to at most two of the bags.
    assert results[0]["moved_tokens"][0] > 0 and results[0]["moved_tokens"][2] > 0, \
        results[0]["moved_tokens"]
    for rank, r in enumerate(results):
        assert all(w < TOL for w in r["worst"]), f"rank {rank}: differences {r['worst']}"
    # Sharded: every rank holds a part of the parameters, not all of them.
    total = sum(r["shard_elements"] for r in results)
    assert all(r["shard_elements"] < total for r in results), \
        [r["shard_elements"] for r in results]


@pytest.mark.skipif(fsdp1_missing() is not None,
                    reason=f"torch {torch.__version__}'s FSDP does not import ({fsdp1_missing()})")
@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_fsdp1_with_activation_checkpointing_matches_unbalanced(checkpoint, size):
    check(run_world(fsdp_world, size, "fsdp1", checkpoint, timeout=600), size)


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_fsdp2_with_activation_checkpointing_matches_unbalanced(checkpoint, size):
    failure = fsdp2_failure()
    if failure is not None:
        pytest.skip(f"fully_shard does not run on CPU with torch {torch.__version__} ({failure});"
                    " the GPU check runs this case")
    check(run_world(fsdp_world, size, "fsdp2", checkpoint, timeout=600), size)


@pytest.mark.parametrize("checkpoint", ("none", "non_reentrant"))
def test_ddp_matches_unbalanced_and_its_gradients_agree_across_ranks(checkpoint):
    if checkpoint != "none" and fsdp1_missing() is not None:
        pytest.skip(f"torch {torch.__version__}'s checkpoint wrapper does not import "
                    f"({fsdp1_missing()})")
    results = run_world(fsdp_world, 4, "ddp", checkpoint, timeout=600)
    assert results[0]["moved_tokens"][0] > 0, results[0]["moved_tokens"]
    for rank, r in enumerate(results):
        assert all(w < TOL for w in r["worst"]), f"rank {rank}: differences {r['worst']}"
        # Replicated, and DDP averaged each step's gradients over the ranks.
        assert r["shard_elements"] == results[0]["shard_elements"]
        assert len(r["gradients"]) == len(results[0]["gradients"]) > 0
        assert max(abs(a - b) for a, b in zip(r["gradients"], results[0]["gradients"])) < TOL, \
            rank


def recompute_mistake_world(rank, size):
    """A checkpointed block whose recomputation on rank 1 passes one row too
    few to pre_attn: the backward raises on every rank of its bag (here all
    four), at once."""
    import knapformer
    from torch.utils.checkpoint import checkpoint

    balancer = knapformer.SequenceBalancer("g4n1")
    balancer.plan_routing([4 + rank, 7], token_dim=8)
    x = torch.randn(11 + rank, 8, dtype=torch.float64, requires_grad=True)
    _, routed, _ = balancer.route(x)
    recomputing = [False]

    def block(h):
        if recomputing[0] and rank == 1:
            h = h[:-1]
        recomputing[0] = True  # the next call is the recomputation
        _, q, k, v = balancer.pre_attn(*(h.reshape(-1, 4, 2),) * 3)
        _, o = balancer.post_attn(q * k + v)
        return o.reshape(-1, 8)

    out = checkpoint(block, routed, use_reentrant=False)
    _, back, _ = balancer.reverse_route(out)
    return timed(lambda: back.sum().backward())


def test_a_mistake_in_a_recomputed_exchange_raises_on_every_rank_not_a_hang():
    results = run_world(recompute_mistake_world, 4, timeout=120)
    for rank, (kind, error, took) in enumerate(results):
        assert kind is not None and "rank 1: pre_attn" in error, (rank, error)
        assert took < 5.0, (rank, took)


def plan_before_backward_world(rank, size):
    """plan_routing of the next step between a checkpointed forward and its
    backward: the recomputed exchanges would follow the new plan, so they
    refuse, on every rank."""
    import knapformer
    from torch.utils.checkpoint import checkpoint

    balancer = knapformer.SequenceBalancer("g2n2")
    balancer.plan_routing([4 + rank, 7], token_dim=8)
    x = torch.randn(11 + rank, 8, dtype=torch.float64, requires_grad=True)
    _, routed, _ = balancer.route(x)

    def block(h):
        _, q, k, v = balancer.pre_attn(*(h.reshape(-1, 4, 2),) * 3)
        return balancer.post_attn(q * k + v)[1].reshape(-1, 8)

    out = checkpoint(block, routed, use_reentrant=False)
    _, back, _ = balancer.reverse_route(out)
    balancer.plan_routing([3, 3 + rank], token_dim=8)  # too early
    return timed(lambda: back.sum().backward())


@pytest.mark.skipif(not hasattr(torch._C, "_current_graph_task_id"),
                    reason=f"torch {torch.__version__} cannot tell a recomputation from a "
                           "forward (no torch._C._current_graph_task_id)")
def test_a_recomputation_after_the_next_plan_routing_refuses_on_every_rank():
    for rank, (kind, error, took) in enumerate(run_world(plan_before_backward_world, 4,
                                                         timeout=120)):
        assert kind is not None and "recomputed in a backward pass" in error and \
            "its forward ran under the plan before" in error, (rank, error)
        assert took < 5.0, (rank, took)
