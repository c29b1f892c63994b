"""Which way SequenceBalancer's exchanges go: the eager C++ calls, or, while
torch.compile traces the caller, the custom ops of knapformer/_compile.py,
whose shapes come from the step's shape carriers (made here, by
plan_routing). In eager mode the switch also refuses an exchange recomputed
in a backward pass (activation checkpointing) after plan_routing planned
another step.

A mixin of SequenceBalancer (CompileSwitch), apart from it so that the
balancer's public API reads without the tracing paths, and apart from
_compile.py, which holds the ops themselves and knows the balancer only by
its handle. It reads what SequenceBalancer's constructor sets: _impl,
_handle, _shapes, _plans and _forward_plans."""

import torch

from knapformer import _compile

# The autograd graph task this thread runs, -1 outside a backward pass
# (torch 2.x; on 1.13 recomputation is not checked).
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_compiling = _compile.compiling


class CompileSwitch:
    """SequenceBalancer's eager-or-traced switch and its traced exchanges."""

    def _eager(self, what):
        """False while torch.compile traces the call (the exchange is then
        the custom op of knapformer/_compile.py). In eager mode, checks that
        an exchange called during a backward pass, i.e. activation
        checkpointing recomputing a forward, uses the plan its forward used:
        plan_routing must not have run in between. Every rank runs the same
        program, so every rank refuses alike (agreed, like any refusal)
        instead of moving rows by another step's plan. One call per
        exchange: it is on every eager exchange's path."""
        if self._handle is not None and _compiling():
            return False
        if _graph_task_id() == -1:
            self._forward_plans = self._plans
        elif self._forward_plans != self._plans:
            self._refuse(what, f"{what}: recomputed in a backward pass (activation "
                               "checkpointing) after plan_routing planned step "
                               f"{self._impl.step}, but its forward ran under the plan before: "
                               "run the backward before the next plan_routing")
        return True

    # -- under torch.compile -------------------------------------------------

    def _shape_carriers(self):
        """The step's shape carriers (knapformer/_compile.py), by row set."""
        device = self._device()
        carriers = {}
        for which in ("sequence", "chunk", "attention"):
            lengths = self._impl.lengths(which, "cpu")
            bag_gpus = 1 if which == "sequence" else self._impl.bag_gpus
            carriers[which] = _compile.shape_carrier(int(lengths.sum()), lengths.numel(),
                                                     bag_gpus, device)
        return carriers

    def _traced_exchange(self, call, tensors, to, source, features=()):
        """``call`` as the custom op: (lengths of ``to``, moved tensors); for
        the routes, the reference's (lengths, tensor, features) triple."""
        if self._shapes is None:
            # What the eager call says too (an error agreed on every rank).
            self._impl.refuse(call, f"{call}: no plan for this step yet; call plan_routing first")
        lengths = _compile.lengths(self._handle, to, self._shapes[to])
        if call in ("pre_attn", "post_attn") and self._shapes[to].shape[2] == 1:
            # A one-GPU bag: identity, as in eager mode (torch specialises a
            # size of 1, so this is decided when tracing, not each step).
            return lengths, list(tensors)
        moved = _compile.exchange(self._handle, call, tensors, self._shapes[to],
                                  self._shapes[source])
        if call in ("route", "reverse_route"):
            return lengths, moved[0], (moved[1:] if features is not None else None)
        return lengths, moved
