"""Attention masks through knapformer.SequenceBalancer on real Gloo process
groups (4 and 8 spawned processes on 127.0.0.1): plan_routing(...,
attn_masks=...) prices each sequence's attention by the pairs it attends
(the same workloads as knapformer.plan), get_attention_masks() names the
masks of the sequences this rank attends after pre_attn, and float64
causal, windowed and block-causal attention through route -> pre_attn ->
masked attention -> post_attn -> reverse_route equals the same attention
without balancing, outputs and gradients. Malformed masks raise on every
rank, naming the rank, the sequence and the field."""
import math

import pytest
import torch
import torch.distributed as dist

from knapformer._masks import dense
from knapformer.launch import run_world

D_MODEL = 8
HEADS = 8
HEAD_DIM = 2


def lengths_at(rank, size, step):
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


def mask_of(rank, step, i, length):
    """Every form, derivable on any rank."""
    g = torch.Generator().manual_seed(rank * 7 + step * 131 + i * 17 + 3)
    kind = (rank + step + i) % 4
    if kind == 0:
        return "causal"
    if kind == 1:
        return {"window": int(torch.randint(1, 13, (1,), generator=g))}
    if kind == 2 and length > 0:
        spans, left = [], length
        while left > 0:
            n = min(left, int(torch.randint(1, 21, (1,), generator=g)))
            spans.append([n, "causal" if int(torch.randint(0, 2, (1,), generator=g)) else "full"])
            left -= n
        return {"spans": spans}
    return "full"


