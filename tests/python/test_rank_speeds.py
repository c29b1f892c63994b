"""Balancing time on GPUs of unequal speeds (docs/planner.md#speeds): a
rank that really computes slower is learned from record_compute_seconds
and given less work, planned locally and by a planner service in group mode;
declared speeds plan by time on every rank alike; a bad rank_speeds is a
clear error."""
import time

import pytest
import torch
import torch.distributed as dist

from knapformer.launch import run_world

D_MODEL = 64


def compute(x, weight, repeats):
    """The rank's compute on its routed tokens: `repeats` matmuls per token
    row, timed in this thread's CPU seconds (four processes share two cores)."""
    start = time.thread_time()
    y = x
    for _ in range(repeats):
        y = torch.tanh(y @ weight)
    return y, time.thread_time() - start


def learned_world(rank, size, steps, slow_rank, served=False):
    import knapformer

    server, address = None, None
    if served:  # an embedded planner on rank 0, its address on every rank
        server = knapformer.PlannerServer("127.0.0.1:0") if rank == 0 else None
        shared = [server.address if server else None]
        dist.broadcast_object_list(shared, src=0)
        address = shared[0]
    # gamma 0: the cost model prices what compute() does, work per token
    # (its matmuls have no attention), so the rates differ by speed alone.
    balancer = knapformer.SequenceBalancer("g1n4", gamma=0.0, d_model=D_MODEL,
                                           rank_speeds="learned", planner_address=address,
                                           require_planner=served, job_id="speeds")
    torch.manual_seed(rank)
    weight = torch.randn(D_MODEL, D_MODEL) / D_MODEL ** 0.5
    # 24 sequences per rank, 48..94 tokens: any share can be balanced.
    lengths = [48 + 2 * ((rank * 7 + i * 5) % 24) for i in range(24)]
    # The slow rank does every matmul three times: it really computes at a
    # third of the others' speed (a signal well above the timing noise of
    # four processes on two shared cores).
    repeats = 90 if rank == slow_rank else 30
    rows = []
    for _ in range(steps):
        x = torch.randn(sum(lengths), D_MODEL)
        balancer.plan_routing(lengths)
        _, routed, _ = balancer.route(x)
        y, seconds = compute(routed, weight, repeats)
        _, back, _ = balancer.reverse_route(y)
        assert back.shape == x.shape
        balancer.record_compute_seconds(seconds)
        summary = balancer.get_routing_plan_summary()
        assert summary["source"] == ("planner service" if served else "local planner")
        rows.append((summary["rank_speeds"], routed.shape[0], summary["max_over_mean_after"]))
    dist.barrier()
    if server:
        server.shutdown(grace=1)
    return rows


@pytest.mark.parametrize("served", [False, True], ids=["local", "served"])
def test_a_rank_that_really_computes_slower_gets_less_work(served):
    # Served: rank 0's request carries the speeds the ranks learned
    # (PlanGroupRequest.rank_speeds), and the service plans by them.
    results = run_world(learned_world, 4, 10, 2, served)
    # Every rank plans with the same speeds, every step.
    for step in range(10):
        assert len({tuple(r[step][0]) for r in results}) == 1, results
    first_speeds, _, _ = results[0][0]
    assert first_speeds == [1.0] * 4  # nothing timed yet
    speeds, _, _ = results[0][-1]
    others = [s for r, s in enumerate(speeds) if r != 2]
    # A third of the others' speed, below every other rank by far. (How
    # alike the others are is the timing noise of processes sharing cores
    # with the rest of the test suite; speed_learner_test checks the
    # learner's steadiness under jitter.)
    assert speeds[2] < 0.7 * min(others), speeds
    # The slow rank computes on fewer tokens than each healthy one.
    tokens = [r[-1][1] for r in results]
    assert tokens[2] < 0.7 * min(t for r, t in enumerate(tokens) if r != 2), tokens


def declared_world(rank, size, speeds):
    import knapformer

    balancer = knapformer.SequenceBalancer("g1n4", gamma=1.0, d_model=D_MODEL,
                                           rank_speeds=speeds)
    balancer.plan_routing([64] * 32)
    summary = balancer.get_routing_plan_summary()
    return summary["rank_speeds"], summary["workload_after"], summary["max_over_mean_after"]


def test_declared_speeds_plan_by_time_on_every_rank():
    results = run_world(declared_world, 4, [2, 2, 1, 2])
    speeds, workload, max_over_mean = results[0]
    assert all(r == results[0] for r in results), results
    assert speeds == pytest.approx([8 / 7, 8 / 7, 4 / 7, 8 / 7])
    # Rank 2 holds half a healthy rank's work (128 equal sequences: 18 and 9).
    assert workload[2] == pytest.approx(workload[0] / 2, rel=0.12), workload
    assert max_over_mean < 1.06, max_over_mean


def refused_world(rank, size, kwargs):
    import knapformer

    try:
        knapformer.SequenceBalancer("g1n4", gamma=1.0, d_model=D_MODEL, **kwargs)
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


@pytest.mark.parametrize("kwargs,message", [
    ({"rank_speeds": "fast"}, "ValueError: rank_speeds: 'fast' is not 'learned'"),
    ({"rank_speeds": [1, "x", 1, 1]}, "ValueError: rank_speeds: needs 'learned' or a list"),
    ({"rank_speeds": [1, 1]}, "rank_speeds: 2 speeds for a world of 4 ranks"),
    ({"rank_speeds": [1, 1, 0, 1]}, "rank_speeds[2] is 0: a speed must be finite and > 0"),
    ({"rank_speeds": "learned", "planner_address": "127.0.0.1:1", "planner_mode": "per-rank"},
     "rank_speeds: needs group mode (the default)"),
])
def test_bad_rank_speeds_are_every_ranks_clear_error(kwargs, message):
    for error in run_world(refused_world, 4, kwargs):
        assert error is not None and message in error, error
