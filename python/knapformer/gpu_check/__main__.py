"""python -m knapformer.gpu_check (torchrun -m knapformer.gpu_check too)."""
import os
import sys

from knapformer.gpu_check.harness import main

if __name__ == "__main__":
    _status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not the interpreter's teardown: NCCL's can wait on a peer that has gone.
    os._exit(_status)
