"""What every part of gpu_check shares: the checks' names, the exit statuses, and a
check's result (one row of the report, or one rank's part of it)."""

CHECKS = ("nccl_group", "raw_nccl", "python_step", "side_stream", "host_syncs",
          "copy_bandwidth", "route_vs_all_to_all", "fsdp2_checkpoint", "compiled_block",
          "killed_rank")
CUDA_ONLY = ("nccl_group", "raw_nccl", "side_stream", "host_syncs", "copy_bandwidth")
FAULT_ENV = "KNAPFORMER_GPU_CHECK_FAULT"
FAULTS = ("corrupt_route", "corrupt_compiled", "hang")

# Exit statuses.
OK, FAILED, BAD_ARGUMENTS, NO_GPU = 0, 1, 2, 3

GAMMA = 0.49


def _result(name, verdict, detail, figures=None):
    return {"name": name, "verdict": verdict, "figures": dict(figures or {}), "detail": detail}


def _one_line(error, limit=300):
    text = str(error).strip().splitlines()
    text = text[0] if text else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _problems_text(problems, limit=3):
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def _group_timeout_s(opts):
    # Past the per-check bound, so that a hang is reported by the watchdog
    # (world_checks._Watchdog) before a timeout ends the process.
    return opts.timeout_s + 60
