"""The reference implementation's SequenceBalancer surface on real Gloo
worlds: its 47 attributes as views of the planned step (checked against the
planner core's chunk table), replicas as separate balancing groups, the
per-rank planner mode's refusal, its keywords, and every row width from 1 to
16 bytes routed exactly (bf16 features beside float and int64 ones)."""
import pytest
import torch
import torch.distributed as dist

from knapformer.launch import run_world

D_MODEL = 8

# Every attribute the reference's SequenceBalancer sets (constructor,
# plan_routing, tracking).
REFERENCE_ATTRIBUTES = (
    "bag_specs", "gamma", "this_gpu_id", "this_device", "parsed_bag_specs",
    "balance_process_group", "balance_gpu_ids", "bag_gpu_options", "bag_gpu_options2bag_ids",
    "bag_id2gpu_ids", "gpu_id2bag_id", "bag_id2process_group", "metrics",
    "local_seq_lens", "seq_id2gpu_id", "seq_id2seq_len", "seq_id2seq_workload",
    "gpu_id2seq_ids", "gpu_id2seq_lens", "gpu_id2seq_workloads", "gpu_id2total_workload",
    "per_gpu_capacity", "seq_id2assigned_bag_id", "bag_id2capacity", "bag_id2assigned_seq_ids",
    "bag_id2occupancy", "chunk_id2gpu_id", "chunk_id2chunk_len", "chunk_id2seq_id",
    "gpu_id2chunk_ids", "gpu_id2chunk_lens", "balance_chunk_id2gpu_id",
    "balance_gpu_id2chunk_ids", "balance_gpu_id2chunk_lens", "balance_gpu_id2seq_ids",
    "balance_chunk_id2chunk_len", "balance_gpu_id2total_workload", "orig_minmax_workload",
    "bala_minmax_workload", "ulysses_bag", "tracking", "tracked_per_gpu_capacity",
    "tracked_original_imbalance_ratio", "tracked_balanced_imbalance_ratio", "tracked_tflops",
    "num_layers", "include_bwd",
)


def lengths_of(rank, step):
    g = torch.Generator().manual_seed(rank * 100 + step)
    lens = [int(v) for v in torch.randint(1, 40, (1 + rank % 3,), generator=g)]
    if rank == 2:
        lens.append(0)  # an empty sequence goes nowhere
    return lens + [200] if rank == step % 4 else lens


def group_size(group):
    """Ranks in a bag's group; None for no group or a bag without this rank."""
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER:
        return None
    return dist.get_world_size(group)


def tables_world(rank, size, topology):
    import knapformer

    balancer = knapformer.SequenceBalancer(topology, gamma=0.49)
    before = {name: hasattr(balancer, name) for name in ("gpu_id2seq_lens", "ulysses_bag")}
    assert balancer.this_gpu_id == rank and balancer.this_device == torch.device("cpu")
    balancer.turn_on_tracking(num_layers=3)
    everyone = []
    for step in range(2):
        lens = lengths_of(rank, step)
        everyone = [None] * size
        dist.all_gather_object(everyone, lens)
        balancer.plan_routing(lens, D_MODEL)
        chunk_lens, _, _ = balancer.route(torch.zeros(sum(lens), 1))
    for name in REFERENCE_ATTRIBUTES:
        getattr(balancer, name)
    # The group's sequence lengths, gathered over balance_process_group as the
    # reference's MMDiT gathers its per-sequence vectors.
    group = balancer.balance_process_group
    mine = torch.tensor([len(balancer.gpu_id2seq_lens[rank])])
    counts = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(counts, mine, group=group)
    with pytest.raises(AttributeError):
        balancer.gpu_id2seq_lens = {}
    return {"before": before, "everyone": everyone, "chunk_lens": chunk_lens.tolist(),
            "counts": [int(c) for c in counts],
            "attrs": {name: getattr(balancer, name) for name in (
                "balance_gpu_ids", "bag_id2gpu_ids", "gpu_id2bag_id", "parsed_bag_specs",
                "bag_gpu_options", "bag_gpu_options2bag_ids", "seq_id2gpu_id", "seq_id2seq_len",
                "gpu_id2seq_ids", "gpu_id2seq_lens", "seq_id2assigned_bag_id",
                "bag_id2assigned_seq_ids", "chunk_id2gpu_id", "chunk_id2chunk_len",
                "chunk_id2seq_id", "gpu_id2chunk_ids", "gpu_id2chunk_lens",
                "balance_chunk_id2gpu_id", "balance_gpu_id2chunk_ids",
                "balance_gpu_id2chunk_lens", "balance_gpu_id2seq_ids",
                "balance_chunk_id2chunk_len", "per_gpu_capacity", "gpu_id2total_workload",
                "balance_gpu_id2total_workload", "seq_id2seq_workload", "bag_id2capacity",
                "bag_id2occupancy", "orig_minmax_workload", "bala_minmax_workload",
                "tracked_per_gpu_capacity", "tracked_tflops")},
            "summary": balancer.get_routing_plan_summary(),
            "bag_groups": {b: (g is None, group_size(g))
                           for b, g in balancer.bag_id2process_group.items()},
            "ulysses": (balancer.ulysses_bag.bag_id, balancer.ulysses_bag.gpu_ids,
                        balancer.ulysses_bag.this_attn_seq_lens.tolist())}


