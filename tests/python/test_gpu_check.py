"""python -m knapformer.gpu_check on a machine without a GPU: its arguments
(exit 2 naming the option), --dry-run (no GPU said plainly, the JSON with
every check SKIP), the no-GPU exit 3, the report (table, JSON, exit status)
from given results, the host-sync and launch counters on made-up profiler
events, sync_debug naming the call that synchronised, hub_layout's 8 ranks in
one process (and a misrouted token it must catch), the --device cpu
self-test on 4 Gloo processes (python_step exact, route_vs_all_to_all,
copy_bandwidth and exchange_cost figures, fsdp2_checkpoint and compiled_block PASS or SKIP
with the reason this torch gives, a killed rank raising on every survivor,
the CUDA-only checks SKIP), injected faults that python_step and
compiled_block must catch (exit 1), a hung check reported as such within its
bound, and the CUDA-only
checks' own code run on CPU tensors with torch.cuda's streams and events
stubbed and a Gloo stand-in for the raw NCCL transport, sound and with flaws
the checks must report."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
import torch.distributed as dist

import knapformer
from knapformer import gpu_check
from knapformer.gpu_check.fsdp_checks import compile_missing, fsdp2_missing
from knapformer.launch import run_world

CLI_TIMEOUT_S = 600


def run_cli(args, tmp_path, env=None, timeout=120):
    """The command as a user runs it; its process group is killed if it overstays."""
    full_env = dict(os.environ)
    full_env.pop(gpu_check.FAULT_ENV, None)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):  # not under torchrun here
        full_env.pop(name, None)
    full_env.update(env or {})
    process = subprocess.Popen([sys.executable, "-m", "knapformer.gpu_check", *args],
                               cwd=tmp_path, env=full_env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the command and the worlds it spawned
        out, err = process.communicate()
        pytest.fail(f"gpu_check {args} did not finish within {timeout} s:\n{out}\n{err}")
    return process.returncode, out, err


def no_gpu_here():
    return not torch.cuda.is_available()


# The checks that need more of torch than the rest, and whether this one has it.
TORCH_NEEDS = {"fsdp2_checkpoint": fsdp2_missing(), "compiled_block": compile_missing()}


@pytest.mark.torch_independent
@pytest.mark.parametrize("args,option", [
    (["--device", "cpu", "--ranks", "0"], "--ranks"),
    (["--ranks", "2"], "--ranks"),  # only with --device cpu
    (["--device", "tpu"], "--device"),
    (["--sizes-mb", "1,x"], "--sizes-mb"),
    (["--sizes-mb", "0"], "--sizes-mb"),
    (["--repeats", "0"], "--repeats"),
    (["--timeout-s", "-1"], "--timeout-s"),
    (["--kill-timeout-s", "nan"], "--kill-timeout-s"),
    (["--copy-mb", "lots"], "--copy-mb"),
    (["--skip", "python_step,warp_drive"], "--skip"),
    (["--no-such-option"], "--no-such-option"),
])
def test_bad_arguments_exit_2_naming_the_option(args, option, tmp_path):
    status, out, err = run_cli(args, tmp_path)
    assert status == 2, (status, out, err)
    assert option in err, err
    assert not (tmp_path / "gpu_check.json").exists()


@pytest.mark.torch_independent
def test_an_unknown_fault_is_refused(tmp_path):
    status, _, err = run_cli(["--dry-run"], tmp_path, env={gpu_check.FAULT_ENV: "melt"})
    assert status == 2 and gpu_check.FAULT_ENV in err and "corrupt_route" in err, err


def test_skip_reasons_follow_the_machine():
    opts = gpu_check.parse_options([])
    one = gpu_check.skip_reasons(opts, gpus=1, world_size=1, transport_built=False)
    assert one["nccl_group"] is None and one["python_step"] is None
    assert "nccl_transport_available" in one["raw_nccl"]
    assert "2 or more ranks" in one["route_vs_all_to_all"]
    assert "found 1" in one["killed_rank"]
    assert {n: one[n] for n in TORCH_NEEDS} == TORCH_NEEDS
    two = gpu_check.skip_reasons(opts, gpus=2, world_size=2, transport_built=True)
    assert {n: r for n, r in two.items() if r is not None} == \
        {n: r for n, r in TORCH_NEEDS.items() if r is not None}, two
    cpu = gpu_check.skip_reasons(gpu_check.parse_options(["--device", "cpu",
                                                          "--skip", "killed_rank"]),
                                 gpus=0, world_size=1, transport_built=False)
    assert [n for n, r in cpu.items() if r is None] == \
        ["python_step", "exchange_cost", "copy_bandwidth", "hub_layout", "route_vs_all_to_all"] + \
        [n for n, r in TORCH_NEEDS.items() if r is None]
    assert cpu["killed_rank"] == "skipped (--skip)"
    assert all("CUDA only" in cpu[n] for n in gpu_check.CUDA_ONLY)


@pytest.mark.skipif(not no_gpu_here(), reason="this machine has a GPU")
def test_dry_run_without_a_gpu_says_so_and_writes_every_check_skip(tmp_path):
    status, out, err = run_cli(["--dry-run", "--json", "report.json"], tmp_path)
    assert status == 0, (out, err)
    assert f"no GPU: torch {torch.__version__} (" in out, out
    assert ("CPU build" in out) if torch.version.cuda is None else ("no device visible" in out)
    assert "would run: nothing" in out
    document = json.loads((tmp_path / "report.json").read_text())
    assert [c["name"] for c in document["checks"]] == list(gpu_check.CHECKS)
    assert {c["verdict"] for c in document["checks"]} == {"SKIP"}
    assert all("no GPU" in c["detail"] for c in document["checks"])
    header = document["header"]
    assert header["torch"] == torch.__version__ and header["torch_cuda"] == torch.version.cuda
    assert isinstance(header["build_info"], dict) and document["exit_status"] == 0

    # What the CPU self-test would run, without running it.
    status, out, _ = run_cli(["--dry-run", "--device", "cpu", "--ranks", "3"], tmp_path)
    assert status == 0 and "3 CPU processes" in out
    runs = ["python_step", "exchange_cost", "copy_bandwidth", "hub_layout",
            "route_vs_all_to_all"] + \
        [n for n, r in TORCH_NEEDS.items() if r is None] + ["killed_rank"]
    assert f"would run: {', '.join(runs)}" in out, out
    for name, reason in TORCH_NEEDS.items():  # both listed: to run, or skipped and why
        if reason is not None:
            assert f"would skip {name}: {reason}" in out, out
    document = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {c["verdict"] for c in document["checks"]} == {"SKIP"}
    assert [c["name"] for c in document["checks"]] == list(gpu_check.CHECKS)
    for name, reason in TORCH_NEEDS.items():
        detail = document["checks"][gpu_check.CHECKS.index(name)]["detail"]
        assert detail == ("--dry-run: would run" if reason is None else
                          f"--dry-run; would be skipped: {reason}"), detail


@pytest.mark.skipif(not no_gpu_here(), reason="this machine has a GPU")
def test_without_a_gpu_nothing_is_checked_and_the_exit_is_3(tmp_path):
    status, out, err = run_cli([], tmp_path)
    assert status == 3, (status, out, err)
    assert "no GPU found, nothing was checked" in err
    assert f"torch {torch.__version__}" in err
    assert ("torch.version.cuda is None" in err) if torch.version.cuda is None \
        else ("no device visible" in err)


def sample_rows():
    rows = [gpu_check.result("nccl_group", "PASS", "fine", {"init_s": 1.25}),
            gpu_check.result("host_syncs", "INFO", "2 per step", {"syncs_per_step": 2.0}),
            gpu_check.result("raw_nccl", "SKIP", "no transport in this build"),
            gpu_check.merge_ranks("python_step", {
                0: gpu_check.result("python_step", "PASS", "exact", {"max_rel_diff": 0.0}),
                1: gpu_check.result("python_step", "FAIL", "output differs by 3",
                                    {"max_rel_diff": float("inf")})})]
    header = gpu_check.report_header("a test", 2, ["cuda:0 Imaginary GPU"], None, ["--x"])
    return header, rows


def test_the_report_of_results_with_a_fail_exits_1(tmp_path):
    header, rows = sample_rows()
    text = gpu_check.render_report(header, rows)
    lines = text.splitlines()
    assert lines[0] == "knapformer gpu_check: a test"
    assert "cuda:0 Imaginary GPU" in text and f"torch:      {torch.__version__}" in text
    row = {line.split()[0]: line for line in lines if line.split()[:1] and
           line.split()[0] in gpu_check.CHECKS}
    assert row["nccl_group"].split()[1:3] == ["PASS", "init_s=1.25"]
    assert row["host_syncs"].split()[1] == "INFO" and "syncs_per_step=2" in row["host_syncs"]
    assert row["python_step"].split()[1] == "FAIL"
    assert "rank 1: output differs by 3" in row["python_step"]
    assert "4 checks: 1 PASS, 1 FAIL, 1 INFO, 1 SKIP; exit status 1" in text
    assert "FAIL python_step: rank 1: output differs by 3" in text
    assert gpu_check.exit_status(rows) == 1
    assert gpu_check.exit_status([r for r in rows if r["verdict"] != "FAIL"]) == 0

    path = tmp_path / "out.json"
    gpu_check.write_json(str(path), header, rows, 1)
    document = json.loads(path.read_text())  # strict JSON: no Infinity
    assert document["exit_status"] == 1 and document["counts"]["FAIL"] == 1
    step = document["checks"][3]
    assert step["ranks"]["0"]["verdict"] == "PASS" and step["ranks"]["1"]["verdict"] == "FAIL"
    assert step["figures"]["max_rel_diff"] == "inf"
    assert document["header"]["devices"] == ["cuda:0 Imaginary GPU"]


def test_merging_ranks_takes_the_worst_verdict():
    result = gpu_check.result
    merged = gpu_check.merge_ranks("c", {0: result("c", "INFO", "a", {"x": 1}),
                                         1: result("c", "INFO", "b", {"x": 2})})
    assert (merged["verdict"], merged["detail"], merged["figures"]) == ("INFO", "a", {"x": 1})
    merged = gpu_check.merge_ranks("c", {0: result("c", "INFO", "a"),
                                         1: result("c", "SKIP", "no profiler")})
    assert (merged["verdict"], merged["detail"]) == ("SKIP", "rank 1: no profiler")
    merged = gpu_check.merge_ranks("c", {0: result("c", "PASS", "ok"), 1: "rank 1 hung",
                                         2: result("c", "FAIL", "bad")})
    assert merged["verdict"] == "FAIL" and merged["detail"] == "rank 1: rank 1 hung (also rank 2)"
    assert gpu_check.exit_status([merged]) == 1


class Event:
    def __init__(self, name, start, end, device_type=None):
        self.name = name
        self.time_range = types.SimpleNamespace(start=start, end=end)
        self.device_type = device_type


def test_host_syncs_are_counted_inside_each_call():
    events = [Event("route", 0, 100), Event("route", 5, 6, device_type="DeviceType.CUDA"),
              Event("backward", 200, 300),
              Event("cudaStreamSynchronize", 10, 11), Event("cudaMemcpy_v3020", 20, 21),
              Event("cudaMemcpyAsync", 30, 31), Event("cudaLaunchKernel", 40, 41),
              Event("cudaEventSynchronize", 250, 251), Event("cudaDeviceSynchronize", 150, 151)]
    counts, saw_runtime, ranges = gpu_check.count_host_syncs(events)
    assert saw_runtime and ranges == 2  # the GPU-side copy of a label is not a range
    assert counts["route"] == {"cudaStreamSynchronize": 1, "cudaDeviceSynchronize": 0,
                               "cudaEventSynchronize": 0, "cudaMemcpy": 1}
    assert sum(counts["backward"].values()) == 1 and counts["backward"]["cudaEventSynchronize"]
    assert sum(sum(c.values()) for c in counts.values()) == 3  # not the one between the calls
    _, saw_runtime, _ = gpu_check.count_host_syncs([Event("route", 0, 9), Event("aten::mm", 1, 2)])
    assert not saw_runtime


def test_launches_are_counted_inside_each_call():
    events = [Event("pre_attn", 0, 100), Event("post_attn", 200, 300),
              Event("cudaLaunchKernel", 10, 11), Event("cudaLaunchKernel", 20, 21),
              Event("cudaMemcpyAsync", 30, 31), Event("cuLaunchKernel", 250, 251),
              Event("cudaLaunchKernel", 150, 151), Event("cudaStreamSynchronize", 40, 41)]
    counts, saw_runtime, ranges = gpu_check.cuda_checks.count_runtime_calls(
        events, gpu_check.cuda_checks.LAUNCH_CALLS)
    assert saw_runtime and ranges == 2
    assert counts["pre_attn"]["cudaLaunchKernel"] == 2 and counts["pre_attn"]["cudaMemcpyAsync"] == 1
    assert sum(counts["post_attn"].values()) == 1 and counts["post_attn"]["cuLaunchKernel"] == 1
    assert "cudaStreamSynchronize" not in counts["pre_attn"]  # a sync is not a launch


def fake_sync_step(synchronising_call):
    """A balanced step whose `synchronising_call` raises what torch raises for a sync
    under set_sync_debug_mode("error") (and only in that mode), as _balanced_step's."""
    mode = {"now": 0}

    def set_mode(m):
        mode["now"] = m

    def step(run=lambda label, fn: fn()):
        def call(label):
            if label == synchronising_call and mode["now"] == "error":
                raise RuntimeError("called a synchronizing CUDA operation")
            return label
        for label in gpu_check.cuda_checks.STEP_CALLS:
            run(label, lambda label=label: call(label))
    return step, set_mode, lambda: mode["now"]


