"""The balancer's exchanges as torch custom ops, for code that torch.compile
traces (torch >= 2.4, where torch.library.custom_op exists).

Eager calls keep the C++ autograd nodes (client/sequence_balancer.cc), whose
backward exchanges are chained into one order on every rank. Under
torch.compile, SequenceBalancer's methods call these ops instead: an opaque
pybind11 call would be a graph break in every block, and a row count read
from the plan (a Python int) would be a constant, recompiled every step.

Shapes come from the step's *shape carriers*: per kind of row set
("sequence": this rank's own rows, "chunk": the routed rows, "attention":
whole sequences for attention), a 0-element tensor of shape
[rows, lengths, bag_gpus, 0] that plan_routing makes. They are graph inputs,
so their sizes are symbolic like any tensor's: the fake (meta) kernels read
an exchange's output rows and head split from them, and a new step with
other lengths reuses the compiled graph. Nothing here moves data itself: the
real kernels call the same C++ exchanges (agreement on errors included),
with autograd off, and each op's backward is the ``exchange_backward`` op,
whose kernel runs exactly the exchange the eager autograd node's backward
runs (SequenceBalancer::BackwardOf: one implementation of each exchange's
backward for both); AOTAutograd's backward graph holds it too.
"""

import weakref
from typing import List

import torch

# The inverse of each exchange: the shape of its backward's results.
INVERSE = {"route": "reverse_route", "reverse_route": "route",
           "pre_attn": "post_attn", "post_attn": "pre_attn"}

# Live balancers by handle: the ops take an int (a custom op's arguments
# are tensors and scalars), and a balancer that is gone must be an error,
# not a crash.
_balancers = weakref.WeakValueDictionary()
_next_handle = [0]


def available():
    """Whether this torch has torch.library.custom_op (2.4+)."""
    return hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def _is_compiling():
    return False


# Whether torch.compile (dynamo) is tracing the caller: torch's own function
# (dynamo answers True for it while tracing), called on every eager
# exchange, so looked up once here.
compiling = getattr(getattr(torch, "compiler", None), "is_compiling", _is_compiling)


def register(balancer):
    """A handle for ``balancer`` that the ops accept."""
    _next_handle[0] += 1
    _balancers[_next_handle[0]] = balancer
    return _next_handle[0]


def _balancer(handle, call):
    balancer = _balancers.get(handle)
    if balancer is None:
        raise RuntimeError(f"knapformer::{call}: its SequenceBalancer no longer exists (a "
                           "compiled graph ran after the balancer was deleted)")
    return balancer


def shape_carrier(rows, lengths, bag_gpus, device):
    """The 0-element tensor whose shape states a row set (see above)."""
    # Zero strides: a contiguous layout's strides would be sizes too, and
    # dynamo would guard on them.
    return torch.empty_strided((rows, lengths, bag_gpus, 0), (0, 0, 0, 0), dtype=torch.uint8,
                               device=device)


