"""knapformer.plan, synthetic_lengths, synthetic_batch and PlannerServer in one process."""
import json
import subprocess
import urllib.request

import pytest
import torch

import knapformer

RANKS = [[4096, 256], [1024], [], [16384, 300, 300], [512], [64], [0], [2048]]
TOPOLOGY = "g1n2+g2n1+g4n1"


def test_plan_covers_every_token_exactly_once_and_balances():
    plan = knapformer.plan(RANKS, TOPOLOGY, d_model=3072, gamma=0.49)
    covered = {}
    for c in plan["chunks"]:
        covered.setdefault((c["src_rank"], c["seq_index"]), []).append((c["offset"], c["length"]))
    for rank, lengths in enumerate(RANKS):
        for index, length in enumerate(lengths):
            pieces = sorted(covered.pop((rank, index), []))
            start = 0
            for offset, size in pieces:
                assert offset == start
                start += size
            assert start == length, (rank, index)
    assert not covered
    assert plan["after"]["max_over_mean"] < plan["before"]["max_over_mean"]
    assert plan["total_tokens"] == sum(map(sum, RANKS))
    assert plan["token_bytes"] == 2 * 3072
    assert plan["moved_bytes"] == plan["moved_tokens"] * 2 * 3072


def test_plan_equals_the_command_line(tmp_path):
    """The Python API and `knapformer plan` share one code path: same JSON."""
    binary = "tools/knapformer"
    request = {"topology": TOPOLOGY, "d_model": 3072, "gamma": 0.49, "ranks": RANKS}
    (tmp_path / "request.json").write_text(json.dumps(request))
    for flags, kwargs in [([], {}), (["--locality", "off"], {"locality": False}),
                          (["--rank", "3"], {"rank": 3}),
                          (["--max-tokens-per-gpu", "9000"], {"max_tokens_per_gpu": 9000})]:
        cli = subprocess.run([binary, "plan", "--input", str(tmp_path / "request.json")] + flags,
                             capture_output=True, text=True, timeout=60, check=True)
        assert json.loads(cli.stdout) == knapformer.plan(RANKS, TOPOLOGY, **kwargs), flags


def test_plan_takes_tensors_like_lists():
    ranks = [torch.tensor(r, dtype=torch.int64) for r in RANKS]
    assert knapformer.plan(ranks, TOPOLOGY) == knapformer.plan(RANKS, TOPOLOGY)


def test_the_measured_model_prices_attention_by_its_table():
    table = {"cost_model": "measured", "d_model": 16,
             "measured_attention": {"pairs": [100, 10000], "work": [1e5, 1e6]}}
    plan = knapformer.plan([[100], [10]], "g1n2", d_model=16, cost_model="measured",
                           cost_table=table)
    # 24*l*d^2 and the table: 10000 pairs at its point, 100 at its first.
    assert plan["gpu_workload_before"] == [24 * 100 * 16 ** 2 + 1e6, 24 * 10 * 16 ** 2 + 1e5]
    assert plan["predicted_step"]["seconds"] > 0


def test_locality_moves_fewer_tokens_at_the_same_step_time():
    """The paper's low-res scenario on g1n32: locality keeps most tokens home."""
    ranks = knapformer.synthetic_lengths("low-res", 32, seed=0, step=0)
    with_locality = knapformer.plan(ranks, "g1n32")
    without = knapformer.plan(ranks, "g1n32", locality=False)
    assert with_locality["moved_tokens"] < without["moved_tokens"] / 4
    assert with_locality["after"]["max_over_mean"] <= \
        without["after"]["max_over_mean"] * (1 + 0.0005) + 1e-12


