"""Agreed errors through the Python package on 4 Gloo processes: one rank's
bad length or bad tensor, at every entry point, raises on every rank of the
call's group within 5 s with that rank's reason, and the next call is exact;
a peer that exits mid-step raises on every survivor within the group's
timeout, and every later call fails at once."""

import torch

from knapformer.launch import run_world
from timing import timed

BOUND_S = 5.0  # an agreed error is two tiny collectives; a hang is Gloo's 60 s


def lens_of(rank):
    return [3 + rank, 9, 2 * rank + 1]


def one_rank_errs_world(rank, size, metadata_on_gloo):
    import knapformer

    balancer = knapformer.SequenceBalancer("g2n2", _metadata_on_gloo=metadata_on_gloo)
    rows = sum(lens_of(rank))
    results = {}
    for culprit in range(size):
        me = rank == culprit
        out = results.setdefault(culprit, {})
        out["plan"] = timed(lambda: balancer.plan_routing(
            [-5] if me else lens_of(rank), token_dim=8))
        balancer.plan_routing(lens_of(rank), token_dim=8)
        x = torch.randn(rows, 8)
        out["route_rows"] = timed(lambda: balancer.route(x[:-1] if me else x))
        out["route_feature"] = timed(lambda: balancer.route(x, ["ids"] if me else [x[:, 0]]))
        out["route_dtype"] = timed(lambda: balancer.route(x.double() if me else x))
        _, routed, _ = balancer.route(x)
        q = routed.reshape(-1, 4, 2)
        out["pre_attn"] = timed(lambda: balancer.pre_attn(q[:-1] if me else q, q, q))
        # Again, right: the culprit's bag retries, the other bag (which went
        # through) simply exchanges once more.
        _, q2, _, _ = balancer.pre_attn(q, q, q)
        out["post_attn"] = timed(lambda: balancer.post_attn(q2.sum(0) if me else q2))
        _, o = balancer.post_attn(q2)
        assert torch.equal(o.reshape(-1, 8), routed), "pre/post round trip"
        out["reverse"] = timed(lambda: balancer.reverse_route(torch.zeros(1, 8) if me else routed))
        _, back, _ = balancer.reverse_route(routed)
        out["exact_after"] = bool(torch.equal(back, x))
    return results


EXPECTED = {  # entry point: (error type, text every rank of the group sees)
    "plan": ("ValueError", "ranks[{c}][0]: sequence length -5"),
    "route_rows": ("ValueError", "rank {c}: route: "),
    "route_feature": ("ValueError", "rank {c}: route: packed_features[0] must be a tensor"),
    "route_dtype": ("ValueError", "route at step {s}: the tensor's dtype is "),
    "pre_attn": ("ValueError", "rank {c}: pre_attn: "),
    "post_attn": ("ValueError", "rank {c}: post_attn: "),
    "reverse": ("ValueError", "rank {c}: reverse_route: "),
}


def check_agreed(results, size):
    for rank, by_culprit in enumerate(results):
        for culprit, out in by_culprit.items():
            for call, (kind, text) in EXPECTED.items():
                got_kind, got_text, took = out[call]
                in_group = call not in ("pre_attn", "post_attn") or rank // 2 == culprit // 2
                where = f"rank {rank}, culprit {culprit}, {call}"
                if not in_group:
                    assert got_kind is None, f"{where}: the other bag raised {got_text}"
                    continue
                want = text.format(c=culprit, s=2 * culprit + 1)  # a failed plan is a step
                assert got_kind == kind and want in got_text, f"{where}: {got_kind} {got_text}"
                assert took < BOUND_S, f"{where}: took {took:.1f} s"
            assert out["exact_after"], f"rank {rank}, culprit {culprit}: round trip not exact"


def test_one_ranks_mistake_raises_on_every_rank_and_the_next_call_is_exact():
    check_agreed(run_world(one_rank_errs_world, 4, False, timeout=240), 4)


def test_the_same_over_gloo_twins_of_the_groups():
    """The host-group wiring an NCCL group uses (Gloo twins of the world and
    bag groups for the small collectives), exercised here over Gloo."""
    check_agreed(run_world(one_rank_errs_world, 4, True, timeout=240), 4)


def dead_peer_world(rank, size):
    import os
    import knapformer

    balancer = knapformer.SequenceBalancer("g1n4")
    balancer.plan_routing(lens_of(rank), token_dim=8)
    x = torch.randn(sum(lens_of(rank)), 8)
    _, routed, _ = balancer.route(x)
    if rank == 3:
        os._exit(0)  # mid-step, as a crashed trainer does
    first = timed(lambda: balancer.reverse_route(routed))
    later = timed(lambda: balancer.plan_routing(lens_of(rank), token_dim=8))
    return first, later


def test_a_peer_that_exits_mid_step_raises_on_every_survivor():
    group_timeout = 30
    results = run_world(dead_peer_world, 4, timeout=120, group_timeout=group_timeout,
                        allow_errors=True)
    assert results[3] == ("exited", 0), results[3]
    for rank in range(3):
        kind, value = results[rank]
        assert kind == "ok", f"rank {rank}: {value}"
        (first_kind, first_text, first_took), (later_kind, later_text, later_took) = value
        assert first_kind == "RuntimeError", (rank, first_text)
        assert "UNAVAILABLE" in first_text or "DEADLINE_EXCEEDED" in first_text, first_text
        assert first_took < group_timeout + 5, (rank, first_took)
        assert later_kind == "RuntimeError" and "unusable after an earlier failure" in later_text, \
            (rank, later_text)
        assert later_took < 1.0, (rank, later_took)


def checkpoint_world(rank, size):
    """Activation checkpointing recomputes pre_attn/post_attn during the
    backward pass: those recomputed exchanges must not be chained into the
    pass that is running, and the gradients equal the plain ones."""
    import knapformer
    from torch.utils.checkpoint import checkpoint

    balancer = knapformer.SequenceBalancer("g2n2")
    balancer.plan_routing(lens_of(rank), token_dim=8)
    torch.manual_seed(rank)
    x = torch.randn(sum(lens_of(rank)), 8, dtype=torch.float64)

    def block(h):
        _, q, k, v = balancer.pre_attn(h.reshape(-1, 4, 2), (h * 2).reshape(-1, 4, 2),
                                       (h * 3).reshape(-1, 4, 2))
        _, o = balancer.post_attn(q * k + v)
        return o.reshape(-1, 8)

    grads = []
    for use_checkpoint in (False, True):
        leaf = x.clone().requires_grad_(True)
        _, routed, _ = balancer.route(leaf)
        out = checkpoint(block, routed, use_reentrant=True) if use_checkpoint else block(routed)
        _, back, _ = balancer.reverse_route(out)
        (back ** 2).sum().backward()
        grads.append(leaf.grad)
    return bool(torch.equal(grads[0], grads[1]))


def test_backward_exchanges_under_activation_checkpointing():
    assert run_world(checkpoint_world, 4, timeout=120) == [True] * 4
