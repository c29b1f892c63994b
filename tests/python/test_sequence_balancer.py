"""knapformer.SequenceBalancer on real Gloo process groups (4 and 8 spawned
processes on 127.0.0.1): exact round trips, attention and gradients equal to
unbalanced attention, the planner service hosted in rank 0 and the local
fallback, the summary, and every misuse raising on every rank (one rank's
mistakes and dead peers: test_agreed_errors.py)."""
import math
import os

import pytest
import torch
import torch.distributed as dist

from knapformer.launch import run_world

D_MODEL = 8
HEADS = 8  # a multiple of every bag size below
HEAD_DIM = 2


def lengths_at(rank, size, step):
    """Ordinary (step 0), awkward (1: a rank with nothing, zero-length
    sequences, a sequence shorter than a bag) and sparse (2: two sequences for
    the whole world) lengths."""
    g = torch.Generator().manual_seed(rank * 1000 + step)
    kind = step % 3
    if kind == 0:
        lens = [int(v) for v in torch.randint(1, 48, (int(torch.randint(1, 5, (1,), generator=g)),),
                                              generator=g)]
        return lens + [150] if rank == 0 else lens
    if kind == 1:
        if rank == 1:
            return []
        lens = [0, int(torch.randint(1, 30, (1,), generator=g)), 0]
        return lens + [3] if rank == size - 1 else lens
    return [5, 77] if rank == 0 else []


def token_ids(rank, lens):
    return torch.tensor([(rank << 40) | (s << 20) | t for s, n in enumerate(lens) for t in range(n)],
                        dtype=torch.int64)


def all_lengths(lens):
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, lens)
    return gathered


