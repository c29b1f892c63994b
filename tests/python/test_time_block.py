"""examples/time_block.py: it writes the `length,seconds` CSV that `knapformer
calibrate` reads (read here by the same rules), knapformer's fit takes it, it
runs without the knapformer package, and it refuses bad arguments."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from knapformer import _C

# From the repository root: Bazel's runfiles (//examples:time_block.py), or
# the source tree.
SCRIPT = Path(__file__).absolute().parents[2] / "examples" / "time_block.py"


def run(args, tmp_path, block_knapformer=False):
    """Runs the script on CPU and returns the finished process."""
    if block_knapformer:
        # As where knapformer is not installed: importing it fails.
        code = ("import runpy, sys; sys.modules['knapformer'] = None; "
                f"sys.argv = [{str(SCRIPT)!r}] + {list(args)!r}; "
                f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, str(SCRIPT)] + list(args)
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240)


def read_timing_csv(path):
    """`knapformer calibrate --input`'s rules (tools/calibrate.cc): blank
    lines and `#` comments skipped, a header only on line 1, then
    `length,seconds` rows with an integer length >= 1 and finite seconds >= 0."""
    rows = []
    for number, line in enumerate(path.read_text().split("\n"), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = [field.strip() for field in line.split(",")]
        try:
            assert len(fields) == 2
            length, seconds = int(fields[0]), float(fields[1])
        except (AssertionError, ValueError):
            assert number == 1, f"line {number}: {line!r} is not a row"
            continue
        assert length >= 1 and math.isfinite(seconds) and seconds >= 0, line
        rows.append((length, seconds))
    return rows


def test_writes_the_csv_calibrate_reads(tmp_path):
    # One intra-op thread: threads that share loaded cores time erratically.
    # The fit needs times that grow with the work; a machine busy enough to
    # break that gets two more tries (this test is about the file, not the
    # machine).
    for attempt in range(3):
        done = run(["--d-model", "32", "--heads", "2", "--lengths", "128,256,512,1024,2048",
                    "--repeat", "3", "--warmup", "1", "--threads", "1", "--out", "times.csv"],
                   tmp_path)
        assert done.returncode == 0, done.stderr
        text = (tmp_path / "times.csv").read_text()
        assert text.startswith("length,seconds\n"), text
        assert "forward+backward" in text.split("\n")[1], text  # says what was timed
        rows = read_timing_csv(tmp_path / "times.csv")
        lengths = [length for length, _ in rows]
        assert lengths == [128, 256, 512, 1024, 2048]
        assert all(seconds > 0 for _, seconds in rows), rows
        assert "knapformer calibrate --input times.csv --d-model 32" in done.stdout, done.stdout
        # The round trip: the planner's calibration fit (what `knapformer
        # calibrate` runs) on the CSV.
        try:
            fit = dict(_C.fit_cost_model(lengths, [s for _, s in rows], 32))
        except RuntimeError as error:
            if "do not grow with the work" in str(error) and attempt < 2:
                continue
            raise
        break
    assert fit["k"] > 0 and fit["gamma"] >= 0 and fit["samples"] == 5, fit
    # The script printed the same fit (of its unrounded times).
    printed = re.search(r"knapformer's fit: gamma ([0-9.]+)", done.stdout)
    assert printed is not None, done.stdout
    assert abs(float(printed.group(1)) - fit["gamma"]) < 1e-3, (printed.group(0), fit)


def test_runs_without_knapformer(tmp_path):
    done = run(["--d-model", "16", "--heads", "2", "--lengths", "32,16", "--repeat", "1",
                "--warmup", "0", "--no-backward", "--out", "fwd.csv"], tmp_path,
               block_knapformer=True)
    assert done.returncode == 0, done.stderr
    assert "knapformer's fit" not in done.stdout, done.stdout
    text = (tmp_path / "fwd.csv").read_text()
    assert "forward," in text.split("\n")[1] and "backward" not in text, text
    rows = read_timing_csv(tmp_path / "fwd.csv")
    assert [length for length, _ in rows] == [16, 32], rows  # sorted
    assert all(seconds > 0 for _, seconds in rows), rows


@pytest.mark.parametrize("args, message", [
    (["--d-model", "30", "--heads", "4"], "--d-model 30 is not a multiple of --heads 4"),
    (["--lengths", "64,64"], "--lengths: needs at least two different lengths"),
    (["--lengths", "64,x"], "--lengths: needs integers"),
    (["--repeat", "0"], "--repeat need values >= 1"),
])
def test_refuses_bad_arguments(tmp_path, args, message):
    done = run(args + ["--out", "bad.csv"], tmp_path)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert not (tmp_path / "bad.csv").exists()