def test_auto_takes_the_machine():
    """One long sequence takes a 4-GPU bag on a node of 8 with free links,
    and at most a 2-GPU bag on nodes of 2; the balancer's bag groups are
    every aligned block up to the largest bag, smallest first."""
    lengths = [[8192]] + [[512]] * 7
    fast = {"intra_node_bytes_per_second": 1e20, "inter_node_bytes_per_second": 1e20}
    wide = knapformer.plan(lengths, "auto:max_bag=4", d_model=64, gamma=1.0, machine=fast)
    narrow = knapformer.plan(lengths, "auto:max_bag=4", d_model=64, gamma=1.0,
                             machine=dict(fast, gpus_per_node=2))
    assert "g4n" in wide["topology"], wide["topology"]
    assert "g2n" in narrow["topology"] and "g4n" not in narrow["topology"], narrow["topology"]
    assert narrow["after"]["max_over_mean"] > wide["after"]["max_over_mean"]
    assert knapformer._C.multi_gpu_bags("auto", 8, {"gpus_per_node": 4}) == \
        [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1, 2, 3], [4, 5, 6, 7]]
    assert knapformer._C.multi_gpu_bags("auto:max_bag=2", 4) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("call,kind,text", [
    (lambda: knapformer.plan([[5], [-3]], "g1n2"), ValueError,
     "ranks[1][0]: sequence length -3 is outside [0, 2147483648]"),
    (lambda: knapformer.plan([[5], [3.5]], "g1n2"), ValueError, "ranks[1][0]"),
    (lambda: knapformer.plan([[5], [3], [1]], "g1n2"), ValueError,
     "ranks: 3 ranks is not a multiple of the group size 2 of topology g1n2"),
    (lambda: knapformer.plan([[5]], "g1n1x"), ValueError, "unexpected trailing 'x'"),
    (lambda: knapformer.plan([[5], [3]], "g1n2", rank=2), ValueError,
     "rank: '2' is not a whole number in [0, 1]"),
    (lambda: knapformer.plan([[5], [3]], "g1n2", cost_model="cubic"), ValueError,
     "cost_model: unknown cost model 'cubic'"),
    (lambda: knapformer.plan([[5], [3]], "g1n2", d_model=0), ValueError, "d_model"),
    (lambda: knapformer.plan([[5], [3]], "g1n2", cost_model="measured"), ValueError,
     "measured_attention: the measured cost model needs its table"),
    (lambda: knapformer.plan([[5], [3]], "g1n2", d_model=64, cost_model="measured",
                             cost_table={"d_model": 32, "measured_attention": {}}), ValueError,
     "d_model: 64, but cost_table was measured at d_model 32"),
    (lambda: knapformer.plan([[5], [3]], "g1n2", max_tokens_per_gpu=-1), ValueError,
     "max_tokens_per_gpu: must be >= 0"),
    (lambda: knapformer.plan([[50], [3]], "g1n2", max_tokens_per_gpu=10), RuntimeError,
     "RESOURCE_EXHAUSTED: max_tokens_per_gpu: sequence 0 of rank 0 (50 tokens)"),
    (lambda: knapformer.plan([[5], [object()]], "g1n2"), TypeError, "object is not a sequence"),
    (lambda: knapformer.plan([[5], [3]], "auto", machine={"gpus_per_node": 0}), ValueError,
     "machine.gpus_per_node: 0 is outside [1, 65536]"),
    (lambda: knapformer.plan([[5], [3]], "auto", machine={"nvlink": 1}), ValueError,
     "machine.nvlink: unknown field"),
    (lambda: knapformer._C.multi_gpu_bags("auto", 8, {"gpus_per_node": True}), ValueError,
     "machine.gpus_per_node: needs an int, got True"),
    (lambda: knapformer._C.multi_gpu_bags("auto", 8, {"element_bytes": 2**40}), ValueError,
     "machine.element_bytes: 1099511627776 is not a 32-bit integer"),
    (lambda: knapformer._C.multi_gpu_bags("auto", 8, {"flops_per_second": -1.0}), ValueError,
     "machine.flops_per_second: -1 is outside"),
])
def test_plan_errors_name_the_field(call, kind, text):
    with pytest.raises(kind) as raised:
        call()
    assert text in str(raised.value)


def test_synthetic_lengths_follow_the_papers_streams():
    batch = knapformer.synthetic_lengths("mixed-res", 32, seed=0, step=3)
    assert len(batch) == 32
    assert batch == knapformer.synthetic_lengths("mixed-res", 32, seed=0, step=3)
    assert batch != knapformer.synthetic_lengths("mixed-res", 32, seed=0, step=4)
    # g16b4i256: 4 samples of 256 visual tokens (x0.96..1.04) + 0..392 text tokens.
    assert all(len(r) == 4 and all(245 <= n <= 266 + 392 for n in r) for r in batch[:16])
    # g8b1i2048: one 16384-token image.
    assert all(len(r) == 1 and 15728 <= r[0] <= 17039 + 392 for r in batch[24:])
    with pytest.raises(ValueError, match="must be a positive multiple of the data codes. 32 GPUs"):
        knapformer.synthetic_lengths("mixed-res", 30)
    with pytest.raises(ValueError):
        knapformer.synthetic_lengths("g4b1q256", 4)


