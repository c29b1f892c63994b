"""knapformer replay on CPU at small widths: every paper scenario, every
masked stream and a user's lengths file run over simulated GPUs, and its
bookkeeping holds: the tokens and attended pairs it plays on each GPU are
the plan's (their cost is the plan's per-GPU workload), the balanced and
unbalanced plays cover the same tokens, and its figures are the ratios of
what it timed. Plans by the measured cost model (fitted here, or a table
given) are played and checked the same way. Also the fused varlen path,
the advice line and scripts/replay_paper_table.sh."""
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile

import pytest

from knapformer import replay
from knapformer.launch import run_world


# Where the runs that fit a measured table write it (not the runfiles).
TABLES = tempfile.mkdtemp()


def run(argv):
    out = io.StringIO()
    table = [] if "--json" in argv else ["--table-out", os.path.join(TABLES, "table.json")]
    results = replay.replay(replay.parse_args(argv + ["--repeat", "1", "--d-model", "32",
                                                      "--heads", "8"] + table), out)
    return results, out.getvalue()


def check_bookkeeping(results, lengths_of_step):
    for row in results:
        for step, s in enumerate(row["steps"]):
            total = sum(sum(rank) for rank in lengths_of_step(step))
            # Every token is played once, balanced as unbalanced.
            assert sum(s["tokens"]) == total, (row["topology"], step)
            # What each GPU plays costs what the plan says it costs.
            for played, planned in zip(s["played_workload"], s["predicted_workload"]):
                assert math.isclose(played, planned, rel_tol=1e-9), (row["topology"], step)
            assert s["measured_max_over_mean"] >= 1.0
        assert math.isclose(row["speedup"], row["slowest_before"] / row["slowest_after"])


# The masked streams' sequences are up to 128k tokens: divided by 256 on CPU.
@pytest.mark.torch_independent
@pytest.mark.parametrize("data,world,scale", [
    ("mixed-res", 8, 32), ("low-res", 8, 32), ("joint", 32, 32), ("video-blockcausal", 8, 256),
    ("interleaved", 8, 256), ("llm-packed", 8, 256)])
def test_every_scenario_plays_what_the_plan_says(data, world, scale):
    args = ["--data", data, "--world", str(world), "--steps", "1", "--length-scale", str(scale),
            "--gamma", "1.0", "--topology", f"g1n{world},g2n{world // 2},auto",
            "--cost-model", "transformer"]
    results, text = run(args)
    data_of = replay.Data(replay.parse_args(args))
    check_bookkeeping(results, lambda step: data_of.step(step)[0])
    assert [r["topology"] for r in results] == [f"g1n{world}", f"g2n{world // 2}", "auto"]
    assert "slowest unbal." in text and "miss" in text
    assert "\nadvice: --topology " in text


# The default topologies follow --world: at 2 GPUs, the layouts that fit.
@pytest.mark.torch_independent
def test_the_default_topologies_follow_the_world():
    results, _ = run(["--data", "llm-packed", "--world", "2", "--steps", "1", "--length-scale", "256",
                      "--gamma", "1.0", "--cost-model", "transformer"])
    assert [r["topology"] for r in results] == ["g1n2", "g2n1", "auto"]


