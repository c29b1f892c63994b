"""What differs between the torch versions knapformer supports (1.13 and 2.x),
in one place: TCPStore's libuv server and the backend names of a group."""

import datetime

import torch
import torch.distributed as dist

_DEFAULT_STORE_WORKS = None


def default_tcp_store_works():
    """Whether TCPStore's default server starts here. torch 2.4+ asks for
    libuv by default; a torch built without it (Debian's 2.6) refuses, and
    so do torchrun's own rendezvous stores, which cannot be told otherwise."""
    global _DEFAULT_STORE_WORKS
    if _DEFAULT_STORE_WORKS is None:
        try:
            store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False,
                                  timeout=datetime.timedelta(seconds=10))
            del store
            _DEFAULT_STORE_WORKS = True
        except RuntimeError as error:
            if "libuv" not in str(error):
                raise
            _DEFAULT_STORE_WORKS = False
    return _DEFAULT_STORE_WORKS


def tcp_store(host, port, world_size, is_master, **kwargs):
    """dist.TCPStore(host, port, world_size, is_master, **kwargs), on the
    non-libuv server where this torch has no libuv (clients and server must
    agree, so every process of a job should make its store here)."""
    if not default_tcp_store_works():
        kwargs["use_libuv"] = False
    return dist.TCPStore(host, port, world_size, is_master, **kwargs)


def device_backend(group):
    """'gloo' (CPU tensors) or 'nccl' (CUDA tensors): the backend the
    balancer's exchanges use on ``group``. torch 2.x's init_process_group()
    without a backend makes a group with one backend per device
    ('cpu:gloo,cuda:nccl'): its CUDA one when this process has a GPU, else
    its CPU one. Its get_backend() then answers 'undefined' (2.6) or the
    list itself; get_backend_config() (2.1+) has the list."""
    name = str(dist.get_backend(group))
    if name in ("gloo", "nccl"):
        return name
    if hasattr(dist, "get_backend_config"):
        name = str(dist.get_backend_config(group))
    per_device = {}
    for part in name.split(","):
        device, separator, backend = part.partition(":")
        if separator:
            per_device[device.strip()] = backend.strip()
    if per_device.get("cuda") == "nccl" and torch.cuda.is_available():
        return "nccl"
    if per_device.get("cpu") == "gloo":
        return "gloo"
    raise ValueError(f"process_group: backend '{name}' is not supported (gloo with CPU "
                     "tensors, nccl with CUDA tensors, or a group with either, such as "
                     "'cpu:gloo,cuda:nccl')")