def _moved_like(call, x, out_shape):
    rows, _, bag_gpus = out_shape.shape[:3]
    if call == "pre_attn":
        return x.new_empty((rows, x.shape[1] // bag_gpus) + tuple(x.shape[2:]))
    if call == "post_attn":
        return x.new_empty((rows, x.shape[1] * bag_gpus) + tuple(x.shape[2:]))
    return x.new_empty((rows,) + tuple(x.shape[1:]))


def _define():
    @torch.library.custom_op("knapformer::exchange", mutates_args=())
    def exchange(handle: int, call: str, xs: List[torch.Tensor], out_shape: torch.Tensor,
                 in_shape: torch.Tensor) -> List[torch.Tensor]:
        """One of the balancer's four exchanges of ``xs`` (collective, as in
        eager mode). ``out_shape`` states the result's rows, ``in_shape``
        the inputs' (for the backward)."""
        impl = _balancer(handle, call)._impl
        with torch.no_grad():  # the op's own autograd formula below applies
            moved = list(getattr(impl, call)(list(xs)))
        # A custom op's outputs may not alias its inputs; an exchange that
        # moves nothing may hand its input back.
        inputs = {x.untyped_storage().data_ptr() for x in xs if x.numel()}
        return [m.clone() if m.numel() and m.untyped_storage().data_ptr() in inputs else m
                for m in moved]

    @exchange.register_fake
    def _(handle, call, xs, out_shape, in_shape):
        return [_moved_like(call, x, out_shape) for x in xs]

    def setup_context(ctx, inputs, output):
        handle, call, xs, out_shape, in_shape = inputs
        ctx.handle, ctx.call = handle, call
        # Shapes and dtypes only: the outputs themselves are not kept.
        ctx.outputs = [(o.shape, o.dtype, o.device) for o in output]
        ctx.save_for_backward(out_shape, in_shape)

    def backward(ctx, grads):
        out_shape, in_shape = ctx.saved_tensors
        # Every floating tensor's gradient moves (zeros where autograd has
        # none), so that every rank sends the same tensors whatever its
        # graph used; the others have none.
        floating = [i for i, (_, dtype, _) in enumerate(ctx.outputs) if dtype.is_floating_point]
        sent = [grads[i] if grads[i] is not None else
                torch.zeros(ctx.outputs[i][0], dtype=ctx.outputs[i][1], device=ctx.outputs[i][2])
                for i in floating]
        moved = exchange_backward(ctx.handle, ctx.call, sent, out_shape, in_shape) \
            if sent else []
        result = [None] * len(ctx.outputs)
        for i, grad in zip(floating, moved):
            result[i] = grad
        return None, None, result, None, None

    exchange.register_autograd(backward, setup_context=setup_context)

    @torch.library.custom_op("knapformer::exchange_backward", mutates_args=())
    def exchange_backward(handle: int, call: str, grads: List[torch.Tensor],
                          out_shape: torch.Tensor, in_shape: torch.Tensor) -> List[torch.Tensor]:
        """The backward of exchange ``call`` for the gradients of its outputs
        (collective): what the eager autograd node runs. ``out_shape``
        states the forward's result rows, ``in_shape`` its inputs'."""
        impl = _balancer(handle, call)._impl
        with torch.no_grad():
            moved = list(impl.backward(call, list(grads)))
        inputs = {g.untyped_storage().data_ptr() for g in grads if g.numel()}
        return [m.clone() if m.numel() and m.untyped_storage().data_ptr() in inputs else m
                for m in moved]

    @exchange_backward.register_fake
    def _(handle, call, grads, out_shape, in_shape):
        return [_moved_like(INVERSE[call], g, in_shape) for g in grads]

    def setup_backward_context(ctx, inputs, output):
        handle, call, grads, out_shape, in_shape = inputs
        ctx.handle, ctx.call = handle, call
        ctx.save_for_backward(out_shape, in_shape)

    def backward_of_backward(ctx, grads):
        # The backward of a linear exchange's backward is the exchange.
        out_shape, in_shape = ctx.saved_tensors
        moved = exchange(ctx.handle, ctx.call, list(grads), out_shape, in_shape)
        return None, None, moved, None, None

    exchange_backward.register_autograd(backward_of_backward,
                                        setup_context=setup_backward_context)

    @torch.library.custom_op("knapformer::lengths", mutates_args=())
    def lengths(handle: int, which: str, shape: torch.Tensor) -> torch.Tensor:
        """The step's lengths of a row set ("sequence", "chunk",
        "attention"), int32 on the shape carrier's device."""
        return _balancer(handle, "lengths")._impl.lengths(which, str(shape.device))

    @lengths.register_fake
    def _(handle, which, shape):
        return torch.empty((shape.shape[1],), dtype=torch.int32, device=shape.device)

    return exchange, lengths


_ops = _define() if available() else None


def exchange(handle, call, xs, out_shape, in_shape):
    return _ops[0](handle, call, xs, out_shape, in_shape)


def lengths(handle, which, shape):
    return _ops[1](handle, which, shape)
