"""knapformer: online load balancing of sequences for distributed transformer training.

A drop-in for the KnapFormer reference implementation's ``SequenceBalancer``
(change the import, keep the calls), backed by knapformer's C++ planner,
planner service client and differentiable exchanges:

    import knapformer
    balancer = knapformer.SequenceBalancer("g1n2+g2n1+g4n1", gamma=0.49)
    balancer.plan_routing(seq_lens, token_dim=d_model)
    chunk_lens, x, features = balancer.route(x, [positions])
    seq_lens, q, k, v = balancer.pre_attn(q, k, v)      # inside attention
    chunk_lens, o = balancer.post_attn(o)
    seq_lens, x, features = balancer.reverse_route(x, features)

Also: ``TheoreticalWorkloadEstimator`` (the reference's: times a model,
fits the cost model's gamma), ``plan`` (the planner on lists of lengths),
``plot_plan`` (a picture of one step's plan; needs matplotlib),
``PlannerServer`` (the planner service inside this process),
``synthetic_lengths`` and ``synthetic_batch`` (the paper's synthetic data
streams, and the masked ones with their masks) and
``LengthsStream`` (your own data's lengths, batched as your loader does).
"""

import torch  # first: the extension uses torch's Python types

from knapformer._version import __version__
from knapformer._build_check import check_build, load_extension

# What this copy was built against, compared with the running torch before
# the extension loads: a mismatch is an ImportError saying how to rebuild,
# not an undefined symbol.
build_info = check_build(torch)
_C = load_extension(build_info)

from knapformer.planner import (LengthsStream, PlannerServer, plan, synthetic_batch,
                                synthetic_lengths)
from knapformer.sequence_balancer import SequenceBalancer
from knapformer.workload_estimator import TheoreticalWorkloadEstimator


def __getattr__(name):
    # knapformer.plot is imported when first used, not here: `python3 -m
    # knapformer.plot` warns about a module imported before it runs.
    if name == "plot_plan":
        from knapformer.plot import plot_plan
        return plot_plan
    raise AttributeError(f"module 'knapformer' has no attribute '{name}'")


__all__ = ["SequenceBalancer", "TheoreticalWorkloadEstimator", "PlannerServer", "plan",
           "plot_plan", "synthetic_lengths", "synthetic_batch", "LengthsStream", "build_info",
           "__version__"]