def test_synthetic_batch_gives_the_masked_streams_with_their_masks():
    lengths, masks = knapformer.synthetic_batch("llm-packed", 4, seed=1, step=2)
    # Every rank holds 131072 tokens of documents, each causal or windowed.
    assert [sum(rank) for rank in lengths] == [131072] * 4
    assert [len(rank) for rank in masks] == [len(rank) for rank in lengths]
    assert {m if isinstance(m, str) else "window" for rank in masks for m in rank} <= {
        "causal", "window"}
    assert (lengths, masks) == knapformer.synthetic_batch("llm-packed", 4, seed=1, step=2)
    # Block-causal clips: the spans add up to the clip.
    lengths, masks = knapformer.synthetic_batch("video-blockcausal", 2, step=0)
    for rank_lengths, rank_masks in zip(lengths, masks):
        for n, mask in zip(rank_lengths, rank_masks):
            if isinstance(mask, dict) and "spans" in mask:
                assert sum(span for span, _ in mask["spans"]) == n
    # The paper's streams have no masks, and are synthetic_lengths'.
    assert knapformer.synthetic_batch("mixed-res", 32, step=3) == (
        knapformer.synthetic_lengths("mixed-res", 32, step=3), None)
    with pytest.raises(ValueError, match="step: must be >= 0, got -1"):
        knapformer.synthetic_batch("interleaved", 4, step=-1)


def test_a_lengths_file_is_batched_as_the_command_line_batches_it(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("# tokens[,mask]\n4096\n1300,causal\n700\n90,spans=40:c;50:f\n")
    stream = knapformer.LengthsStream(path, 2, samples_per_gpu=2, shuffle=False)
    assert (stream.samples, stream.masked) == (4, 2)
    lengths, masks = stream.batch(0)
    assert lengths == [[4096, 700], [1300, 90]]  # DistributedSampler's shards
    assert masks == [["full", "full"], ["causal", {"spans": [[40, "causal"], [50, "full"]]}]]
    # The masks are plan's own forms: the step plans with them.
    result = knapformer.plan(lengths, "g2n1", d_model=64, attn_masks=masks)
    assert sum(c["length"] for c in result["chunks"]) == 4096 + 700 + 1300 + 90
    path.write_text("4096\n12x\n")
    with pytest.raises(ValueError, match=r"mine.txt:2: tokens: '12x' is not a whole number"):
        knapformer.LengthsStream(path, 2, samples_per_gpu=1)
    path.write_text("4096\n")
    with pytest.raises(ValueError, match="exactly one must be > 0"):
        knapformer.LengthsStream(path, 2)


def test_planner_server_serves_health_and_metrics_and_stops():
    with knapformer.PlannerServer("127.0.0.1:0", metrics="127.0.0.1:0",
                                  rendezvous_timeout_ms=5000, locality=False) as server:
        assert server.running and server.port > 0 and server.metrics_port > 0
        assert server.address == f"127.0.0.1:{server.port}"
        page = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                      timeout=10).read().decode()
        assert "knapformer_planner" in page
    assert not server.running
    with pytest.raises(RuntimeError, match="shut down"):
        server.port
    server.shutdown()  # idempotent


@pytest.mark.parametrize("kwargs,text", [
    ({"bogus_flag": 1}, "--bogus-flag: unknown option"),
    ({"rendezvous_timeout_ms": 0}, "--rendezvous-timeout-ms"),
    ({"locality": "sometimes"}, "--locality: must be on or off"),
    ({"port_file": "/tmp/x"}, "port-file: a setting of the `knapformer serve` process"),
])
def test_planner_server_flags_are_checked(kwargs, text):
    with pytest.raises(ValueError) as raised:
        knapformer.PlannerServer(**kwargs)
    assert text in str(raised.value)


def test_a_taken_port_is_an_error():
    with knapformer.PlannerServer() as first:
        with pytest.raises(RuntimeError, match="UNAVAILABLE"):
            knapformer.PlannerServer(first.address)
