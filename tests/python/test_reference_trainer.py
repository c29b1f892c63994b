"""A trainer written against the reference implementation's API
(reference_trainer.py) runs unchanged on 8 Gloo processes, balanced results
equal unbalanced ones, and what it tracked equals the plan summaries."""
import json
import math
import os
import subprocess
import sys

import pytest

from knapformer._torch_compat import default_tcp_store_works

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(HERE, "reference_trainer.py")
RANKS = 8


def launcher():
    """torchrun, or knapformer.launch where torchrun cannot start (a torch
    whose TCPStore has no libuv, as Debian's 2.6)."""
    if default_tcp_store_works():
        return ["-m", "torch.distributed.run", "--nproc_per_node", str(RANKS),
                "--redirects", "1", "--tee", "1", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", "127.0.0.1:0"]
    return ["-m", "knapformer.launch", "--nproc_per_node", str(RANKS)]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference_trainer")
    result = subprocess.run([sys.executable, *launcher(), TRAINER, "--out", str(out)],
                            cwd=out, capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    ranks = [json.load(open(out / f"rank{r}.json")) for r in range(RANKS)]
    return log, ranks, out


def test_balanced_steps_equal_unbalanced_on_every_rank(run):
    log, _, _ = run
    for rank in range(RANKS):
        assert f"rank {rank}: outputs and gradients agree" in log


def test_tracked_figures_equal_the_summaries(run):
    _, ranks, _ = run
    for rank, result in enumerate(ranks):
        tracked, summaries = result["tracked"], result["summaries"]
        assert len(summaries) == 3 and all(len(v) == 3 for v in tracked.values())
        for i, summary in enumerate(summaries):
            before = summary["workload_before"]
            assert tracked["tracked_per_gpu_capacity"][i] == pytest.approx(
                sum(before) / len(before) / 1e12, rel=1e-12)
            assert tracked["tracked_original_imbalance_ratio"][i] == pytest.approx(
                summary["wir_before"], rel=1e-12)
            assert tracked["tracked_balanced_imbalance_ratio"][i] == pytest.approx(
                summary["wir_after"], rel=1e-12)
            d = summary["d_model"]
            # tflops_estimator with num_layers=2, include_bwd=True (4x forward).
            tflops = sum((24 * n * d * d + 4 * n * n * d) * 2 * 4 / 1e12
                         for n in summary["seq_id2seq_len"].values())
            assert tracked["tracked_tflops"][i] == pytest.approx(tflops, rel=1e-12)
            # Balancing helped: the ratio after is below the one before.
            assert summary["wir_after"] < summary["wir_before"]
        assert result["balance_gpu_ids"] == list(range(RANKS))


def test_summaries_carry_the_reference_keys_consistently(run):
    _, ranks, _ = run
    for result in ranks:
        for summary in result["summaries"]:
            chunk_len = {int(c): n for c, n in summary["balance_chunk_id2chunk_len"].items()}
            seq_len = {int(s): n for s, n in summary["seq_id2seq_len"].items()}
            # Every sequence's chunks cover it exactly.
            covered = {}
            for chunk, seq in summary["chunk_id2seq_id"].items():
                covered[seq] = covered.get(seq, 0) + chunk_len[int(chunk)]
            assert {s: covered.get(s, 0) for s in seq_len} == seq_len
            # The chunks a rank computes are its chunk_lens, in chunk id order.
            rank = summary["rank"]
            mine = [int(c) for c, gpu in summary["balance_chunk_id2gpu_id"].items()
                    if gpu == rank]
            assert mine == sorted(mine)
            assert [chunk_len[c] for c in mine] == summary["chunk_lens"]
            assert summary["gpu_id2seq_lens"][str(rank)] == summary["seq_lens"]
            # The whole chunk table (ours) agrees with the reference's view.
            assert len(summary["chunks"]) == len(summary["chunk_id2seq_id"])
            assert sum(c["length"] for c in summary["chunks"]) == summary["total_tokens"]


def test_the_fitted_gamma_went_to_the_balancer(run):
    _, ranks, _ = run
    fit = ranks[0]["fit"]
    assert fit["gamma"] > 0 and fit["k"] > 0
    for result in ranks:
        assert result["fit"] == fit
        for summary in result["summaries"]:
            assert summary["gamma"] == pytest.approx(fit["gamma"], rel=1e-12)
    # Predicted seconds grow with the length, faster than linearly.
    predicted, lengths = fit["predicted"], fit["lengths"]
    assert all(a < b for a, b in zip(predicted, predicted[1:]))
    assert predicted[-1] / predicted[0] > lengths[-1] / lengths[0]


def test_tracking_printing_and_the_saved_summary(run):
    log, _, out = run
    for name in ("Per GPU Capacity", "Original Imbalance Ratio", "Balanced Imbalance Ratio"):
        line = next(l for l in log.splitlines() if l.startswith(f"{name}: ")
                    or f"]:{name}: " in l or f": {name}: " in l)
        mean = float(line.split(f"{name}: ")[1].split(",")[0])
        assert math.isfinite(mean) and mean > 0, line
    assert "max/min workload ratio:" in log
    assert "Rank 0 chunk_id2seq_id: {" in log
    saved = json.load(open(out / "routing_plan.json"))
    assert {"chunk_id2seq_id", "balance_chunk_id2gpu_id", "gpu_id2seq_ids",
            "seq_id2seq_len", "balance_chunk_id2chunk_len"} <= set(saved)
    assert "visualized" in log
