"""Collectives of bytes over a torch.distributed group, for what the ranks
tell each other before the balancer has a transport of its own: typed
messages the extension encodes and judges (client/settings_agreement.proto),
never pickles."""

import torch
import torch.distributed as dist


def all_gather_bytes(mine, group, device):
    """Every rank's ``mine`` (bytes), by rank: two all-gathers over
    ``group`` (the lengths, then the bytes padded to the longest) of tensors
    on ``device``, the group's (CPU for Gloo, the rank's GPU for NCCL)."""
    size = group.size()
    length = torch.tensor([len(mine)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    lengths = [int(n.item()) for n in lengths]
    padded = torch.zeros(max(max(lengths), 1), dtype=torch.uint8)
    padded[:len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
    padded = padded.to(device)
    everyone = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(everyone, padded, group=group)
    return [bytes(t[:n].cpu().tolist()) for t, n in zip(everyone, lengths)]