@pytest.mark.parametrize("call", [None, "pre_attn", "backward"])
def test_sync_debug_names_the_call_that_synchronises(call, monkeypatch):
    cuda_checks = gpu_check.cuda_checks
    step, set_mode, get_mode = fake_sync_step(call)
    monkeypatch.setattr(cuda_checks, "_balanced_step", lambda ctx: ("g1n1", step))
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", get_mode)
    ctx = types.SimpleNamespace(size=1, gather=lambda value: [value],
                                synchronize=lambda: None)
    verdict = cuda_checks._check_sync_debug(ctx)
    assert verdict["verdict"] == "INFO" and get_mode() == 0, verdict  # the mode restored
    if call is None:
        assert verdict["figures"]["raised"] == 0 and "nothing raised" in verdict["detail"]
    else:
        assert verdict["figures"]["raised"] == 1, verdict
        assert f"{call} made a synchronising CUDA call" in verdict["detail"], verdict


class CorruptRoute:
    """A balancer whose route adds 1 to its first routed token id."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def route(self, tensors):
        routed = self.inner.route(tensors)
        if routed[1].numel():
            routed[1][0] += 1
        return routed


@pytest.mark.parametrize("corrupt", [False, True])
def test_hub_layout_plays_8_ranks_and_catches_a_misrouted_token(corrupt, monkeypatch):
    hub_checks = gpu_check.hub_checks
    made = hub_checks._hub_balancers
    if corrupt:  # rank 2 (in the 2-GPU bag) misroutes one token id
        monkeypatch.setattr(hub_checks, "_hub_balancers", lambda ctx, width: [
            CorruptRoute(b) if r == 2 else b for r, b in enumerate(made(ctx, width))])
    opts = gpu_check.parse_options(["--device", "cpu", "--timeout-s", "120"])
    ctx = gpu_check.Context(0, 1, torch.device("cpu"), opts, host_group=None, fault=None)
    verdict = hub_checks._check_hub_layout(ctx)
    if corrupt:
        assert verdict["verdict"] == "FAIL", verdict
        assert "rank 2: the routed token ids are not the planner's chunk table" in \
            verdict["detail"], verdict
    else:
        assert verdict["verdict"] == "PASS", verdict
        assert verdict["figures"]["moved_tokens"] > 0 and verdict["figures"]["step_ms"] > 0


def load_json(tmp_path, name="gpu_check.json"):
    document = json.loads((tmp_path / name).read_text())
    return document, {c["name"]: c for c in document["checks"]}


def test_cpu_self_test_on_4_processes(tmp_path):
    began = time.monotonic()
    # --timeout-s: compiled_block compiles 3 times on each of 4 processes sharing the cores.
    status, out, err = run_cli(["--device", "cpu", "--ranks", "4", "--timeout-s", "300",
                                "--kill-timeout-s", "10", "--sizes-mb", "0.0625,0.25",
                                "--repeats", "3"], tmp_path, timeout=CLI_TIMEOUT_S)
    assert status == 0, (out, err)
    document, checks = load_json(tmp_path)
    assert document["exit_status"] == 0 and document["header"]["world_size"] == 4
    assert [c for c in checks] == list(gpu_check.CHECKS)

    step = checks["python_step"]
    assert step["verdict"] == "PASS", step
    assert 0 <= step["figures"]["max_rel_diff"] <= 1e-10 and step["figures"]["steps"] == 6
    assert step["figures"]["moved_tokens"] > 0
    assert sorted(step["ranks"]) == ["0", "1", "2", "3"]
    assert {r["verdict"] for r in step["ranks"].values()} == {"PASS"}
    assert "g1n4, g1n2+g2n1, g4n1" in step["detail"]

    a2a = checks["route_vs_all_to_all"]
    assert a2a["verdict"] == "INFO", a2a
    for label in ("0.0625MB", "0.25MB"):
        for key in ("route_ms", "a2a_ms", "ratio"):
            assert a2a["figures"][f"{key}[{label}]"] > 0, a2a["figures"]

    copies = checks["copy_bandwidth"]
    assert copies["verdict"] == "INFO", copies
    for key in ("route_ms", "copy_ms", "a2a_ms", "ratio", "ratio_a2a"):
        assert copies["figures"][key] > 0, copies["figures"]
    assert "all_to_all_single on a group of one" in copies["detail"], copies

    hub = checks["hub_layout"]
    assert hub["verdict"] == "PASS", hub
    assert hub["figures"]["ranks"] == 8 and hub["figures"]["moved_tokens"] > 0, hub
    assert "8 ranks of g1n2+g2n1+g4n1 played on cpu" in hub["detail"], hub

    cost = checks["exchange_cost"]
    assert cost["verdict"] == "INFO", cost
    for label in ("route", "pre_attn", "post_attn", "reverse_route", "backward"):
        assert cost["figures"][f"host_us_{label}"] > 0, cost["figures"]
    assert "CPU tensors: the call's own time" in cost["detail"], cost

    killed = checks["killed_rank"]
    assert killed["verdict"] == "PASS", killed
    assert killed["figures"]["survivors"] == 2 and killed["figures"]["timeout_s"] == 10
    assert 0 < killed["figures"]["max_error_s"] < 10
    assert killed["ranks"]["2"]["outcome"] == "exited"
    for rank in ("0", "1"):
        first = killed["ranks"][rank]["value"]["first"]
        assert first[0] == "RuntimeError" and first[2] < 10, first

    fsdp2 = checks["fsdp2_checkpoint"]
    if TORCH_NEEDS["fsdp2_checkpoint"] is not None:  # no fully_shard in this torch
        assert fsdp2["verdict"] == "SKIP" and fsdp2["detail"] == TORCH_NEEDS["fsdp2_checkpoint"]
        assert "has no usable fully_shard" in fsdp2["detail"], fsdp2
    elif fsdp2["verdict"] == "SKIP":  # fully_shard cannot run on CPU (torch 2.6), with why
        assert f"fully_shard does not run on cpu with torch {torch.__version__}" in \
            fsdp2["detail"] and "Error" in fsdp2["detail"], fsdp2
    else:
        assert fsdp2["verdict"] == "PASS", fsdp2
        assert 0 <= fsdp2["figures"]["max_rel_diff"] <= 1e-10, fsdp2

    compiled = checks["compiled_block"]
    if TORCH_NEEDS["compiled_block"] is not None:
        assert compiled["verdict"] == "SKIP", compiled
        assert compiled["detail"] == TORCH_NEEDS["compiled_block"]
        assert "torch.library.custom_op" in compiled["detail"] or \
            "not supported" in compiled["detail"], compiled
    else:
        assert compiled["verdict"] == "PASS", compiled
        assert {r["verdict"] for r in compiled["ranks"].values()} == {"PASS"}
        figures = compiled["figures"]
        assert figures["graph_breaks"] == 0 and 1 <= figures["compiles"] <= 4, figures
        assert 0 <= figures["max_rel_diff"] <= 1e-10, figures
        assert f"compiled {figures['compiles']} time(s)" in compiled["detail"], compiled

    for name in gpu_check.CUDA_ONLY:
        assert checks[name]["verdict"] == "SKIP" and "CUDA only" in checks[name]["detail"]

    table = {line.split()[0]: line.split()[1] for line in out.splitlines()
             if line.split()[:1] and line.split()[0] in gpu_check.CHECKS}
    assert table == {name: checks[name]["verdict"] for name in gpu_check.CHECKS}
    assert "CPU self-test" in out and "exit status 0" in out
    assert time.monotonic() - began < CLI_TIMEOUT_S


def test_an_injected_fault_fails_python_step(tmp_path):
    """A check that cannot fail proves nothing: one routed value off by one."""
    status, out, err = run_cli(["--device", "cpu", "--ranks", "2", "--timeout-s", "120",
                                "--skip", "route_vs_all_to_all,fsdp2_checkpoint,compiled_block,"
                                          "killed_rank"], tmp_path,
                               env={gpu_check.FAULT_ENV: "corrupt_route"}, timeout=CLI_TIMEOUT_S)
    assert status == 1, (out, err)
    document, checks = load_json(tmp_path)
    assert document["exit_status"] == 1 and document["header"]["fault"] == "corrupt_route"
    step = checks["python_step"]
    assert step["verdict"] == "FAIL", step
    assert "route + reverse_route changed the float64 tokens" in step["detail"]
    assert "differs from the unbalanced model's" in step["detail"]
    assert "FAULT INJECTED" in out and "FAIL python_step" in out


@pytest.mark.skipif(TORCH_NEEDS["compiled_block"] is not None,
                    reason=f"compiled_block does not run here: {TORCH_NEEDS['compiled_block']}")
def test_an_injected_fault_fails_compiled_block(tmp_path):
    """One value of the compiled block's output off by one on rank 0."""
    status, out, err = run_cli(["--device", "cpu", "--ranks", "2", "--timeout-s", "300",
                                "--skip", "python_step,route_vs_all_to_all,fsdp2_checkpoint,"
                                          "killed_rank"], tmp_path,
                               env={gpu_check.FAULT_ENV: "corrupt_compiled"},
                               timeout=CLI_TIMEOUT_S)
    assert status == 1, (out, err)
    document, checks = load_json(tmp_path)
    assert document["header"]["fault"] == "corrupt_compiled"
    compiled = checks["compiled_block"]
    assert compiled["verdict"] == "FAIL", compiled
    assert "differs from the unbalanced model's" in compiled["detail"], compiled
    assert compiled["ranks"]["0"]["verdict"] == "FAIL"
    assert checks["python_step"]["verdict"] == "SKIP"
    assert "FAULT INJECTED" in out and "FAIL compiled_block" in out


