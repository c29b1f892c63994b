"""One step run twice on the same weights and tokens, side by side: unbalanced
(every rank on its own sequences) and with a SequenceBalancer, and what tells
the two apart. The Python harness of "balanced equals unbalanced, and
faster" (tools/train_sim.cc is the C++ one): examples/train_dit.py times and
compares its training steps with it, and the GPU check
(python -m knapformer.gpu_check) its float64 steps.

    runs = run_both(lambda balancer: forward_backward(model, batch, balancer), balancer,
                    parameters=model.parameters())
    runs.plain.outputs, runs.balanced.gradients, runs.balanced.seconds
    runs.compare(names, problems, rtol=1e-10, atol=1e-12)

Also the reference attentions the models it runs use: varlen_attention
(each sequence attends to itself, optionally under a mask) and
masked_attention (the same as one block-diagonal mask, for torch.compile).
"""
import collections
import math
import time

import torch
import torch.distributed as dist

Run = collections.namedtuple("Run", "outputs gradients seconds")
Run.__doc__ = """One run of a step: what the step returned (a list of tensors), the
gradients run_both was asked for, and the step's time by run_both's clock."""


class SideBySide:
    """The two Runs of one step: ``plain`` (unbalanced) and ``balanced``."""

    def __init__(self, plain, balanced):
        self.plain = plain
        self.balanced = balanced

    def compare(self, names, problems, rtol, atol, where=""):
        """compare() of the balanced run's outputs and gradients (in that order,
        one name each) against the plain run's."""
        return compare(self.balanced.outputs + self.balanced.gradients,
                       self.plain.outputs + self.plain.gradients, names, problems, rtol, atol,
                       where)

    def gradient_difference(self, group=None):
        """The largest relative difference of the gradients (see compare()) over
        every rank of the group: each rank compares its own (its shards, where
        they are sharded)."""
        mine = max([0.0] + [_difference(got, want)[1] for got, want in
                            zip(self.balanced.gradients, self.plain.gradients)])
        everyone = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
        return max(everyone)


def run_both(step, balancer, *, inputs=(), parameters=(), reduce=False, clock=time.thread_time):
    """Runs step(None), then step(balancer): the same forward and backward pass
    on this rank's tokens, first without the balancer (every balancer call
    skipped), then with it. The balancer must have planned this step
    (plan_routing) first; every rank of its group calls this together.

    step returns the outputs to compare (tensors, detached). Before each run
    the gradients of ``inputs`` and ``parameters`` (tensors, or a model's
    parameters()) are cleared; after it, a copy of each is kept, inputs' first:
    zeros where a tensor got none, a sharded one's (FSDP2's DTensor) local
    shard; ``reduce``: the parameters' gradients summed over the default
    process group, for parameters that are not sharded (every rank holds a
    part of their gradient). Each run is timed by ``clock`` (thread CPU time
    by default: ranks sharing cores do not blur it), gradient copies not
    included. Returns a SideBySide.
    """
    inputs, parameters = list(inputs), list(parameters)
    runs = []
    for chosen in (None, balancer):
        for tensor in inputs + parameters:
            tensor.grad = None
        began = clock()
        outputs = list(step(chosen))
        seconds = clock() - began
        runs.append(Run(outputs, _gradients(inputs) + _gradients(parameters, reduce), seconds))
    return SideBySide(*runs)


def compare(got, want, names, problems, rtol, atol, where=""):
    """The largest relative difference of each tensor of got from the one of
    want, named as in names: max |got - want| / max |want| (the difference
    itself where want is all zeros). Each pair of another shape, or not within
    torch.allclose(rtol, atol), appends a sentence to problems."""
    worst = 0.0
    for name, mine, theirs in zip(names, got, want):
        if mine.shape != theirs.shape:
            problems.append(f"{where}{name}: shape {tuple(mine.shape)}, the unbalanced "
                            f"model's {tuple(theirs.shape)}")
            worst = math.inf
            continue
        if mine.numel() == 0:
            continue
        mine, theirs = mine.detach().double().cpu(), theirs.detach().double().cpu()
        difference, relative = _difference(mine, theirs)
        worst = max(worst, relative)
        if not torch.allclose(mine, theirs, rtol=rtol, atol=atol):
            problems.append(f"{where}{name} differs from the unbalanced model's by up to "
                            f"{difference:.3g} (relative {relative:.3g}; rtol {rtol:g})")
    return worst


def _difference(got, want):
    """(max |got - want|, that over max |want|, or itself where want is all zeros)."""
    if got.numel() == 0:
        return 0.0, 0.0
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    difference = (got - want).abs().max().item()
    scale = want.abs().max().item()
    return difference, difference / scale if scale > 0 else difference


def _gradients(tensors, reduce=False):
    copies = []
    for tensor in tensors:
        grad = tensor.grad if tensor.grad is not None else torch.zeros_like(tensor)
        grad = grad.detach()
        copies.append((grad.to_local() if hasattr(grad, "to_local") else grad).clone())
    if reduce:
        for grad in copies:
            dist.all_reduce(grad)
    return copies


def varlen_attention(q, k, v, seq_lens, allowed=None):
    """Each sequence attends to itself: q, k, v [tokens, heads, head_dim] of
    sequences of seq_lens (a list or a tensor) one after the other.
    ``allowed``: per sequence, an [n, n] boolean matrix, True where query i
    attends to key j; None: every pair."""
    lengths = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else list(seq_lens)
    outs, start = [], 0
    for index, n in enumerate(lengths):
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[-1])
        if allowed is not None:
            scores = scores.masked_fill(~allowed[index].to(q.device), float("-inf"))
        outs.append((torch.softmax(scores, dim=-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(outs) if outs else q[:0] * 0  # no sequences: still in the graph


def masked_attention(q, k, v, seq_lens):
    """varlen_attention for torch.compile: one block-diagonal mask made from the
    lengths tensor (a Python loop over its values would break the graph)."""
    segment = torch.repeat_interleave(torch.arange(seq_lens.numel(), device=q.device),
                                      seq_lens.long(), output_size=q.shape[0])
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(segment[None, :, None] != segment[None, None, :], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
