"""What a new user meets first: a rank configured differently fails every
rank at construction, at once, naming the setting, the values and their
ranks (it used to hang the job); require_planner makes a step the service
cannot plan an error, and without it the summary counts the steps planned
locally; an online gamma fit that is not used says why, and the measured
model's table is fitted online from the ranks' times."""
import time

import pytest
import torch
import torch.distributed as dist

from knapformer.launch import run_world

BASE = {"bag_specs": "g1n2+g2n1", "gamma": 0.49, "d_model": 8}

# One setting differs on the last rank: (what the message names, the
# keyword arguments of ranks 0-2, those of rank 3, the values as named).
CASES = {
    "topology": ({}, {"bag_specs": "g1n4"}, "'g1n4' on rank 3 but 'g1n2+g2n1' on ranks 0-2"),
    "d_model": ({}, {"d_model": 16}, "'16' on rank 3 but '8' on ranks 0-2"),
    "gamma": ({}, {"gamma": 1.0}, "'1' on rank 3 but '0.48999999999999999' on ranks 0-2"),
    "cost_model": ({}, {"cost_model": "linear"}, "'linear' on rank 3"),
    "measured_attention": (
        {"cost_model": "measured", "cost_table": {
            "cost_model": "measured", "d_model": 8,
            "measured_attention": {"pairs": [16], "work": [100]}}},
        {"cost_model": "measured", "cost_table": {
            "cost_model": "measured", "d_model": 8,
            "measured_attention": {"pairs": [16], "work": [200]}}},
        "'16:200' on rank 3 but '16:100' on ranks 0-2"),
    "locality": ({}, {"locality": False}, "'off' on rank 3 but 'on' on ranks 0-2"),
    "max_tokens_per_gpu": ({}, {"max_tokens_per_gpu": 512}, "'512' on rank 3"),
    "planner_address": ({}, {"planner_address": "127.0.0.1:1"}, "'127.0.0.1:1' on rank 3"),
    "planner_mode": ({}, {"planner_mode": "per-rank"}, "'per-rank' on rank 3"),
    "require_planner": ({"planner_address": "127.0.0.1:1"},
                        {"planner_address": "127.0.0.1:1", "require_planner": True},
                        "'true' on rank 3 but 'false' on ranks 0-2"),
    "job_id": ({}, {"job_id": "other"}, "'other' on rank 3"),
    "first_step": ({}, {"first_step": 7}, "'7' on rank 3"),
    "machine.gpus_per_node": ({}, {"machine": {"gpus_per_node": 4}}, "'4' on rank 3"),
    "rank_speeds": ({}, {"rank_speeds": "learned"}, "'learned' on rank 3 but 'one speed' on "
                    "ranks 0-2"),
}


def mismatch_world(rank, size, case):
    import knapformer

    common, odd, _ = CASES[case]
    kwargs = dict(BASE, **common)
    if rank == size - 1:
        kwargs.update(odd)
    start = time.monotonic()
    try:
        knapformer.SequenceBalancer(**kwargs)
        return None, time.monotonic() - start
    except RuntimeError as error:
        return str(error), time.monotonic() - start


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_rank_configured_differently_fails_every_rank_at_once(case):
    _, _, named = CASES[case]
    for message, seconds in run_world(mismatch_world, 4, case, group_timeout=30):
        assert message is not None, "no error"
        assert message.startswith("FAILED_PRECONDITION: the ranks' balancer settings differ: "
                                  f"{case} is "), message
        assert named in message, message
        assert seconds < 1.0, seconds


def refused_world(rank, size):
    """One rank's own argument is refused: every rank raises, naming it."""
    import knapformer

    try:
        knapformer.SequenceBalancer("g1n2+g2n1" if rank != 1 else "g1n2+x", d_model=8)
    except ValueError as error:
        return str(error)
    return None


def test_a_rank_whose_arguments_are_refused_fails_every_rank():
    for rank, message in enumerate(run_world(refused_world, 4)):
        assert message is not None
        if rank == 1:
            assert "g1n2+x" in message or "'x'" in message, message
        else:
            assert message.startswith("SequenceBalancer: rank 1 refused its arguments"), message


def unreachable_world(rank, size, require):
    import knapformer

    balancer = knapformer.SequenceBalancer("g1n4", d_model=8, planner_address="127.0.0.1:1",
                                           planner_deadline=2, require_planner=require,
                                           job_id="unreachable")
    outcomes = []
    for step in range(3):
        try:
            balancer.plan_routing([3 + rank, 5])
            summary = balancer.get_routing_plan_summary()
            outcomes.append((summary["source"], summary["local_steps"],
                             summary["local_reason"]))
        except RuntimeError as error:
            outcomes.append(("error", str(error)))
    return outcomes


def test_a_mistyped_address_is_an_error_with_require_planner():
    for outcomes in run_world(unreachable_world, 4, True):
        for step, outcome in enumerate(outcomes):
            assert outcome[0] == "error"
            assert outcome[1].startswith(f"UNAVAILABLE: step {step}: the planner service at "
                                         "127.0.0.1:1 did not plan it"), outcome[1]
            assert "require_planner is set" in outcome[1]


def test_without_require_planner_the_summary_counts_local_steps():
    for outcomes in run_world(unreachable_world, 4, False):
        assert [o[:2] for o in outcomes] == [("local planner", 1), ("local planner", 2),
                                             ("local planner", 3)]
        assert "127.0.0.1:1" in outcomes[0][2], outcomes[0][2]


def no_address_world(rank, size):
    import knapformer

    try:
        knapformer.SequenceBalancer("g1n4", d_model=8, require_planner=True)
    except ValueError as error:
        return str(error)
    return None