def masked_varlen_attention(q, k, v, seq_lens, masks):
    """Attention of each sequence on its own, under its mask."""
    outs, start = [], 0
    for n, mask in zip((int(n) for n in seq_lens), masks):
        if n == 0:
            continue
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~dense(n, mask), float("-inf"))
        outs.append((torch.softmax(scores, dim=-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs) if outs else q[:0] * 0


def attention_layer(balancer, lens, masks, seed):
    torch.manual_seed(seed)
    w_qkv = torch.randn(D_MODEL, 3 * HEADS * HEAD_DIM, dtype=torch.float64, requires_grad=True)
    w_out = torch.randn(HEADS * HEAD_DIM, D_MODEL, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(seed * 100 + dist.get_rank() + 1)
    x = torch.randn(sum(lens), D_MODEL, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(sum(lens), D_MODEL, dtype=torch.float64)
    h, seq_lens = x, lens
    if balancer is not None:
        _, h, _ = balancer.route(x)
    q, k, v = (h @ w_qkv).reshape(-1, 3, HEADS, HEAD_DIM).unbind(1)
    if balancer is not None:
        seq_lens, q, k, v = balancer.pre_attn(q, k, v)
        masks = balancer.get_attention_masks()  # those of the sequences now held
        assert len(masks) == len(seq_lens)
    o = masked_varlen_attention(q, k, v, seq_lens, masks)
    if balancer is not None:
        _, o = balancer.post_attn(o)
    out = o.reshape(-1, HEADS * HEAD_DIM) @ w_out
    if balancer is not None:
        _, out, _ = balancer.reverse_route(out)
    (out * upstream).sum().backward()
    grads = [w_qkv.grad.clone(), w_out.grad.clone()]
    for grad in grads:
        dist.all_reduce(grad)
    return out.detach(), x.grad, grads


def masked_world(rank, size, topology):
    import knapformer

    balancer = knapformer.SequenceBalancer(topology, gamma=0.49)
    for step in range(6):
        lens = lengths_at(rank, size, step)
        masks = [mask_of(rank, step, i, n) for i, n in enumerate(lens)]
        balancer.plan_routing(lens, token_dim=D_MODEL, attn_masks=masks)
        every_lens = [lengths_at(r, size, step) for r in range(size)]
        every_mask = [[mask_of(r, step, i, n) for i, n in enumerate(every_lens[r])]
                      for r in range(size)]
        masked = knapformer.plan(every_lens, topology, d_model=D_MODEL, gamma=0.49,
                                 attn_masks=every_mask)
        blind = knapformer.plan(every_lens, topology, d_model=D_MODEL, gamma=0.49)
        summary = balancer.get_routing_plan_summary()
        assert summary["workload_before"] == masked["gpu_workload_before"], step
        assert summary["workload_after"] == masked["gpu_workload"], step
        assert summary["attn_masks"] == masks
        if any(m != "full" for rank_masks in every_mask for m in rank_masks):
            assert sum(masked["gpu_workload_before"]) < sum(blind["gpu_workload_before"])
        # What this rank attends: the masks of the sequences it holds.
        mine = knapformer.plan(every_lens, topology, d_model=D_MODEL, gamma=0.49,
                               attn_masks=every_mask, rank=rank)
        held = balancer.get_attention_masks()
        assert held == mine.get("attention_masks", []) == summary["attention_masks"], step
        balanced = attention_layer(balancer, lens, masks, step + 3)
        plain = attention_layer(None, lens, masks, step + 3)
        for got, want, what in [(balanced[0], plain[0], "output"),
                                (balanced[1], plain[1], "input grad"),
                                (balanced[2][0], plain[2][0], "qkv weight grad"),
                                (balanced[2][1], plain[2][1], "out weight grad")]:
            assert got.shape == want.shape, what
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-12), \
                f"step {step} {what}: max difference {(got - want).abs().max().item()}"
    # A step without masks: none held, none in the summary.
    balancer.plan_routing(lengths_at(rank, size, 0), token_dim=D_MODEL)
    assert balancer.get_attention_masks() is None
    assert balancer.get_routing_plan_summary()["attn_masks"] is None
    return True


@pytest.mark.parametrize("topology,size", [("g2n2", 4), ("g1n2+g2n1+g4n1", 8)])
def test_masked_attention_and_gradients_are_exact(topology, size):
    assert run_world(masked_world, size, topology) == [True] * size


BAD_MASKS = {
    # rank 2's masks for its lengths [10, 6], and what every rank reads
    "unknown_kind": (["causal", "diagonal"], "attn_masks[1]: unknown mask kind 'diagonal'"),
    "window": ([{"window": 0}, "full"], "attn_masks[0].window: must be at least 1, got 0"),
    "spans_sum": (["full", {"spans": [[2, "full"], [3, "causal"]]}],
                  "attn_masks[1].spans: lengths add up to 5, the sequence has 6 tokens"),
    "span_kind": (["full", {"spans": [[6, "sideways"]]}],
                  "attn_masks[1].spans[0]: unknown span kind \"sideways\""),
    "too_many_spans": ([{"spans": [[1, "full"]] * 4097}, "full"],
                       "attn_masks[0].spans: 4097 spans exceed the limit of 4096"),
    "count": (["full"], "attn_masks: 1 masks for 2 sequences"),
    "not_a_list": ("causal", "attn_masks: needs a list with one mask per sequence, got a str"),
    "not_a_form": ([1.5, "full"], "attn_masks[0]: must be one of \"full\", \"causal\""),
    "not_json": ([object(), "full"], "attn_masks: a object is not part of a mask form"),
    "some_ranks_only": (None, "rank 2: attention_masks: none for 2 sequences"),
}


def errors_world(rank, size):
    import knapformer
    from timing import timed

    balancer = knapformer.SequenceBalancer("g2n2", gamma=0.49)
    outcomes = {}
    for name, (bad, _) in BAD_MASKS.items():
        masks = bad if rank == 2 else ["causal", "full"]
        outcomes[name] = timed(lambda: balancer.plan_routing([10, 6], token_dim=D_MODEL,
                                                             attn_masks=masks))[:2]
    # After every refusal a good step goes through.
    balancer.plan_routing([10, 6], token_dim=D_MODEL, attn_masks=["causal", "full"])
    outcomes["good"] = balancer.get_attention_masks() is not None
    return outcomes


def test_malformed_masks_raise_on_every_rank_naming_rank_sequence_and_field():
    for rank, outcomes in enumerate(run_world(errors_world, 4)):
        assert outcomes.pop("good") is True
        for name, (kind, text) in outcomes.items():
            want = BAD_MASKS[name][1]
            assert kind == "ValueError", (rank, name, kind, text)
            assert want in text and "rank 2" in text, (rank, name, text)


@pytest.mark.parametrize("masks,text", [
    ([["causal"], [{"window": 0}]], "masks[1][0].window: must be at least 1, got 0"),
    ([["causal"], []], "masks[1]: 0 masks for 1 sequences"),
    ([["causal"]], "masks: got masks for 1 ranks, there are 2"),
    ([["causal"], [{"spans": [[3, "full"]]}]], "masks[1][0].spans: lengths add up to 3"),
])
def test_plan_names_the_bad_mask(masks, text):
    import knapformer

    with pytest.raises(ValueError, match=None) as error:
        knapformer.plan([[10], [5]], "g1n2", attn_masks=masks)
    assert text in str(error.value)


def test_plan_prices_masks_and_moves_work_to_balance_them():
    import knapformer

    # Two ranks: a 4096-token causal document and a 3000-token image. Blind,
    # the document looks heavier and the plan keeps them apart; with masks
    # the true work is the same either way, and the figures say so.
    ranks = [[4096], [3000]]
    masks = [["causal"], ["full"]]
    blind = knapformer.plan(ranks, "g1n2", d_model=64, gamma=1.0)
    masked = knapformer.plan(ranks, "g1n2", d_model=64, gamma=1.0, attn_masks=masks)
    causal_pairs = 4096 * 4097 / 2
    assert masked["gpu_workload_before"][0] == pytest.approx(24 * 4096 * 64 ** 2
                                                             + 4 * 64 * causal_pairs)
    assert blind["gpu_workload_before"][0] == pytest.approx(24 * 4096 * 64 ** 2
                                                            + 4 * 64 * 4096 ** 2)
    assert masked["after"]["max_over_mean"] < blind["after"]["max_over_mean"]
