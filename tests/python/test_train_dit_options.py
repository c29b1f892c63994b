"""examples/train_dit.py with --fsdp, --checkpoint and --compile on 4 CPU
processes (knapformer.launch): every pair of the three options' settings
appears in some run (a pairwise covering: plain, and each option off with
the other two on), plus all three on: 5 runs instead of all 8, about 90 s
less on torch 2.6's lane, where each run costs ~30 s. Each run exits 0 only when
the balanced and unbalanced runs agree on losses and gradients (sharded
ones rank by rank), and prints its slowest-rank speed-up, labelled with its
setup. --compile uses the aot_eager backend here (no C++ compiler needed);
inductor is the example's default."""
import os
import re
import subprocess
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "examples", "train_dit.py")
# Lengths divided by 32, not the example's 8: what is checked (balanced equals
# unbalanced) does not depend on the lengths, and a run costs 2.5x less CPU.
SCALE = 32


def import_failure(*modules):
    """None when every module imports, else why not (torch 1.13's FSDP and
    checkpoint wrapper do not import on Python 3.11)."""
    for module in modules:
        try:
            __import__(module)
        except Exception as error:  # noqa: BLE001  (any import failure is the reason)
            return f"{type(error).__name__}: {error}"
    return None


def fsdp_missing():
    return import_failure("torch.distributed.fsdp", "torch.distributed.fsdp.wrap")


def checkpoint_wrapper_missing():
    return import_failure("torch.distributed.algorithms._checkpoint.checkpoint_wrapper")


def label(fsdp, checkpoint, compile_):
    parts = [("fsdp fsdp1" if fsdp else None),
             ("checkpoint non-reentrant" if checkpoint else None),
             ("compile aot_eager" if compile_ else None)]
    return ", ".join(p for p in parts if p) or "plain"


# Every pair of settings of two options appears in one of these (checked by
# test_the_runs_cover_every_pair), and the three together.
RUNS = [(False, False, False), (False, True, True), (True, False, True), (True, True, False),
        (True, True, True)]


def test_the_runs_cover_every_pair():
    for a, b in [(0, 1), (0, 2), (1, 2)]:
        pairs = {(run[a], run[b]) for run in RUNS}
        assert pairs == {(False, False), (False, True), (True, False), (True, True)}, (a, b)


@pytest.mark.parametrize("fsdp,checkpoint,compile_", RUNS)
def test_train_dit_matches_unbalanced(fsdp, checkpoint, compile_):
    if compile_ and not hasattr(torch.library, "custom_op"):
        pytest.skip(f"--compile needs torch.library.custom_op (torch >= 2.4), torch "
                    f"{torch.__version__} has none")
    if fsdp and fsdp_missing():
        pytest.skip(f"torch {torch.__version__}'s FSDP does not import ({fsdp_missing()})")
    if checkpoint and checkpoint_wrapper_missing():
        pytest.skip(f"torch {torch.__version__}'s checkpoint_wrapper does not import "
                    f"({checkpoint_wrapper_missing()})")
    command = [sys.executable, "-m", "knapformer.launch", "--nproc_per_node", "4", EXAMPLE,
               "--steps", "3", "--scale", str(SCALE), "--compile-backend", "aot_eager"]
    command += ["--fsdp"] if fsdp else []
    command += ["--checkpoint"] if checkpoint else []
    command += ["--compile"] if compile_ else []
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    found = re.search(r"\[([^\]]*)\] slowest-rank compute, mean over steps 1-2: unbalanced "
                      r"(\d+) ms, balanced (\d+) ms \(([0-9.]+)x\); losses and gradients agree",
                      log)
    assert found, log[-4000:]
    assert found.group(1) == label(fsdp, checkpoint, compile_), found.group(0)
    assert float(found.group(4)) > 0, found.group(0)
    sys.stdout.write(found.group(0) + "\n")