@pytest.mark.torch_independent
def test_a_lengths_file_with_masks_plays_its_masks(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("# tokens[,mask]\n" + "".join(
        f"{64 + 37 * i % 700}{',causal' if i % 3 == 0 else ''}\n" for i in range(40)) +
        "512,spans=128:c;384:f\n")
    args = ["--lengths", str(path), "--samples-per-gpu", "2", "--world", "8", "--steps", "2",
            "--topology", "g1n8,g4n2", "--gamma", "0.8", "--json", str(tmp_path / "r.json")]
    results, text = run(args)
    data_of = replay.Data(replay.parse_args(args))
    # Both cost models by default: the measured one's table fitted here
    # prices the masked shares by their pairs as the plan did.
    assert [(r["topology"], r["cost_model"]) for r in results] == [
        ("g1n8", "transformer"), ("g1n8", "measured"), ("g4n2", "transformer"),
        ("g4n2", "measured")]
    # The table fitted here is written beside the report, for cost_table=.
    assert "measured table of" in text and f"(fitted here, in {tmp_path / 'r.cost_table.json'})" \
        in text
    assert json.loads((tmp_path / "r.cost_table.json").read_text()) == \
        json.loads((tmp_path / "r.json").read_text())["cost_table"]
    check_bookkeeping(results, lambda step: data_of.step(step)[0])
    table = json.loads((tmp_path / "r.json").read_text())["cost_table"]
    assert table["cost_model"] == "measured" and table["d_model"] == 32
    # The table given back is planned by as it is, and no fit runs.
    (tmp_path / "table.json").write_text(json.dumps(table))
    again, text = run(args[:-2] + ["--cost-model", "measured", "--cost-table",
                                   str(tmp_path / "table.json")])
    assert f"(--cost-table {tmp_path / 'table.json'})" in text and "gamma 0.8 (given)" in text
    for first, second in zip([r for r in results if r["cost_model"] == "measured"], again):
        assert [s["predicted_workload"] for s in first["steps"]] == \
            [s["predicted_workload"] for s in second["steps"]]
    # A causal sequence plays about half the pairs of a full one.
    assert replay.attended_pairs(100, "causal") == 5050


@pytest.mark.torch_independent
def test_the_picture(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "replay.png"
    run(["--data", "mixed-res", "--world", "8", "--steps", "1", "--length-scale", "32",
         "--gamma", "1", "--topology", "g1n8,g4n2", "--png", str(png)])
    assert png.stat().st_size > 1000


@pytest.mark.torch_independent
# A slowed simulated GPU: its played times are divided by its fraction, each
# row is planned by FLOPs and by speed (the bookkeeping holds for both), the
# plan by speed gives that GPU fewer tokens, and the advice is of the rows
# planned by speed, with the speeds in the trainer's call.
@pytest.mark.torch_independent
def test_a_slowed_gpu_is_planned_around_by_speed():
    args = ["--data", "low-res", "--world", "8", "--steps", "1", "--length-scale", "32",
            "--gamma", "1.0", "--topology", "g1n8", "--cost-model", "transformer",
            "--slow-rank", "3:0.5"]
    results, text = run(args)
    data_of = replay.Data(replay.parse_args(args))
    check_bookkeeping(results, lambda step: data_of.step(step)[0])
    assert [(r["topology"], r["planned_by"]) for r in results] == [("g1n8", "FLOPs"),
                                                                     ("g1n8", "speed")]
    flops, speed = (r["steps"][0] for r in results)
    others = [t for g, t in enumerate(speed["tokens"]) if g != 3]
    assert speed["tokens"][3] < 0.7 * min(others), speed["tokens"]
    assert flops["tokens"][3] > 0.8 * min(t for g, t in enumerate(flops["tokens"]) if g != 3)
    # The slowed GPU's unbalanced time is its own, doubled: the same in both rows.
    assert flops["seconds_before"] == speed["seconds_before"]
    assert "planned by" in text and "--slow-rank 3:0.5: that GPU's played times" in text
    assert "rank_speeds=[1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0]" in text, text
    with pytest.raises(replay.ReplayError, match="--slow-rank: GPU 8 is outside"):
        run(args[:-1] + ["8:0.5"])
    with pytest.raises(replay.ReplayError, match="--slow-rank: '3' is not R:F"):
        run(args[:-1] + ["3"])


def test_the_fit_hfu_and_the_cli_errors(tmp_path):
    # gamma given: k alone is fitted, for the measured table and auto's rate
    # (at d_model 32 a loaded machine's times can defeat the two-term fit,
    # which tests/planner:calibration_test covers).
    results, text = run(["--data", "mixed-res", "--world", "8", "--steps", "1",
                         "--length-scale", "32", "--topology", "g4n2", "--tflops", "0.01",
                         "--gamma", "1.0"])
    assert "gamma 1 (given)" in text and "auto prices links against" in text
    # HFU: the FLOPs the plays ran (3 passes) over 8 GPUs' peak for the slowest one's time.
    row = results[0]
    s = row["steps"][0]
    flops = 3 * sum(24 * t * 32 ** 2 + 4 * p * 32 for t, p in zip(s["tokens"], s["pairs"]))
    assert math.isclose(row["hfu"], flops / (8 * row["slowest_after"] * 0.01e12))
    with pytest.raises(replay.ReplayError, match="--cost-table: .* was measured at d_model 64, "
                                                 "the block has 32"):
        bad = tmp_path / "t.json"
        bad.write_text('{"cost_model": "measured", "d_model": 64}')
        run(["--cost-table", str(bad)])
    with pytest.raises(replay.ReplayError, match="--length-scale: must be >= 1, got 0"):
        run(["--length-scale", "0"])
    with pytest.raises(replay.ReplayError, match="--world 6: the data's 32 GPUs"):
        run(["--world", "6", "--steps", "1"])
    with pytest.raises(replay.ReplayError, match="give --samples-per-gpu N or --tokens-per-gpu"):
        run(["--lengths", "x.txt"])
    with pytest.raises(replay.ReplayError, match="splits the heads unevenly"):
        replay.Block(32, 8, replay.torch.device("cpu"), replay.torch.float32).attention(
            [(4, None)], 1 / 16)


def test_the_varlen_path_attends_each_sequence_alone():
    torch = replay.torch
    if not replay.varlen_available():  # torch 1.13: one call per sequence only
        with pytest.raises(replay.ReplayError, match="--attention varlen: torch .* has no SDPA"):
            run(["--attention", "varlen", "--steps", "1"])
        assert "attention per sequence" in run(
            ["--data", "mixed-res", "--world", "8", "--steps", "1", "--length-scale", "64",
             "--gamma", "1", "--topology", "g1n8", "--cost-model", "transformer"])[1]
        return
    # One fused call over packed sequences gives each sequence's own
    # attention, and its gradients, as per-sequence calls do.
    torch.manual_seed(0)
    lengths = [5, 1, 17, 3]
    offsets = torch.tensor([0, 5, 6, 23, 26])
    q, k, v = (torch.randn(26, 4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    packed = replay.varlen_sdpa(q, k, v, offsets)
    packed.sum().backward()
    for i, n in enumerate(lengths):
        rows = slice(offsets[i], offsets[i + 1])
        qi, ki, vi = (t.detach()[rows].transpose(0, 1).clone().requires_grad_() for t in (q, k, v))
        alone = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi)
        alone.sum().backward()
        assert torch.allclose(packed[rows], alone.transpose(0, 1), atol=1e-12), n
        assert torch.allclose(q.grad[rows], qi.grad.transpose(0, 1), atol=1e-12), n
    # A replay on it plays what the plan says, masked sequences one by one.
    results, text = run(["--data", "interleaved", "--world", "8", "--steps", "1",
                         "--length-scale", "256", "--gamma", "1", "--topology", "g2n4",
                         "--cost-model", "transformer", "--attention", "varlen"])
    assert "attention varlen (masked: per sequence)" in text
    check_bookkeeping(results, lambda step: replay.Data(replay.parse_args(
        ["--data", "interleaved", "--world", "8", "--length-scale", "256"])).step(step)[0])


@pytest.mark.torch_independent
def test_the_advice_names_the_fastest_and_prefers_auto_within_one_percent():
    def row(topology, model, after, comm=0.0, before=2.0):
        return {"topology": topology, "cost_model": model, "slowest_after": after,
                "comm_model_seconds": comm, "slowest_before": before}
    line = replay.advice([row("g1n8", "transformer", 1.0), row("g2n4", "transformer", 0.8, 0.1),
                          row("auto", "transformer", 0.905)])
    assert line.startswith("advice: --topology auto: 905ms per block")
    assert "2.21x faster than without balancing (2e+03ms)" in line
    assert "(within 1% of g2n4, and it adapts to the data); g1n8 would be 1.10x slower" in line
    # Communication counts; with both models the line names the one to use.
    line = replay.advice([row("g1n8", "transformer", 1.0), row("g4n2", "measured", 0.5, 0.6),
                          row("g1n8", "measured", 0.99)])
    assert line.startswith("advice: --topology g1n8 --cost-model measured: 990ms")
    assert line.endswith("; g4n2 would be 1.11x slower")
    # Nothing named slower when none is 5% slower.
    assert "would be" not in replay.advice([row("g1n8", "transformer", 1.0),
                                            row("g2n4", "transformer", 1.04)])


@pytest.mark.torch_independent
def test_the_paper_table_script_runs_on_cpu_and_keeps_its_budget(tmp_path):
    # scripts/replay_paper_table.sh, what a GPU machine runs for
    # docs/planner.md's table, here with CPU widths in place of FLUX's and
    # without the install and the GPU check (it needs a GPU).
    def table(budget, out):
        return subprocess.run(
            ["bash", "scripts/replay_paper_table.sh", "--out", str(out), "--no-install",
             "--skip-check", "--python", sys.executable, "--budget-s", str(budget), "--steps",
             "1", "--topology", "g1n32,g8n4", "--", "--device", "cpu", "--d-model", "32",
             "--heads", "8", "--length-scale", "128", "--gamma", "1", "--cost-model",
             "transformer", "--repeat", "1"], capture_output=True, text=True, timeout=600)
    done = table(600, tmp_path / "done")
    assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "done" / "table.md").read_text()
    assert text.startswith("Measured on cpu (")
    for scenario in ("low-res", "mixed-res", "joint"):
        for topology in ("g1n32", "g8n4"):
            assert f"| {scenario} | {topology} | transformer | " in text
        assert "advice: --topology " in (tmp_path / "done" / f"replay-{scenario}.txt").read_text()
    # A budget too small for any scenario: none runs, each says why, exit 1.
    spent = table(9, tmp_path / "spent")
    assert spent.returncode == 1, spent.stdout + spent.stderr
    assert "| joint | (not finished: replay-joint.txt) |" in (
        tmp_path / "spent" / "table.md").read_text()
    assert "not run, the budget is spent" in (tmp_path / "spent" / "replay-joint.txt").read_text()


def plan_with_the_advised_call(rank, size, call, folder, lengths, masks, d_model):
    import json  # the call's cost_table=json.load(...)

    from knapformer import SequenceBalancer
    os.chdir(folder)
    balancer = eval(call, {"SequenceBalancer": SequenceBalancer, "json": json})
    balancer.plan_routing(lengths[rank], token_dim=d_model,
                          attn_masks=masks[rank] if masks else None)
    summary = balancer.get_routing_plan_summary()
    return summary["layout"], summary["workload_after"]


def test_the_advice_pasted_into_the_trainer_plans_as_the_replay_did(tmp_path):
    """The call the advice line ends with, pasted into a 4-process trainer
    on the replay's first step, plans the advised layout with the replay's
    workloads: its gamma, the machine auto priced links by (this CPU's
    measured rate, 2 GPUs per node) and, for the measured model, the table
    fitted here and written beside the report."""
    lengths = tmp_path / "mine.txt"
    lengths.write_text("".join(f"{64 + 97 * i % 900}{',causal' if i % 4 == 0 else ''}\n"
                               for i in range(40)))
    args = ["--lengths", str(lengths), "--samples-per-gpu", "3", "--world", "4", "--steps", "1",
            "--length-scale", "2", "--gpus-per-node", "2", "--topology", "g1n4,g2n2,auto",
            "--gamma", "0.7", "--json", str(tmp_path / "r.json")]
    results, text = run(args)
    advice = text.strip().splitlines()[-1]
    call = advice[advice.index("SequenceBalancer("):]
    assert "machine={'flops_per_second': " in call and "'gpus_per_node': 2}" in call, call
    assert "gamma=0.7, " in call, call  # given (k alone is fitted: a loaded
    # machine's times at d_model 32 can defeat the two-term fit)
    topology = re.match(r'SequenceBalancer\("([^"]+)"', call).group(1)
    model = "measured" if 'cost_model="measured"' in call else "transformer"
    row = next(r for r in results if r["topology"] == topology and r["cost_model"] == model)
    step_lengths, step_masks = replay.Data(replay.parse_args(args)).step(0)
    got = run_world(plan_with_the_advised_call, 4, call, str(tmp_path), step_lengths,
                    step_masks, 32)
    for layout, workload in got:
        assert layout == row["steps"][0]["layout"], (call, layout)
        assert workload == pytest.approx(row["steps"][0]["predicted_workload"], rel=1e-9)
    # Every row's call plans as its row did: the measured one loads the table.
    measured = next(r for r in results if r["topology"] == "auto" and
                    r["cost_model"] == "measured")
    table = str(tmp_path / "r.cost_table.json")
    call = (f"SequenceBalancer(\"auto\", {call[call.index('gamma='):call.index('}') + 1]}, "
            f"cost_model=\"measured\", cost_table=json.load(open({table!r})))")
    for layout, workload in run_world(plan_with_the_advised_call, 4, call, str(tmp_path),
                                      step_lengths, step_masks, 32):
        assert layout == measured["steps"][0]["layout"], (call, layout)
        assert workload == pytest.approx(measured["steps"][0]["predicted_workload"], rel=1e-9)