def test_a_hung_check_is_reported_and_the_run_ends(tmp_path):
    began = time.monotonic()
    status, out, err = run_cli(["--device", "cpu", "--ranks", "2", "--timeout-s", "15",
                                "--skip", "killed_rank"], tmp_path,
                               env={gpu_check.FAULT_ENV: "hang"}, timeout=CLI_TIMEOUT_S)
    took = time.monotonic() - began
    assert status == 1, (out, err)
    document, checks = load_json(tmp_path)
    step = checks["python_step"]
    assert step["verdict"] == "FAIL" and "did not finish within 15 s" in step["detail"], step
    # Both ranks gave up on it: rank 0 sleeping, rank 1 waiting for rank 0.
    assert {r["verdict"] for r in step["ranks"].values()} == {"FAIL"}
    assert checks["route_vs_all_to_all"]["verdict"] == "SKIP"
    assert "an earlier check hung" in checks["route_vs_all_to_all"]["detail"]
    assert "reporting it as hung" in err and "_check_python_step" in err  # the stacks
    assert took < 15 + 120, took


# -- the CUDA-only checks' code on CPU tensors, with torch.cuda stubbed -------------------

class FakeStream:
    handles = iter(range(1000, 10 ** 6))

    def __init__(self, device=None, priority=0):
        self.cuda_stream = next(FakeStream.handles)

    def wait_stream(self, other):
        pass


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


