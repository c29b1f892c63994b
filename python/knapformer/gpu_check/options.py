"""The command's arguments and what runs here: the checks' names and order (CHECKS),
those that need CUDA, the faults its own tests inject, the parser, and which checks
this machine and these options skip, and why.

Apart from the harness because every rank computes the same answers from them without
starting anything (the tests drive parse_options and skip_reasons directly), and the
modes only read them."""
import argparse
import math
import sys

from knapformer.gpu_check import fsdp_checks
from knapformer.gpu_check.machine import _no_gpu_text

CHECKS = ("nccl_group", "raw_nccl", "python_step", "side_stream", "host_syncs",
          "sync_debug", "exchange_cost", "copy_bandwidth", "hub_layout", "route_vs_all_to_all",
          "fsdp2_checkpoint", "compiled_block", "killed_rank")
CUDA_ONLY = ("nccl_group", "raw_nccl", "side_stream", "host_syncs", "sync_debug")
FAULTS = ("corrupt_route", "corrupt_compiled", "hang")


def _bounded(kind, low, high):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (low <= value <= high) or (isinstance(value, float) and math.isnan(value)):
            raise argparse.ArgumentTypeError(f"{text} is outside [{low:g}, {high:g}]")
        return value
    return parse


def _sizes(text):
    sizes = []
    for part in text.split(","):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} in {text!r} is not a number of MB") \
                from None
        if not 0 < value <= 4096:
            raise argparse.ArgumentTypeError(f"{part} MB is outside (0, 4096]")
        sizes.append(value)
    return sizes


def _skip_list(text):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown check {unknown[0]!r} (checks: "
                                         f"{', '.join(CHECKS)})")
    return names


def _parser():
    # The package's docstring (the docs are written from it) is the command's help.
    doc = sys.modules[__package__].__doc__.split("\n\n")
    parser = argparse.ArgumentParser(
        prog="python -m knapformer.gpu_check",
        description=doc[0].split("\n")[0] + "\n\n" + doc[1],
        epilog="exit status: 0 nothing FAILed, 1 a check FAILed, 2 bad arguments, 3 no GPU\n"
               "found (nothing was checked). What each check does and when it passes:\n"
               "python3 -c 'import knapformer.gpu_check as g; help(g)'",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would run here, write the JSON with every check SKIP, "
                             "exit 0")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): the GPU checks; cpu: a self-test of this "
                             "command's own logic on CPU processes over Gloo, for CI")
    parser.add_argument("--ranks", type=_bounded(int, 1, 64), default=None,
                        help="--device cpu only: processes of the self-test's world "
                             "(default 4)")
    parser.add_argument("--json", default="gpu_check.json", metavar="PATH",
                        help="where rank 0 writes every figure, verdict and detail "
                             "(default ./gpu_check.json)")
    parser.add_argument("--timeout-s", type=_bounded(float, 1, 86400), default=300.0,
                        help="bound on each check: one that runs longer is reported as hung "
                             "(FAIL) and the run ends; the process groups' and the raw "
                             "transport's timeout is this + 60 s (default 300)")
    parser.add_argument("--kill-timeout-s", type=_bounded(float, 1, 3600), default=30.0,
                        help="killed_rank: its world's process-group and transport timeout "
                             "(default 30)")
    parser.add_argument("--sizes-mb", type=_sizes, default=None, metavar="MB[,MB...]",
                        help="route_vs_all_to_all: payloads per rank (default 1,16; "
                             "--device cpu 0.25,1)")
    parser.add_argument("--copy-mb", type=_bounded(float, 0.0625, 65536), default=None,
                        help="copy_bandwidth: bytes routed and copied (default 64; "
                             "--device cpu 4)")
    parser.add_argument("--repeats", type=_bounded(int, 1, 1000), default=None,
                        help="timed repeats, medians reported (default 10; --device cpu 5)")
    parser.add_argument("--skip", type=_skip_list, default=[], metavar="NAME[,NAME...]",
                        help=f"checks not to run (SKIP): {', '.join(CHECKS)}")
    return parser


def parse_options(argv):
    """The command's options from argv (argparse exits 2 on bad ones)."""
    parser = _parser()
    opts = parser.parse_args(argv)
    if opts.ranks is not None and opts.device != "cpu":
        parser.error("--ranks: only with --device cpu (on GPUs the world is torchrun's "
                     "--nproc_per_node)")
    cpu = opts.device == "cpu"
    if opts.ranks is None:
        opts.ranks = 4
    if opts.sizes_mb is None:
        opts.sizes_mb = [0.25, 1.0] if cpu else [1.0, 16.0]
    if opts.repeats is None:
        opts.repeats = 5 if cpu else 10
    if opts.copy_mb is None:
        opts.copy_mb = 4.0 if cpu else 64.0
    opts.warmup = 1 if cpu else 2
    return opts


def _killed_world_size(opts, gpus):
    return min(opts.ranks, 3) if opts.device == "cpu" else min(gpus, 4)


def skip_reasons(opts, gpus, world_size, transport_built):
    """{check: None (it runs) or why it is skipped} for this machine and these options.
    Every rank computes the same answer, so every rank runs the same collectives."""
    cpu = opts.device == "cpu"
    size = opts.ranks if cpu else world_size
    reasons = {}
    for name in CHECKS:
        reason = None
        if name in opts.skip:
            reason = "skipped (--skip)"
        elif cpu and name in CUDA_ONLY:
            reason = ("CUDA only; --device cpu runs python_step, exchange_cost, "
                      "copy_bandwidth, hub_layout, route_vs_all_to_all, fsdp2_checkpoint, "
                      "compiled_block and killed_rank on CPU processes")
        elif not cpu and gpus == 0:
            reason = "no GPU: " + _no_gpu_text()
        elif name == "raw_nccl" and not transport_built:
            reason = ("this build has no raw NCCL transport (knapformer._C."
                      "nccl_transport_available is false: built without CUDA and NCCL)")
        elif name == "route_vs_all_to_all" and size < 2:
            reason = ("needs 2 or more ranks: --ranks 2 or more" if cpu else
                      "needs 2 or more ranks: torchrun --nproc_per_node N -m "
                      "knapformer.gpu_check (N >= 2)")
        elif name == "fsdp2_checkpoint" and fsdp_checks.fsdp2_missing() is not None:
            reason = fsdp_checks.fsdp2_missing()
        elif name == "compiled_block" and fsdp_checks.compile_missing() is not None:
            reason = fsdp_checks.compile_missing()
        elif name == "killed_rank" and _killed_world_size(opts, gpus) < 2:
            reason = ("needs 2 or more processes: --ranks 2 or more" if cpu else
                      f"needs 2 or more GPUs on this node (found {gpus}): it starts a world "
                      "of its own, one process per GPU")
        reasons[name] = reason
    return reasons
