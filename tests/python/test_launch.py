"""knapformer.launch: torchrun's environment for N local copies, a working
env:// rendezvous on every torch (libuv or not), and a failed copy stopping
the rest with its status."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    mode = sys.argv[1]
    rank = int(os.environ["RANK"])
    if mode == "fail" and rank == 1:
        sys.exit(7)
    if mode == "fail":
        import time
        time.sleep(120)  # must be stopped by the launcher, not waited for
    dist.init_process_group("gloo")
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    # One write per line: with PYTHONUNBUFFERED print writes each word on
    # its own, and the copies' words interleave in the shared pipe.
    words = ["rank", rank, "sum", int(total.item()), *(os.environ[k] for k in keys),
             "args", *sys.argv[2:]]
    sys.stdout.write(" ".join(map(str, words)) + "\\n")
    sys.stdout.flush()
    dist.destroy_process_group()
""")


def launch(tmp_path, *args, timeout=120):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, "-m", "knapformer.launch", *args[:-1], str(script),
                           *args[-1]], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "")))


def test_every_copy_joins_one_job_with_torchruns_environment(tmp_path):
    result = launch(tmp_path, "--nproc_per_node", "3", ["ok", "--extra", "7"])
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank"))
    # Every rank saw the all-reduce of 1+2+3 and its own RANK/LOCAL_RANK.
    assert lines == [f"rank {r} sum 6 {r} {r} 3 3 127.0.0.1 args --extra 7" for r in range(3)]


def test_a_failed_copy_stops_the_others_and_gives_its_status(tmp_path):
    started = time.monotonic()
    result = launch(tmp_path, "--nproc_per_node", "3", ["fail"])
    assert result.returncode == 7, (result.returncode, result.stderr)
    assert "exited 7; stopped the others" in result.stderr
    assert time.monotonic() - started < 60  # the sleeping copies were stopped


@pytest.mark.parametrize("count", ["0", "-2"])
def test_a_count_below_one_is_refused_naming_the_flag(tmp_path, count):
    result = launch(tmp_path, "--nproc_per_node", count, ["ok"])
    assert result.returncode == 2
    assert f"--nproc_per_node: {count} is not a positive count" in result.stderr
