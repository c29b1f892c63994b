"""examples/train_dit.py with every combination of --fsdp, --checkpoint and
--compile on 4 CPU processes (knapformer.launch): each run exits 0 only when
the balanced and unbalanced runs agree on losses and gradients (sharded
ones rank by rank), and prints its slowest-rank speed-up, labelled with its
setup. --compile uses the aot_eager backend here (no C++ compiler needed);
inductor is the example's default."""
import itertools
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


@pytest.mark.parametrize("fsdp,checkpoint,compile_",
                         list(itertools.product([False, True], repeat=3)))
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