@pytest.mark.parametrize("topology,size", [("g1n2+g2n1+g4n1", 8), ("g1n2+g2n1", 8)])
def test_reference_tables_are_views_of_the_plan(topology, size):
    import knapformer

    results = run_world(tables_world, size, topology)
    everyone = results[0]["everyone"]
    plan = knapformer.plan(everyone, topology, d_model=D_MODEL, gamma=0.49)
    replica = sum(int(t[1:].split("n")[0]) * int(t.split("n")[1]) for t in topology.split("+"))
    for rank, result in enumerate(results):
        assert result["before"] == {"gpu_id2seq_lens": False, "ulysses_bag": False}
        a = result["attrs"]
        first = rank // replica * replica
        ranks = list(range(first, first + replica))
        assert a["balance_gpu_ids"] == ranks
        assert result["counts"] == [len(everyone[r]) for r in ranks]
        # Sequences numbered from 0 within the group, rank by rank.
        expected_lens = [n for r in ranks for n in everyone[r]]
        assert list(a["seq_id2seq_len"].values()) == expected_lens
        assert list(a["seq_id2seq_len"]) == list(range(len(expected_lens)))
        assert a["gpu_id2seq_lens"] == {r: everyone[r] for r in ranks}
        assert [s for r in ranks for s in a["gpu_id2seq_ids"][r]] == list(range(len(expected_lens)))
        # Chunks: the planner core's chunk table of this group, renumbered.
        chunks = [c for c in plan["chunks"] if c["src_rank"] in ranks]
        assert list(a["chunk_id2chunk_len"].values()) == [c["length"] for c in chunks]
        assert list(a["chunk_id2gpu_id"].values()) == [c["src_rank"] for c in chunks]
        first_seq, count = {}, 0
        for r in ranks:
            first_seq[r], count = count, count + len(everyone[r])
        assert list(a["chunk_id2seq_id"].values()) == [
            first_seq[c["src_rank"]] + c["seq_index"] for c in chunks]
        for r in ranks:
            mine = [i for i, c in enumerate(chunks) if c["dst_rank"] == r]
            assert a["balance_gpu_id2chunk_ids"][r] == tuple(mine)
            assert a["balance_gpu_id2chunk_lens"][r] == tuple(chunks[i]["length"] for i in mine)
            assert a["gpu_id2chunk_ids"][r] == [i for i, c in enumerate(chunks)
                                                if c["src_rank"] == r]
        assert list(a["balance_gpu_id2chunk_lens"][rank]) == result["chunk_lens"]
        assert list(a["balance_chunk_id2gpu_id"].values()) == sorted(
            a["balance_chunk_id2gpu_id"].values())
        # Bags: contiguous, sizes ascending, every gpu of the group in one.
        assert sorted(g for members in a["bag_id2gpu_ids"].values() for g in members) == ranks
        assert a["parsed_bag_specs"] == sorted(
            (int(t[1:].split("n")[0]), int(t.split("n")[1])) for t in topology.split("+"))
        for bag, members in a["bag_id2gpu_ids"].items():
            assert all(a["gpu_id2bag_id"][g] == bag for g in members)
            assert bag in a["bag_gpu_options2bag_ids"][len(members)]
            for g in members:
                assert a["balance_gpu_id2seq_ids"][g] == a["bag_id2assigned_seq_ids"][bag]
            for s in a["bag_id2assigned_seq_ids"][bag]:
                assert a["seq_id2assigned_bag_id"][s] == bag
        # The empty sequence has no bag and no chunk.
        empty = [s for s, n in a["seq_id2seq_len"].items() if n == 0]
        assert len(empty) == (1 if 2 in ranks else 0)
        assert all(s not in a["seq_id2assigned_bag_id"] for s in empty)
        # Workloads: the cost model's / 1e12 and the plan's per-rank figures.
        for s, n in a["seq_id2seq_len"].items():
            assert a["seq_id2seq_workload"][s] == pytest.approx(
                (24 * n * D_MODEL ** 2 + 0.49 * 4 * n * n * D_MODEL) / 1e12, rel=1e-12)
        for r in ranks:
            assert a["gpu_id2total_workload"][r] == pytest.approx(
                plan["gpu_workload_before"][r] / 1e12, rel=1e-12)
            assert a["balance_gpu_id2total_workload"][r] == pytest.approx(
                plan["gpu_workload"][r] / 1e12, rel=1e-12)
        capacity = sum(a["gpu_id2total_workload"].values()) / replica
        assert a["per_gpu_capacity"] == pytest.approx(capacity, rel=1e-12)
        for bag, members in a["bag_id2gpu_ids"].items():
            assert a["bag_id2capacity"][bag] == pytest.approx(capacity * len(members))
        assert a["orig_minmax_workload"] == (min(a["gpu_id2total_workload"].values()),
                                             max(a["gpu_id2total_workload"].values()))
        assert a["tracked_per_gpu_capacity"][-1] == a["per_gpu_capacity"]
        assert len(a["tracked_tflops"]) == 2
        # Bag groups: None for one GPU, a group of the bag's size for this rank's.
        for bag, (none, size_of) in result["bag_groups"].items():
            members = a["bag_id2gpu_ids"][bag]
            assert none == (len(members) == 1)
            if rank in members and len(members) > 1:
                assert size_of == len(members)
        bag_id, gpu_ids, _ = result["ulysses"]
        assert gpu_ids == a["bag_id2gpu_ids"][bag_id] and rank in gpu_ids
        # The summary is ours plus the reference's keys.
        summary = result["summary"]
        assert summary["chunk_id2seq_id"] == a["chunk_id2seq_id"]
        assert summary["chunks"] == plan["chunks"]
        assert summary["wir_before"] > summary["wir_after"]