def stub_cuda():
    """Streams, events and sleeps that do nothing: CPU work is already in order, so
    the checks must PASS; what this runs is their code, not CUDA's semantics."""
    current = FakeStream()
    torch.cuda.Stream = FakeStream
    torch.cuda.Event = FakeEvent
    torch.cuda.current_stream = lambda device=None: current
    torch.cuda.stream = lambda stream: contextlib.nullcontext()
    torch.cuda._sleep = lambda cycles: None
    torch.cuda.synchronize = lambda device=None: None
    torch.Tensor.record_stream = lambda self, stream: None
    mode = {"now": 0}  # set_sync_debug_mode's: no CPU tensor op synchronises a GPU
    torch.cuda.get_sync_debug_mode = lambda: mode["now"]
    torch.cuda.set_sync_debug_mode = lambda m: mode.update(now=m)


class GlooTransport:
    """knapformer._C.NcclTransport's contract over Gloo: counts checked against the
    peers' first (the same ValueError on every rank, nothing moved), rows moved, bytes
    all-gathered. `flaw` breaks it the way a broken transport would."""

    def __init__(self, unique_id, rank, size, device, timeout_seconds=600.0,
                 check_counts=True, flaw=None):
        assert isinstance(unique_id, bytes) and len(unique_id) == 128
        assert timeout_seconds > 0 and check_counts
        self.rank, self.size, self.device, self.aborted, self.flaw = \
            rank, size, device, False, flaw

    def all_to_all_rows(self, send, send_rows, recv, recv_rows, stream):
        assert isinstance(stream, int) and len(send_rows) == len(recv_rows) == self.size
        assert send.shape[0] == sum(send_rows) and recv.shape[0] == sum(recv_rows)
        sent_to_me = torch.empty(self.size, dtype=torch.int64)
        dist.all_to_all_single(sent_to_me, torch.tensor(send_rows, dtype=torch.int64))
        mine = next((f"recv_rows: rank {self.rank} expects {recv_rows[p]} rows from rank {p}, "
                     f"which sends it {int(sent_to_me[p])}" for p in range(self.size)
                     if sent_to_me[p] != recv_rows[p]), None)
        verdicts = [None] * self.size
        dist.all_gather_object(verdicts, mine)
        wrong = [v for v in verdicts if v]
        if wrong:
            if self.flaw == "silent_mismatch":
                return  # nothing moved, nothing said
            raise ValueError(wrong[0])
        dist.all_to_all_single(recv, send.contiguous(), list(recv_rows), list(send_rows))
        if self.flaw == "corrupt" and recv.numel():
            recv.view(-1)[0] += 1

    def all_gather_bytes(self, data):
        gathered = [None] * self.size
        dist.all_gather_object(gathered, bytes(data))
        return gathered