def varlen_attention(q, k, v, seq_lens):
    """Plain attention of each sequence on its own: [tokens, heads, dim]."""
    outs, start = [], 0
    for n in seq_lens:
        n = int(n)
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        weights = torch.softmax(qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1]), dim=-1)
        outs.append((weights @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs) if outs else q[:0] * 0  # no sequences: still in the graph


def attention_layer(balancer, lens, seed):
    """One attention layer over this rank's tokens; balancer None = each rank
    on its own sequences. Returns the output and the gradients."""
    torch.manual_seed(seed)  # the same weights on every rank
    w_qkv = torch.randn(D_MODEL, 3 * HEADS * HEAD_DIM, dtype=torch.float64, requires_grad=True)
    w_out = torch.randn(HEADS * HEAD_DIM, D_MODEL, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(seed * 100 + dist.get_rank() + 1)  # this rank's tokens
    x = torch.randn(sum(lens), D_MODEL, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(sum(lens), D_MODEL, dtype=torch.float64)
    h, seq_lens = x, lens
    if balancer is not None:
        _, h, _ = balancer.route(x)
    q, k, v = (h @ w_qkv).reshape(-1, 3, HEADS, HEAD_DIM).unbind(1)
    if balancer is not None:
        seq_lens, q, k, v = balancer.pre_attn(q, k, v)
        assert seq_lens.dtype == torch.int32
    o = varlen_attention(q, k, v, seq_lens)
    if balancer is not None:
        _, o = balancer.post_attn(o)
    out = o.reshape(-1, HEADS * HEAD_DIM) @ w_out
    if balancer is not None:
        _, out, _ = balancer.reverse_route(out)
    (out * upstream).sum().backward()
    grads = [w_qkv.grad.clone(), w_out.grad.clone()]
    for grad in grads:  # weight gradients are partial sums per rank
        dist.all_reduce(grad)
    return out.detach(), x.grad, grads


def check_step(balancer, rank, size, step, topology, gamma, cost=None):
    lens = lengths_at(rank, size, step)
    balancer.plan_routing(lens, token_dim=D_MODEL)
    rows = sum(lens)

    # The routed rows are exactly the tokens the planner core assigns here.
    expected = __import__("knapformer").plan(all_lengths(lens), topology, d_model=D_MODEL,
                                             gamma=gamma, **(cost or {}))
    mine = [c for c in expected["chunks"] if c["dst_rank"] == rank]
    want_ids = torch.tensor([(c["src_rank"] << 40) | (c["seq_index"] << 20) | (c["offset"] + t)
                             for c in mine for t in range(c["length"])], dtype=torch.int64)

    ids = token_ids(rank, lens)
    hidden = torch.randn(rows, D_MODEL, requires_grad=True)
    half = torch.randn(rows, 4).to(torch.bfloat16)
    flags = torch.arange(rows) % 3 == 0
    chunk_lens, routed, features = balancer.route(hidden, [ids, half, flags])
    assert chunk_lens.dtype == torch.int32 and chunk_lens.device == hidden.device
    assert chunk_lens.tolist() == [c["length"] for c in mine]
    assert torch.equal(features[0], want_ids), f"step {step}: routed token ids"
    assert [f.dtype for f in features] == [torch.int64, torch.bfloat16, torch.bool]
    assert routed.requires_grad and not features[1].requires_grad
    seq_lens, back, back_features = balancer.reverse_route(routed, features)
    assert seq_lens.tolist() == lens and seq_lens.dtype == torch.int32
    assert torch.equal(back.detach(), hidden.detach())
    assert torch.equal(back_features[0], ids)
    assert torch.equal(back_features[1], half)
    assert torch.equal(back_features[2], flags)
    weight = torch.randn(rows, D_MODEL)
    (back * weight).sum().backward()
    assert torch.equal(hidden.grad, weight), "gradients come back exactly"

    # Several tensors that all require grad, of different dtypes, one of them
    # zero-width: gradients come back exactly, and the backward is itself
    # differentiable (second derivatives through the exchanges).
    a = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(rows, 2).to(torch.bfloat16).requires_grad_(True)
    empty = torch.zeros(rows, 0, requires_grad=True)
    _, ra, (rb, re) = balancer.route(a, [b, empty])
    assert re.shape == (int(chunk_lens.sum()), 0)
    _, ba, (bb, be) = balancer.reverse_route(ra * 2, [rb * 3, re])
    (grad_a,) = torch.autograd.grad((ba ** 2).sum(), a, create_graph=True)
    assert torch.equal(grad_a.detach(), 8 * a.detach())  # d/da (2a)^2
    (grad_a.sum() + bb.float().sum()).backward()
    assert torch.equal(a.grad, torch.full_like(a, 8.0))
    assert torch.equal(b.grad, torch.full_like(b, 3.0))

    # Without features: features is None, and a bf16 tensor comes back bit for bit.
    _, routed_half, none = balancer.route(half)
    assert none is None
    assert torch.equal(balancer.reverse_route(routed_half)[1], half)

    summary = balancer.get_routing_plan_summary()
    assert summary["step"] == step and summary["source"] == "local planner"
    assert summary["workload_before"] == expected["gpu_workload_before"]
    assert summary["workload_after"] == expected["gpu_workload"]
    assert summary["max_over_mean_after"] == pytest.approx(expected["after"]["max_over_mean"])
    assert summary["moved_tokens"] == expected["moved_tokens"]
    assert summary["total_tokens"] == expected["total_tokens"]
    assert summary["token_bytes"] == 2 * 4  # the last route: 4 bf16 per token
    assert summary["moved_bytes"] == expected["moved_tokens"] * 8
    assert summary["seq_lens"] == lens and summary["chunk_lens"] == chunk_lens.tolist()

    # Attention through the balancer equals attention without it.
    balanced = attention_layer(balancer, lens, step + 7)
    plain = attention_layer(None, lens, step + 7)
    for got, want, what in [(balanced[0], plain[0], "output"), (balanced[1], plain[1], "input grad"),
                            (balanced[2][0], plain[2][0], "qkv weight grad"),
                            (balanced[2][1], plain[2][1], "out weight grad")]:
        assert got.shape == want.shape, what
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), \
            f"step {step} {what}: max difference {(got - want).abs().max().item()}"
    return summary


# A measured cost model far from the transformer's straight line: attention
# flat up to 64 tokens (launch-bound), then growing in proportion.
MEASURED = {"cost_model": "measured",
            "cost_table": {"cost_model": "measured", "d_model": D_MODEL,
                           "measured_attention": {"pairs": [64, 4096, 65536],
                                                  "work": [4e5, 5e5, 2e7]}}}


def balance_world(rank, size, topology, cost):
    import knapformer

    balancer = knapformer.SequenceBalancer(topology, gamma=0.49, **(cost or {}))
    return [check_step(balancer, rank, size, step, topology, 0.49, cost) for step in range(3)]


@pytest.mark.parametrize("topology,size,cost", [
    ("g1n4", 4, None),
    ("g2n2", 4, None),
    ("g1n2+g2n1+g4n1", 8, None),
    ("g1n2+g2n1", 8, None),  # two replicas
    ("g1n2+g2n1+g4n1", 8, MEASURED),
])
def test_round_trip_attention_and_gradients_are_exact(topology, size, cost):
    summaries = run_world(balance_world, size, topology, cost)
    # Every rank reports the same group figures.
    for step in range(3):
        figures = {(s[step]["moved_tokens"], tuple(s[step]["workload_after"])) for s in summaries}
        assert len(figures) == 1


# Links fast enough that Ulysses costs nothing in the plan: with D_MODEL 8 an
# H100 node's prices would keep every step in one-GPU bags. Nodes of 4.
AUTO_MACHINE = {"intra_node_bytes_per_second": 1e20, "inter_node_bytes_per_second": 1e20,
                "gpus_per_node": 4}


def auto_lengths(rank, step):
    """Even (steps 0 and 3: one-GPU bags are best), one long sequence on
    rank 5 (1) and sparse (2)."""
    return [[40, 40], [30] if rank != 5 else [600], [5, 77] if rank == 0 else
            [300] if rank == 6 else [], [40, 40]][step]


def auto_world(rank, size):
    import knapformer

    balancer = knapformer.SequenceBalancer("auto", gamma=0.49, d_model=D_MODEL,
                                           machine=AUTO_MACHINE)
    steps = []
    for step in range(4):
        lens = auto_lengths(rank, step)
        balancer.plan_routing(lens)
        summary = balancer.get_routing_plan_summary()
        expected = knapformer.plan(all_lengths(lens), "auto", d_model=D_MODEL, gamma=0.49,
                                   machine=AUTO_MACHINE)
        assert summary["layout"] == expected["topology"], (step, summary["layout"])
        assert summary["workload_after"] == expected["gpu_workload"]
        mine = [c["length"] for c in expected["chunks"] if c["dst_rank"] == rank]
        ids = token_ids(rank, lens)
        chunk_lens, routed, _ = balancer.route(ids)
        assert chunk_lens.tolist() == mine
        assert torch.equal(balancer.reverse_route(routed)[1], ids), f"step {step}: round trip"
        balanced = attention_layer(balancer, lens, step + 11)
        plain = attention_layer(None, lens, step + 11)
        for got, want in [(balanced[0], plain[0]), (balanced[1], plain[1]),
                          (balanced[2][0], plain[2][0]), (balanced[2][1], plain[2][1])]:
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), \
                f"step {step}: max difference {(got - want).abs().max().item()}"
        steps.append((summary["layout"], balancer.bag_gpus))
    return steps


def test_auto_follows_the_chosen_layout_every_step():
    """topology "auto" through the Python package: every aligned block of 2
    and 4 within a node of 4 is made once, each step uses the bag the plan
    names (the planner core's plan for the same machine), and routes,
    attention and gradients stay exact while the layout changes."""
    results = run_world(auto_world, 8)
    layouts = [layout for layout, _ in results[0]]
    assert all([layout for layout, _ in r] == layouts for r in results), "ranks disagree"
    assert layouts[0] == "g1n8" and layouts[3] == "g1n8", layouts
    assert layouts[1] != "g1n8", "one long sequence takes a multi-GPU bag"
    assert results[5][1][1] > 1, results[5]
    for r, steps in enumerate(results):
        for layout, gpus in steps:
            assert gpus in (1, 2, 4), (r, layout, gpus)  # never past a node of 4


def subgroup_world(rank, size, metadata_on_gloo=False):
    """Two independent balancers, one per half of the world, each over its
    own process group with 2-GPU bags: every process makes every bag's group
    (torch's new_group rule) and each balancer moves only its half's tokens."""
    import knapformer

    halves = [dist.new_group([0, 1, 2, 3]), dist.new_group([4, 5, 6, 7])]
    mine = halves[rank // 4]
    balancer = knapformer.SequenceBalancer("g2n1", process_group=mine, job_id=f"half-{rank // 4}",
                                           _metadata_on_gloo=metadata_on_gloo)
    lens = [[5, 40], [3], [], [64, 1]][rank % 4]
    balancer.plan_routing(lens, D_MODEL)
    ids = token_ids(rank, lens)
    chunk_lens, routed, _ = balancer.route(ids)
    assert all(int(i) >> 40 in range(rank // 4 * 4, rank // 4 * 4 + 4) for i in routed), \
        "a token crossed to the other half"
    assert torch.equal(balancer.reverse_route(routed)[1], ids)
    q = torch.randn(int(chunk_lens.sum()), 4, 2, dtype=torch.float64)
    seq_lens, q2, _, _ = balancer.pre_attn(q, q, q)
    assert q2.shape[1] == 2 and int(seq_lens.sum()) == q2.shape[0]
    assert torch.equal(balancer.post_attn(q2)[1], q)
    summary = balancer.get_routing_plan_summary()
    return summary["world_size"], summary["total_tokens"], summary["rank"]


@pytest.mark.parametrize("metadata_on_gloo", [False, True])
def test_a_balancer_over_a_subgroup_of_the_job(metadata_on_gloo):
    """With metadata_on_gloo, through the Gloo twins an NCCL group gets
    (made for every half by every process)."""
    results = run_world(subgroup_world, 8, metadata_on_gloo)
    for rank, (world_size, total_tokens, group_rank) in enumerate(results):
        assert world_size == 4 and group_rank == rank % 4
        assert total_tokens == 5 + 40 + 3 + 64 + 1


def service_world(rank, size):
    import knapformer

    server = knapformer.PlannerServer("127.0.0.1:0") if rank == 0 else None
    address = [server.address if server else None]
    dist.broadcast_object_list(address, src=0)
    balancer = knapformer.SequenceBalancer("g1n2+g2n1", gamma=0.49, planner_address=address[0],
                                           job_id="python-service", planner_deadline=20)
    # The address from the environment, as the deploy manifests set it.
    os.environ["KNAPFORMER_PLANNER_ADDRESS"] = address[0]
    from_env = knapformer.SequenceBalancer("g1n4", job_id="python-env", planner_deadline=20)
    del os.environ["KNAPFORMER_PLANNER_ADDRESS"]
    sources = []
    for step in range(3):
        if step == 2:  # the service goes away: every rank falls back together
            dist.barrier()
            if server:
                server.shutdown(grace=1)
            dist.barrier()
        lens = lengths_at(rank, size, step)
        balancer.plan_routing(lens, token_dim=D_MODEL)
        x = torch.randn(sum(lens), D_MODEL)
        _, routed, _ = balancer.route(x)
        assert torch.equal(balancer.reverse_route(routed)[1], x)
        sources.append(balancer.get_routing_plan_summary()["source"])
        if step == 0:
            from_env.plan_routing([3, 4], token_dim=D_MODEL)
            sources.append(from_env.get_routing_plan_summary()["source"])
    return sources


def test_planner_service_in_rank_0_then_local_fallback():
    for sources in run_world(service_world, 4):
        # step 0, the balancer configured from the environment, steps 1 and 2
        assert sources == ["planner service", "planner service", "planner service", "local planner"]


def plan_ahead_world(rank, size, mode):
    """plan_routing after prefetch_routing gives the plan of a balancer that
    plans each step when it comes; a step called with other lengths than it
    prefetched raises on every rank."""
    import knapformer

    server = knapformer.PlannerServer("127.0.0.1:0") if rank == 0 else None
    address = [server.address if server else None]
    dist.broadcast_object_list(address, src=0)
    common = dict(gamma=0.49, planner_address=address[0], planner_deadline=20, planner_mode=mode)
    synchronous = knapformer.SequenceBalancer("g1n2+g2n1", job_id="python-sync", **common)
    ahead = knapformer.SequenceBalancer("g1n2+g2n1", job_id="python-ahead", **common)
    ahead.prefetch_routing(lengths_at(rank, size, 0), token_dim=D_MODEL)
    for step in range(3):
        lens = lengths_at(rank, size, step)
        synchronous.plan_routing(lens, token_dim=D_MODEL)
        ahead.plan_routing(lens, token_dim=D_MODEL)
        ahead.prefetch_routing(lengths_at(rank, size, step + 1), token_dim=D_MODEL)
        got, want = ahead.get_routing_plan_summary(), synchronous.get_routing_plan_summary()
        assert got["source"] == want["source"] == "planner service"
        for key in ("workload_after", "moved_tokens"):
            assert got[key] == want[key], key
        x = torch.randn(sum(lens), D_MODEL)
        _, routed, _ = ahead.route(x)
        _, routed_sync, _ = synchronous.route(x)
        assert torch.equal(routed, routed_sync)
        assert torch.equal(ahead.reverse_route(routed)[1], x)
    changed = lengths_at(rank, size, 3) + ([5] if rank == 2 else [])
    try:
        ahead.plan_routing(changed, token_dim=D_MODEL)
        message = None
    except RuntimeError as e:
        message = str(e)
    if server:
        server.shutdown(grace=1)
    return message


@pytest.mark.parametrize("mode", ["group", "per-rank"])
def test_planning_ahead_gives_the_same_plans(mode):
    for message in run_world(plan_ahead_world, 4, mode):
        assert message is not None and "rank 2: step 3: its lengths differ from those " \
            "prefetched" in message, message


def caught(call):
    try:
        call()
    except (ValueError, RuntimeError) as e:
        return type(e).__name__, str(e)
    return None


def misuse_world(rank, size):
    import knapformer

    outcomes = {}
    outcomes["topology"] = caught(lambda: knapformer.SequenceBalancer("g1n2abc"))
    outcomes["world"] = caught(lambda: knapformer.SequenceBalancer("g4n3"))
    outcomes["cost_model"] = caught(lambda: knapformer.SequenceBalancer("g1n4", cost_model="quad"))
    outcomes["cost_table"] = caught(lambda: knapformer.SequenceBalancer("g1n4",
                                                                        cost_model="measured"))
    outcomes["cost_table_d_model"] = caught(lambda: knapformer.SequenceBalancer(
        "g1n4", d_model=D_MODEL * 2, **MEASURED))
    outcomes["cost_table_points"] = caught(lambda: knapformer.SequenceBalancer(
        "g1n4", cost_model="measured", cost_table=dict(
            MEASURED["cost_table"], measured_attention={"pairs": [2, 1], "work": [1, 1]})))
    outcomes["replicas_per_rank"] = caught(lambda: knapformer.SequenceBalancer(
        "g1n4", planner_address="ipv4:127.0.0.1:1,127.0.0.1:2", planner_mode="per-rank"))
    outcomes["url_address"] = caught(lambda: knapformer.SequenceBalancer(
        "g1n4", planner_address="http://127.0.0.1:50051"))
    outcomes["portless_address"] = caught(lambda: knapformer.SequenceBalancer(
        "g1n4", planner_address="127.0.0.1"))
    balancer = knapformer.SequenceBalancer("g1n2+g2n1")
    outcomes["no_token_dim"] = caught(lambda: balancer.plan_routing([3]))
    outcomes["before_plan"] = caught(lambda: balancer.route(torch.zeros(3, 4)))
    outcomes["summary_before_plan"] = caught(balancer.get_routing_plan_summary)
    outcomes["negative_on_rank_1"] = caught(
        lambda: balancer.plan_routing([-1] if rank == 1 else [3], token_dim=8))
    outcomes["float_on_rank_2"] = caught(
        lambda: balancer.plan_routing([3, 2.5] if rank == 2 else [3], token_dim=8))
    outcomes["token_dim"] = caught(lambda: balancer.plan_routing([3], token_dim=0))
    outcomes["d_model_differs"] = caught(
        lambda: balancer.plan_routing([3], token_dim=16 if rank == 3 else 8))
    outcomes["cap"] = caught(lambda: knapformer.SequenceBalancer(
        "g1n4", max_tokens_per_gpu=10).plan_routing([40], token_dim=8))
    outcomes["bad_index_on_rank_2"] = caught(
        lambda: balancer.plan_routing([torch.tensor(3.0)] if rank == 2 else [3], token_dim=8))
    balancer.plan_routing([3, 5], token_dim=8)  # still usable after all of that
    outcomes["device"] = caught(lambda: balancer.route(torch.empty(8, 4, device="meta")))
    outcomes["rows"] = caught(lambda: balancer.route(torch.zeros(7, 4)))
    outcomes["feature_rows"] = caught(lambda: balancer.route(torch.zeros(8, 4), [torch.zeros(6)]))
    _, routed, _ = balancer.route(torch.ones(8, 6))
    q = routed.reshape(-1, 3, 2)
    outcomes["heads"] = caught(lambda: balancer.pre_attn(q, q, q))
    back = balancer.reverse_route(routed)[1]
    assert torch.equal(back, torch.ones(8, 6))

    # A backward pass after the balancer is gone still finds its transports.
    x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
    _, routed, _ = balancer.route(x)
    q = routed.reshape(-1, 2, 2)
    _, q, k, v = balancer.pre_attn(q, q * 2, q * 3)
    _, o = balancer.post_attn(q + k + v)
    _, out, _ = balancer.reverse_route(o.reshape(-1, 4))
    del balancer, routed, q, k, v, o
    import gc
    gc.collect()
    out.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 6.0))
    return outcomes


EXPECTED_MISUSE = {
    "topology": ("ValueError", "topology term 'g1n2abc': unexpected trailing 'abc'"),
    "world": ("ValueError", "4 is not a multiple of the group size 12"),
    "cost_model": ("ValueError", "cost_model: 'quad' is not one of"),
    "cost_table": ("ValueError", "cost_table: give it exactly with cost_model='measured'"),
    "cost_table_d_model": ("ValueError", f"d_model: {D_MODEL * 2}, but cost_table was measured "
                                         f"at d_model {D_MODEL}"),
    "cost_table_points": ("ValueError", "cost_table: measured_attention.pairs[1]: 1 must be "
                                        "greater than pairs[0] (2)"),
    "replicas_per_rank": ("ValueError", "'ipv4:127.0.0.1:1,127.0.0.1:2' names 2 planner replicas, "
                                        "but per-rank mode needs every rank of a step"),
    "url_address": ("ValueError", "planner_address: 'http://127.0.0.1:50051' is a URL of scheme "
                                  "'http', which gRPC does not resolve (drop 'http://'); a planner "
                                  "address is host:port"),
    "portless_address": ("ValueError", "planner_address: '127.0.0.1' has no port (gRPC would try "
                                       "443)"),
    "no_token_dim": ("ValueError", "token_dim is required"),
    "before_plan": ("RuntimeError", "FAILED_PRECONDITION: rank 0: route: no plan for this step yet"),
    "summary_before_plan": ("RuntimeError", "FAILED_PRECONDITION: get_routing_plan_summary: "
                                            "no step has been planned yet"),
    "negative_on_rank_1": ("ValueError", "ranks[1][0]: sequence length -1"),
    "token_dim": ("ValueError", "token_dim: 0 is outside [1, 65536]"),
    "d_model_differs": ("RuntimeError", "FAILED_PRECONDITION: spec: rank"),
    "cap": ("RuntimeError", "RESOURCE_EXHAUSTED: max_tokens_per_gpu"),
    "feature_rows": ("ValueError", "rank 0: route: packed_features[0] has 6 rows, packed_seqs 8"),
    "device": ("ValueError", "rank 0: route: is on meta, but rank 0's transport moves cpu memory"),
    "heads": ("ValueError", "3 heads (dimension 1) do not split over the bags of g1n2+g2n1; "
                            "heads must be a multiple of 2"),
}


def test_every_misuse_raises_on_every_rank():
    results = run_world(misuse_world, 4)
    for rank, outcomes in enumerate(results):
        for name, (kind, text) in EXPECTED_MISUSE.items():
            assert outcomes[name] is not None, f"rank {rank}: {name} raised nothing"
            assert outcomes[name][0] == kind and text in outcomes[name][1], \
                f"rank {rank}: {name}: {outcomes[name]}"
        # Every rank passed 7 rows: all raise the first rank's reason.
        assert outcomes["rows"][0] == "ValueError"
        assert "rank 0: route: 7 rows, rank 0 expects 8" in outcomes["rows"][1]
        # The rank whose lengths were unreadable says why; the others name it.
        for name, why in [("float_on_rank_2", "local_seq_lens[1]: 2.5 is not an integer"),
                          ("bad_index_on_rank_2", "local_seq_lens[0]: tensor(3.) is not an integer")]:
            kind, text = outcomes[name]
            assert kind == "ValueError", (rank, name, text)
            assert (why if rank == 2 else "ranks[2][0]: sequence length -1") in text, (rank, text)


def lengths_alias_world(rank, size):
    import knapformer

    balancer = knapformer.SequenceBalancer("g2n1")
    lens = [5 + rank, 3]
    balancer.plan_routing(lens, token_dim=D_MODEL)
    x = torch.randn(sum(lens), HEADS, HEAD_DIM)
    for _ in range(2):  # the step's first lengths of a kind, and a later one
        chunk_lens, routed, _ = balancer.route(x)
        want_chunks = chunk_lens.clone()
        chunk_lens.fill_(-1)  # a caller editing the lengths it was given
        attn_lens, q, _, _ = balancer.pre_attn(routed, routed, routed)
        want_attn = attn_lens.clone()
        attn_lens.zero_()
    post_lens, out = balancer.post_attn(q)
    _, again, _ = balancer.route(x)
    _, again_q, _, _ = balancer.pre_attn(routed, routed, routed)
    return (post_lens.tolist() == want_chunks.tolist() and
            balancer.pre_attn(routed, routed, routed)[0].tolist() == want_attn.tolist() and
            torch.equal(out, routed) and torch.equal(again, routed) and torch.equal(again_q, q))


def test_lengths_handed_out_are_each_callers_own():
    """route, pre_attn and post_attn hand out lengths tensors: editing one in
    place changes no later call's."""
    assert run_world(lengths_alias_world, 2, timeout=120) == [True, True]
