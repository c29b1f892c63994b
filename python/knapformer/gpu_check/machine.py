"""The machine's facts as the command reports them: the GPUs torch sees (and why none),
the NCCL version, a device's name, whether this build has the raw NCCL transport,
torchrun's variables, and the report's header made from them.

Apart from the harness because these are read-only questions to torch and the
environment, asked by the argument checks (a skip's reason) and by every mode."""
import datetime
import os
import platform
import socket

import torch

import knapformer
from knapformer import _C
from knapformer.gpu_check.report import one_line


def _gpu_count():
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001  (a broken driver is "no GPU" here, with its reason)
        return 0


def _no_gpu_text():
    """What torch says about its GPUs, for the no-GPU messages."""
    version = torch.__version__
    hip = getattr(torch.version, "hip", None)
    if torch.version.cuda is None and not hip:
        return f"torch {version} (CPU build: torch.version.cuda is None)"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {hip}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    return (f"torch {version} ({build}, but no device visible: torch.cuda.is_available() "
            f"is False{shown})")


def _nccl_version():
    try:
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001  (CPU builds have no NCCL)
        return None
    if isinstance(version, tuple):
        return ".".join(str(v) for v in version if str(v) != "")
    if isinstance(version, int):
        # NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9 on, major*1000 before.
        if version >= 10000:
            return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
        return f"{version // 1000}.{version // 100 % 10}.{version % 100}"
    return str(version)


def _device_text(index):
    try:
        return f"cuda:{index} {torch.cuda.get_device_name(index)}"
    except Exception as error:  # noqa: BLE001
        return f"cuda:{index} (name unavailable: {one_line(error)})"


def _transport_built():
    return bool(getattr(_C, "nccl_transport_available", False))


def _torchrun_env():
    """(world size, rank, local rank) from torchrun's variables, (1, 0, 0) without them."""
    def read(name, default):
        value = os.environ.get(name, "")
        if value == "":
            return default
        try:
            return int(value)
        except ValueError:
            raise _UsageError(f"{name}={value!r} in the environment is not an integer "
                              "(torchrun sets it)") from None
    world = read("WORLD_SIZE", 1)
    rank = read("RANK", 0)
    return world, rank, read("LOCAL_RANK", rank)


class _UsageError(Exception):
    pass


def report_header(mode, world_size, devices, fault, argv):
    """The report's header: the mode, the devices, torch and knapformer's build."""
    build = getattr(knapformer, "build_info", None) or {}
    return {
        "tool": "knapformer.gpu_check",
        "mode": mode,
        "world_size": world_size,
        "devices": list(devices),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "knapformer": getattr(knapformer, "__version__", None),
        "build_info": dict(build) if isinstance(build, dict) else {"value": repr(build)},
        "nccl_transport_available": _transport_built(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(argv),
        "fault": fault,
    }
