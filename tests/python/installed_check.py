"""The installed knapformer package, used from outside the source tree:

    PYTHON tests/python/installed_check.py VENV

checks that the package and its extension come from VENV, that it plans, and
that 4 Gloo processes run a training step of a one-block attention model in
float64 through SequenceBalancer (route, pre_attn, post_attn, reverse_route)
with the same loss and gradients as without it (the package's own launcher
and side-by-side harness, as installed), and that misuse raises the
same errors as on every supported torch. Prints one line per check; exits
non-zero on the first that fails. Run by tests/python/wheel_install_test.sh,
and by hand on a fresh machine after scripts/build_wheel.sh --venv VENV.
"""
import sys

import torch

SIZE = 4
LENS = [[5, 9, 30], [3], [17, 4, 4], []]  # rank 2's long and rank 0's many
D_MODEL, HEADS = 8, 2


def step(x, weights, lens, balancer):
    """One block's forward and the loss; balanced when balancer is given."""
    from knapformer.side_by_side import varlen_attention

    wq, wk, wv, wo = weights
    seq_lens = lens
    if balancer is not None:
        balancer.plan_routing(lens, D_MODEL)
        _, x, _ = balancer.route(x)
    q, k, v = ((x @ w).reshape(-1, HEADS, D_MODEL // HEADS) for w in (wq, wk, wv))
    if balancer is not None:
        seq_lens, q, k, v = balancer.pre_attn(q, k, v)
        seq_lens = seq_lens.tolist()
    o = varlen_attention(q, k, v, seq_lens)
    if balancer is not None:
        _, o = balancer.post_attn(o)
    out = o.reshape(-1, D_MODEL) @ wo
    if balancer is not None:
        _, out, _ = balancer.reverse_route(out)
    return (out ** 2).sum()


def worker(rank, size):
    """This rank's largest relative difference between balanced and
    unbalanced, and its errors for each misuse; inside the package's Gloo
    world (knapformer.launch.run_world)."""
    import torch.distributed as dist
    import knapformer
    from knapformer.side_by_side import run_both  # the package's harness, as installed

    balancer = knapformer.SequenceBalancer("g1n2+g2n1")
    generator = torch.Generator().manual_seed(0)  # the same weights everywhere
    weights = [torch.randn(D_MODEL, D_MODEL, dtype=torch.float64, generator=generator)
               for _ in range(4)]
    x = torch.randn(sum(LENS[rank]), D_MODEL, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1 + rank))
    xs = x.clone().requires_grad_()
    ws = [w.clone().requires_grad_() for w in weights]

    def loss_of(bal):
        loss = step(xs, ws, LENS[rank], bal)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return [total]

    runs = run_both(loss_of, balancer, inputs=[xs], parameters=ws, reduce=True)
    names = ["loss", "input gradient"] + [f"weight {i} gradient" for i in range(len(ws))]
    worst = runs.compare(names, [], rtol=1e-12, atol=0)  # the bound is asserted below
    errors = {}
    for what, call in (
            ("negative length", lambda: balancer.plan_routing([-1] if rank == 1 else [3], 8)),
            ("token_dim", lambda: balancer.plan_routing([3], token_dim=0)),
            ("heads", lambda: (balancer.plan_routing([3, 5], 6),
                               balancer.pre_attn(*[balancer.route(torch.ones(8, 6))[1]
                                                   .reshape(-1, 3, 2)] * 3)))):
        try:
            call()
            errors[what] = None
        except Exception as error:  # noqa: BLE001  (the type and text are the check)
            errors[what] = (type(error).__name__, str(error))
    return worst, errors


EXPECTED_ERRORS = {
    "negative length": ("ValueError", "ranks[1][0]: sequence length -1"),
    "token_dim": ("ValueError", "token_dim: 0 is outside [1, 65536]"),
    "heads": ("ValueError", "3 heads (dimension 1) do not split over the bags of g1n2+g2n1; "
                            "heads must be a multiple of 2"),
}


def main():
    venv = sys.argv[1] if len(sys.argv) > 1 else None
    import knapformer

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"knapformer from {knapformer.__file__}")
    if venv is not None:
        assert knapformer.__file__.startswith(venv), knapformer.__file__
        assert knapformer._C.__file__.startswith(venv), knapformer._C.__file__
        print("ok   the package and its extension come from", venv)
    plan = knapformer.plan([[5, 9], [30]], "g1n2", d_model=16, gamma=1.0)
    assert plan["total_tokens"] == 44, plan
    print("ok   plan")
    from knapformer import TheoreticalWorkloadEstimator, plot_plan  # the reference's names too
    estimator = TheoreticalWorkloadEstimator(seq_len_test_range=(64, 512), seg_n_bins=3,
                                             d_token=16)
    lengths = estimator.seq_len_test_list
    estimator.benchmark_workload(None, test_seq_lens=torch.tensor(lengths),
                                 test_latencies=torch.tensor(
                                     [1e-9 * (24 * n * 256 + 0.5 * 4 * n * n * 16)
                                      for n in lengths], dtype=torch.float64))
    assert abs(estimator.gamma.item() - 0.5) < 1e-9, estimator.gamma
    assert callable(plot_plan)
    print("ok   TheoreticalWorkloadEstimator and plot_plan")

    from knapformer.launch import run_world  # the package's launcher, as installed

    outcomes = run_world(worker, SIZE)
    for rank in range(SIZE):
        worst, errors = outcomes[rank]
        assert worst <= 1e-12, f"rank {rank}: balanced and unbalanced differ by {worst:.3g}"
        for what, (kind, text) in EXPECTED_ERRORS.items():
            got = errors[what]
            assert got is not None and got[0] == kind and text in got[1], \
                f"rank {rank}: {what}: expected {kind} '{text}', got {got}"
    worst = max(outcomes[r][0] for r in range(SIZE))
    print(f"ok   a 4-process Gloo training step in float64: balanced == unbalanced "
          f"(loss, input and weight gradients; largest relative difference {worst:.3g})")
    print("ok   misuse raises the same errors on every rank:",
          "; ".join(f"{k}: {v[0]}" for k, v in EXPECTED_ERRORS.items()))


if __name__ == "__main__":
    main()
