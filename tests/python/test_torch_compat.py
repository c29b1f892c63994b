"""What differs between torch 1.13 and 2.x (knapformer._torch_compat): the
backend names of a group, TCPStore without libuv, and a balancer over a group
made by init_process_group() without a backend (torch 2.x)."""
import datetime

import pytest
import torch
import torch.distributed as dist

from knapformer import _torch_compat
from knapformer.launch import run_world


class _Group:
    pass


def _backend_names(monkeypatch, backend, config, cuda):
    monkeypatch.setattr(dist, "get_backend", lambda group: backend)
    monkeypatch.setattr(dist, "get_backend_config", lambda group: config, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)


@pytest.mark.parametrize("backend, config, cuda, expected", [
    ("gloo", "gloo", False, "gloo"),
    ("nccl", "nccl", True, "nccl"),
    # torch 2.x's init_process_group() without a backend: get_backend says
    # 'undefined' (2.6) or the list; get_backend_config has the list.
    ("undefined", "cpu:gloo,cuda:nccl", False, "gloo"),  # no GPU: the CPU backend
    ("undefined", "cpu:gloo,cuda:nccl", True, "nccl"),   # a GPU: the CUDA one
    ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl", False, "gloo"),
    ("undefined", "cuda:nccl,cpu:gloo,xpu:xccl", True, "nccl"),
    ("undefined", " cpu : gloo , cuda : nccl ", False, "gloo"),
])
def test_device_backend_picks_the_backend_of_the_tensors_device(monkeypatch, backend, config,
                                                                 cuda, expected):
    _backend_names(monkeypatch, backend, config, cuda)
    assert _torch_compat.device_backend(_Group()) == expected


@pytest.mark.parametrize("backend, config, cuda", [
    ("mpi", "mpi", False), ("undefined", "undefined", False),
    ("undefined", "cuda:nccl", False), ("undefined", "cpu:mpi,cuda:ucc", True),
])
def test_device_backend_refuses_others_naming_them(monkeypatch, backend, config, cuda):
    _backend_names(monkeypatch, backend, config, cuda)
    with pytest.raises(ValueError, match=f"process_group: backend '{config}' is not supported"):
        _torch_compat.device_backend(_Group())


def test_tcp_store_works_on_this_torch_with_or_without_libuv():
    server = _torch_compat.tcp_store("127.0.0.1", 0, 2, True, wait_for_workers=False,
                                     timeout=datetime.timedelta(seconds=30))
    client = _torch_compat.tcp_store("127.0.0.1", server.port, 2, False,
                                     timeout=datetime.timedelta(seconds=30))
    client.set("key", "value")
    assert server.get("key") == b"value"
    # Recorded for the log: which server this torch gave.
    print("default TCPStore (libuv on 2.4+) works:", _torch_compat.default_tcp_store_works())


def _round_trip_without_backend(rank, size):
    import knapformer
    from knapformer._torch_compat import device_backend
    lens = [[5, 9, 30], [3], [17, 4], []][rank]
    balancer = knapformer.SequenceBalancer("g2n1")
    balancer.plan_routing(lens, 8)
    x = torch.randn(sum(lens), 8, dtype=torch.float64)
    _, routed, _ = balancer.route(x)
    seq_lens, back, _ = balancer.reverse_route(routed)
    return (dist.get_backend_config(), device_backend(dist.group.WORLD),
            torch.equal(back, x) and seq_lens.tolist() == lens)


def test_a_balancer_over_init_process_group_without_a_backend():
    if int(torch.__version__.split(".")[0]) < 2:
        pytest.skip(f"torch {torch.__version__}: init_process_group needs a backend before 2.0")
    results = run_world(_round_trip_without_backend, 4, backend=None)
    for name, backend, exact in results:
        assert backend == "gloo", name  # no GPU here: the CPU backend of the group
        assert exact