def stand_in_extension(flaw):
    real = knapformer._C

    class Extension:
        nccl_transport_available = True

        @staticmethod
        def nccl_unique_id():
            return os.urandom(128)

        @staticmethod
        def NcclTransport(*args, **kwargs):  # noqa: N802  (the binding's name)
            return GlooTransport(*args, flaw=flaw, **kwargs)

        def __getattr__(self, name):
            return getattr(real, name)

    return Extension()


def one_sync_per_route(count):
    """A CPU profile has no CUDA runtime calls: one made-up cudaStreamSynchronize at the
    start of every route the profiler recorded, counted by the real counter."""
    def counted(events):
        events = list(events)
        made_up = [Event("cudaStreamSynchronize", e.time_range.start, e.time_range.start)
                   for e in events if e.name == "route" and gpu_check.on_host(e)]
        return count(events + made_up)
    return counted


def stubbed_cuda_world(rank, size, flaw):
    stub_cuda()
    # Patched where the checks look them up: the package's own names are copies.
    cuda_checks = gpu_check.cuda_checks
    cuda_checks.count_host_syncs = one_sync_per_route(cuda_checks.count_host_syncs)
    cuda_checks._C = stand_in_extension(flaw)
    cuda_checks.device_backend = lambda group: "nccl"  # the group is Gloo's here
    opts = gpu_check.parse_options(["--sizes-mb", "0.0625", "--copy-mb", "0.25",
                                    "--repeats", "2", "--timeout-s", "60"])
    ctx = gpu_check.Context(rank, size, torch.device("cpu"), opts,
                            dist.new_group(backend="gloo"), None)
    ctx.cuda = True  # the CUDA code paths, on CPU tensors and the stubs
    reasons = gpu_check.skip_reasons(opts, gpus=size, world_size=size, transport_built=True)
    reasons["killed_rank"] = "not in this world"
    for name in ("fsdp2_checkpoint", "compiled_block"):  # not CUDA-only: the self-test's
        reasons[name] = "not in this world"
    results = gpu_check.run_world_checks(ctx, reasons)
    return {r["name"]: (r["verdict"], r["detail"], r["figures"]) for r in results}