def per_rank_world(rank, size):
    import knapformer

    server = knapformer.PlannerServer("127.0.0.1:0") if rank == 0 else None
    address = [server.address if server else None]
    dist.broadcast_object_list(address, src=0)
    balancer = knapformer.SequenceBalancer("g1n4", planner_address=address[0],
                                           job_id="per-rank-tables", planner_mode="per-rank",
                                           planner_deadline=20)
    balancer.plan_routing([5 + rank], D_MODEL)
    source = balancer.get_routing_plan_summary()["source"]
    summary_keys = set(balancer.get_routing_plan_summary())
    try:
        balancer.gpu_id2seq_lens
        refused = None
    except RuntimeError as error:
        refused = str(error)
    bags = balancer.bag_id2gpu_ids  # from the topology: no whole plan needed
    local = balancer.local_seq_lens.tolist()
    # Group mode (the default): rank 0's answer carries the whole plan.
    grouped = knapformer.SequenceBalancer("g2n2", planner_address=address[0],
                                          job_id="group-tables", planner_deadline=20)
    grouped.plan_routing([5 + rank, 2], D_MODEL)
    group_source = grouped.get_routing_plan_summary()["source"]
    group_lens = grouped.gpu_id2seq_lens
    dist.barrier()
    if server:
        server.shutdown(grace=1)
    return (source, "chunk_id2seq_id" in summary_keys, refused, bags, local, group_source,
            group_lens)


def test_per_rank_mode_refuses_the_whole_step_tables_with_a_reason():
    for rank, (source, has_reference_keys, refused, bags, local, group_source,
               group_lens) in enumerate(run_world(per_rank_world, 4)):
        assert source == "planner service"
        assert not has_reference_keys
        assert "planner_mode='per-rank'" in refused and "gpu_id2seq_lens" in refused
        assert bags == {0: [0], 1: [1], 2: [2], 3: [3]}  # g1n4: four one-GPU bags
        assert local == [5 + rank]
        assert group_source == "planner service"
        assert group_lens == {r: [5 + r, 2] for r in range(4)}


def widths_world(rank, size):
    import knapformer

    balancer = knapformer.SequenceBalancer("g1n2+g2n1", gamma=0.49)
    lens = [3 + rank, 40] if rank == 0 else [2 + rank]
    balancer.plan_routing(lens, D_MODEL)
    tokens = sum(lens)
    g = torch.Generator().manual_seed(rank)
    # Every row width from 1 to 16 bytes: uint8 columns, and int16 / bf16 /
    # fp16 columns for the 2-byte multiples (rows of 2 mod 4 bytes broke
    # Gloo and NCCL when viewed as int16).
    features = [torch.randint(0, 256, (tokens, w), generator=g, dtype=torch.uint8)
                for w in range(1, 17)]
    for width in (1, 3, 5, 7):
        features.append(torch.randn(tokens, width, generator=g).to(torch.bfloat16))
        features.append(torch.randn(tokens, width, generator=g).to(torch.float16))
        features.append(torch.randint(-30000, 30000, (tokens, width), generator=g,
                                      dtype=torch.int16))
    positions = (torch.arange(tokens, dtype=torch.int64) + (1 << 40))[:, None]
    x = torch.randn(tokens, D_MODEL, generator=g, dtype=torch.float32)
    _, routed, routed_features = balancer.route(x, [positions] + features,
                                                force_fp32_buffer=True)
    _, back, back_features = balancer.reverse_route(routed, routed_features,
                                                    force_fp32_buffer=True)
    exact = torch.equal(back, x) and all(
        torch.equal(a, b) and a.dtype == b.dtype
        for a, b in zip([positions] + features, back_features))
    return exact, tokens, routed.shape[0], [f.dtype for f in routed_features]


def test_every_row_width_and_bf16_features_route_exactly():
    results = run_world(widths_world, 4)
    assert all(exact for exact, _, _, _ in results)
    # Tokens moved between ranks (the 40-token sequence needs the 2-GPU bag).
    assert any(own != routed for _, own, routed, _ in results)
    assert sum(routed for _, _, routed, _ in results) == sum(own for _, own, _, _ in results)
    assert results[0][3][0] == torch.int64 and results[0][3][-1] == torch.int16
