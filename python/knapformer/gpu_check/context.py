"""One rank's view of the world the checks run in, and what several checks share: the
topologies that fit, token ids that name their origin, the planner's table of them,
timing and splitting rows."""
import time

import torch
import torch.distributed as dist

from knapformer import _C


class _Context:
    """One rank's view of the world the checks run in."""

    def __init__(self, rank, size, device, opts, host_group, fault, local_rank=None,
                 init_seconds=0.0):
        self.rank = rank
        self.size = size
        self.device = device
        self.cuda = device.type == "cuda"
        self.opts = opts
        self.host_group = host_group  # Gloo: the checks' own small collectives
        self.fault = fault
        self.local_rank = rank if local_rank is None else local_rank
        self.init_seconds = init_seconds
        self.transport = None
        self.on_hang = None  # results so far -> exit status, when a check hangs
        self.topologies = _topologies(size)
        self.scale = 4 if self.cuda else 1  # sequence lengths: small on shared CPU cores

    def gather(self, value):
        everyone = [None] * self.size
        dist.all_gather_object(everyone, value, group=self.host_group)
        return everyone

    def barrier(self):
        dist.barrier(group=self.host_group)

    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)


def _topologies(size):
    """Topologies that fit `size` ranks: one-GPU bags, a mix, and one bag of every rank."""
    if size == 1:
        return ["g1n1"]
    candidates = [f"g1n{size}"]
    if size % 2 == 0 and size >= 4:
        candidates.append(f"g1n{size // 2}+g{size // 2}n1")
    candidates.append(f"g{size}n1")
    fitting = []
    for topology in candidates:
        try:
            _C.replica_size(topology, size, {})
            fitting.append(topology)
        except (ValueError, RuntimeError):
            pass
    return fitting


def _token_ids(rank, lens):
    # Every token's id names its rank, sequence and offset, so a misplaced row shows.
    return torch.tensor([(rank << 40) | (s << 20) | t for s, n in enumerate(lens)
                         for t in range(n)], dtype=torch.int64)


def _planned_ids(plan, rank):
    """This rank's chunks in compute order and the ids of the tokens they hold."""
    mine = [c for c in plan["chunks"] if c["dst_rank"] == rank]
    ids = [(c["src_rank"] << 40) | (c["seq_index"] << 20) | (c["offset"] + t)
           for c in mine for t in range(c["length"])]
    return mine, torch.tensor(ids, dtype=torch.int64)


def _time_ms(ctx, fn, barrier=True):
    """Milliseconds fn takes on this rank: CUDA events on GPUs, the clock on CPUs; with
    barrier, every rank starts together."""
    if ctx.cuda:
        ctx.synchronize()
        if barrier:
            ctx.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    if barrier:
        ctx.barrier()
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1e3


def _split(rows, parts):
    base = [rows // parts] * parts
    base[-1] += rows - sum(base)
    return base