@pytest.mark.parametrize("size", [1, 2])
def test_the_cuda_checks_code_runs_and_passes_on_stubs(size):
    for rank, results in enumerate(run_world(stubbed_cuda_world, size, None, timeout=300)):
        verdicts = {name: verdict for name, (verdict, _, _) in results.items()}
        where = f"size {size} rank {rank}: {results}"
        for name in ("nccl_group", "raw_nccl", "python_step", "side_stream"):
            assert verdicts[name] == "PASS", where
        assert verdicts["copy_bandwidth"] == "INFO", where
        assert results["copy_bandwidth"][2]["route_GBps"] > 0
        assert results["copy_bandwidth"][2]["a2a_GBps"] > 0
        assert verdicts["sync_debug"] == "INFO", where
        assert results["sync_debug"][2]["raised"] == 0 and "nothing raised" in \
            results["sync_debug"][1], where
        assert verdicts["exchange_cost"] == "INFO", where
        assert results["exchange_cost"][2]["host_us_pre_attn"] > 0, where
        assert "while the GPU is busy" in results["exchange_cost"][1], where
        assert verdicts["route_vs_all_to_all"] == ("INFO" if size > 1 else "SKIP"), where
        syncs = results["host_syncs"]
        if syncs[0] == "SKIP":  # a CUDA torch without a device may refuse to profile
            assert torch.version.cuda and "profiler" in syncs[1], where
        else:
            assert syncs[0] == "INFO", where
            assert syncs[2]["syncs_per_step"] == 1 and syncs[2]["in_route"] == 1, syncs
            assert syncs[2]["in_plan_routing"] == 0 and syncs[2]["in_backward"] == 0, syncs
            assert syncs[2]["calls_cudaStreamSynchronize"] == 1, syncs
            assert "route 1;" in syncs[1], syncs
        assert "raw transport the same" in results["side_stream"][1]
        assert "ValueError on every rank" in results["raw_nccl"][1]


@pytest.mark.parametrize("flaw,text", [
    ("silent_mismatch", "not ValueError on every rank"),
    ("corrupt", "arrived wrong"),
])
def test_raw_nccl_reports_a_broken_transport(flaw, text):
    for results in run_world(stubbed_cuda_world, 2, flaw, timeout=300):
        verdict, detail, _ = results["raw_nccl"]
        assert verdict == "FAIL" and text in detail, detail
        if flaw == "corrupt":
            assert results["side_stream"][0] == "FAIL", results["side_stream"]