def test_require_planner_needs_an_address():
    for message in run_world(no_address_world, 4):
        assert message is not None and "require_planner" in message, message


def planner_on_rank_0(rank):
    """An embedded planner on rank 0 (None elsewhere), and its address on every rank."""
    import knapformer

    server = knapformer.PlannerServer("127.0.0.1:0") if rank == 0 else None
    address = [server.address if server else None]
    dist.broadcast_object_list(address, src=0)
    return server, address[0]


def gamma_world(rank, size):
    import knapformer

    server, address = planner_on_rank_0(rank)
    balancer = knapformer.SequenceBalancer("g1n4", gamma=0.49, d_model=8,
                                           planner_address=address, job_id="gamma-note",
                                           use_fitted_gamma=True, planner_deadline=20)
    notes = []
    for step in range(3):
        balancer.plan_routing([10 + rank, 3 * step + 1])
        balancer.record_compute_seconds(0.01 * (rank + 1))
        summary = balancer.get_routing_plan_summary()
        assert summary["gamma_used"] == 0.49, summary["gamma_used"]
        notes.append(summary["gamma_note"])
    dist.barrier()
    if server:
        server.shutdown(grace=1)
    return notes


def test_an_online_gamma_fit_that_is_not_used_says_why(capfd):
    for notes in run_world(gamma_world, 4):
        assert notes[0] == "no timings of this job yet (record_compute_seconds on every rank)"
        # The service pairs a timing with the work its step's plan gave the
        # rank, which it keeps from the job's first timing on: step 1's
        # timings (4 ranks), sent with step 2, are the first samples.
        assert notes[1] == notes[0]
        assert notes[2].startswith("4 timing samples, the fit needs 16"), notes
    log = capfd.readouterr().err
    assert "rank 0: online gamma fit not used at step 0: no timings of this job yet" in log, log
    assert "rank 0: online gamma fit not used at step 2: 4 timing samples" in log, log
    assert "at step 1:" not in log, log  # logged when the reason changes


def table_world(rank, size):
    import knapformer

    server, address = planner_on_rank_0(rank)
    # gamma 0.5's line as a table; each rank's time is the work its plan gave it.
    table = {"cost_model": "measured", "d_model": 8,
             "measured_attention": {"pairs": [1, 1e6], "work": [0.5 * 32, 0.5 * 32 * 1e6]}}
    balancer = knapformer.SequenceBalancer("g1n2+g2n1", d_model=8, cost_model="measured",
                                           cost_table=table, planner_address=address,
                                           job_id="table-fit", use_fitted_gamma=True,
                                           planner_deadline=20)
    notes, tables = [], []
    for step in range(12):
        balancer.plan_routing([10 + rank, 3 * step + 1, 7 * (step % 5) + rank + 2])
        summary = balancer.get_routing_plan_summary()
        balancer.record_compute_seconds(1e-9 * summary["workload_after"][rank])
        notes.append(summary["gamma_note"])
        tables.append(summary["fitted_cost_table"])
    dist.barrier()
    if server:
        server.shutdown(grace=1)
    # The fitted table starts the next run as any cost_table does.
    again = knapformer.SequenceBalancer("g1n2+g2n1", d_model=8, cost_model="measured",
                                        cost_table=tables[-1], job_id="table-again")
    again.plan_routing([10 + rank, 5])
    return notes, tables


def test_the_measured_models_table_is_fitted_online_from_the_ranks_times(capfd):
    for notes, tables in run_world(table_world, 4):
        assert notes[0].startswith("no timed steps of this job for its table yet"), notes
        assert tables[0] is None
        assert notes[-1] == "", notes  # planned with the table fitted from the times
        fitted = tables[-1]
        assert fitted["cost_model"] == "measured" and fitted["d_model"] == 8, fitted
        pairs, work = fitted["measured_attention"]["pairs"], fitted["measured_attention"]["work"]
        assert len(pairs) == len(work) > 1 and pairs == sorted(pairs), fitted
    log = capfd.readouterr().err
    assert "rank 0: online table fit not used at step 0: no timed steps" in log, log
    assert "is planned with the service's fitted attention table" in log, log


def auto_world(rank, size, machine):
    import knapformer

    balancer = knapformer.SequenceBalancer("auto", gamma=1.0, d_model=64,
                                           **({"machine": machine} if machine else {}))
    layouts = []
    for _ in range(2):
        balancer.plan_routing([[1024], [64, 64], [64], [64]][rank])
        layouts.append(balancer.get_routing_plan_summary()["layout"])
    return layouts


def test_auto_says_when_the_machine_it_assumes_keeps_every_gpu_alone(capfd):
    # On the H100 node assumed without machine=, Ulysses for a 1024-token
    # sequence at width 64 costs more than it saves: one-GPU bags, and rank
    # 0 says once which machine it priced and what to pass instead.
    assert run_world(auto_world, 4, None) == [["g1n4", "g1n4"]] * 4
    log = capfd.readouterr().err
    assert log.count("auto kept every GPU in a one-GPU bag") == 1, log
    assert "step 0: auto kept every GPU in a one-GPU bag (g1n4), pricing Ulysses on the " \
        "machine it assumes without machine=: 989.4 TFLOP/s, 450 GB/s within a node of 8 " \
        "(an H100 node)" in log, log
    assert 'pass machine={"flops_per_second": <this device\'s rate>}' in log, log
    # With a CPU's rate the same step takes a bag of 4, and nothing is said.
    assert run_world(auto_world, 4, {"flops_per_second": 1e9}) == [["g4n1", "g4n1"]] * 4
    assert "auto kept" not in capfd.readouterr().err
