"""Route + reverse route from Python against the same calls from C++, in one run.

4 CPU processes (Gloo over 127.0.0.1, one intra-op thread each). Per payload P
per rank (4 KB, 1 MB and 16 MB of float32 rows of 1024, i.e. 4 KB per token;
4 KB is one token per rank, which shows the fixed costs of a call): every
rank packs a seeded mix of 1-8 sequences summing to P / 4 KB tokens, and one
plan_routing (topology g1n2+g2n1, local planning; not timed) gives the plan.
route -> reverse_route must give x back bit for bit (else exit 1). Then K
iterations (after 3 warm-up ones), each running, after a barrier each and in
alternating order:
  (py)  knapformer.SequenceBalancer.route(x) + .reverse_route(y), timed in Python
        (what a PyTorch trainer pays: the binding, the length tensors, the tuples)
  (c++) SequenceBalancer::Route(x) + ReverseRoute(y) called from C++ on the
        same balancer and tensor, timed in C++ (what a C++ trainer pays)
Per iteration the slowest rank's time counts (all-gathered at the end); the
figures are the median and p90 over iterations, and the median over
iterations of python / c++ within an iteration (paired: the two ran back to
back, so drifts of the shared cores cancel).
Then, in this process alone (a world of one rank: no peers, no scheduling
noise from them), the fixed cost of one route + reverse of 16 tokens from
Python and from C++, and of one pre_attn + post_attn from Python (a bag of
one GPU: what the Python layer adds around the exchange), median of 2000
calls each. Figures only: nothing is asserted about time.

    bazel run -c opt //bench:python_route_bench [-- --seed 0]
"""
import argparse
import datetime
import os
import statistics
import sys
import time

PROCS = 4
TOPOLOGY = "g1n2+g2n1"
D_MODEL = 1024
ROW_BYTES = D_MODEL * 4
WARMUP = 3
# (bytes per rank, iterations); one token per rank shows the fixed costs.
PAYLOADS = [(ROW_BYTES, 200), (1 << 20, 100), (16 << 20, 30)]


def make_lengths(tokens, seed):
    import torch
    if tokens == 1:
        return [1]
    g = torch.Generator().manual_seed(seed)
    pieces = int(torch.randint(1, 9, (1,), generator=g))
    cuts = sorted({0, tokens, *torch.randint(1, tokens, (pieces - 1,), generator=g).tolist()})
    return [b - a for a, b in zip(cuts, cuts[1:])]


def p90(values):
    values = sorted(values)
    return values[max(1, -(-9 * len(values) // 10)) - 1]


def worker(rank, size, seed):
    """One rank's figures, inside the Gloo group knapformer.launch made; every
    rank's, all-gathered."""
    import torch
    import torch.distributed as dist
    import knapformer

    balancer = knapformer.SequenceBalancer(TOPOLOGY, gamma=1.0, d_model=D_MODEL)
    report = []
    for payload, iterations in PAYLOADS:
        lengths = make_lengths(payload // ROW_BYTES, seed * 1000 + rank * 17 + payload)
        balancer.plan_routing(lengths, D_MODEL)
        torch.manual_seed(seed + rank)
        x = torch.randn(sum(lengths), D_MODEL)
        _, routed, _ = balancer.route(x)
        if not torch.equal(balancer.reverse_route(routed)[1], x):
            raise RuntimeError(f"rank {rank}: route -> reverse_route is not exact")
        times = {"py": [], "c++": []}
        for i in range(WARMUP + iterations):
            order = ("py", "c++") if i % 2 == 0 else ("c++", "py")
            for variant in order:
                dist.barrier()
                if variant == "py":
                    start = time.perf_counter()
                    _, routed, _ = balancer.route(x)
                    balancer.reverse_route(routed)
                    seconds = time.perf_counter() - start
                else:
                    seconds = balancer._impl._time_route_and_reverse_in_cpp(x)
                if i >= WARMUP:
                    times[variant].append(seconds)
        summary = balancer.get_routing_plan_summary()
        report.append((payload, times, summary["moved_tokens"] / max(summary["total_tokens"], 1)))
    gathered = [None] * size
    dist.all_gather_object(gathered, report)
    return gathered


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-seconds", type=int, default=600)
    args = parser.parse_args()
    from knapformer.launch import run_ranks

    outcomes = run_ranks(worker, PROCS, (args.seed,), timeout_s=args.timeout_seconds,
                         backend="gloo", group_timeout_s=300, threads=1, fail_fast=True)
    if any(kind != "ok" for kind, _ in outcomes):
        for rank, (kind, value) in enumerate(outcomes):
            if kind != "ok":
                print(f"python_route_bench: rank {rank}: {kind}: {value}", file=sys.stderr)
        return 1
    gathered = outcomes[0][1]
    print(f"{PROCS} Gloo processes, topology {TOPOLOGY}, float32 rows of {D_MODEL}; "
          "slowest rank per iteration, median / p90 over iterations (ms); "
          f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    print(f"{'payload':>8}  {'moved':>6}  {'python route+reverse':>22}  "
          f"{'c++ route+reverse':>19}  {'python / c++':>12}")
    for index, (payload, _, moved) in enumerate(gathered[0]):
        size = f"{payload >> 20} MB" if payload >= 1 << 20 else f"{payload >> 10} KB"
        slowest = {v: [max(rank_report[index][1][v][i] for rank_report in gathered)
                       for i in range(len(gathered[0][index][1][v]))] for v in ("py", "c++")}
        py, cpp = (statistics.median(slowest[v]) * 1e3 for v in ("py", "c++"))
        paired = statistics.median(p / c for p, c in zip(slowest["py"], slowest["c++"]))
        print(f"{size:>8}  {moved:>6.0%}  {py:>10.2f} / {p90(slowest['py']) * 1e3:<9.2f}  "
              f"{cpp:>9.2f} / {p90(slowest['c++']) * 1e3:<7.2f}  {paired:>12.3f}")
    fixed_costs()
    return 0


def fixed_costs(calls=2000):
    import torch
    import torch.distributed as dist
    import knapformer
    from knapformer._torch_compat import tcp_store

    torch.set_num_threads(1)
    store = tcp_store("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    balancer = knapformer.SequenceBalancer("g1n1", d_model=D_MODEL)
    balancer.plan_routing([10, 6], D_MODEL)
    x = torch.randn(16, D_MODEL)
    q = x.reshape(16, 8, -1)
    times = {"py": [], "c++": [], "attn": []}
    for i in range(calls):
        start = time.perf_counter()
        _, routed, _ = balancer.route(x)
        balancer.reverse_route(routed)
        times["py"].append(time.perf_counter() - start)
        times["c++"].append(balancer._impl._time_route_and_reverse_in_cpp(x))
        start = time.perf_counter()
        _, q2, k2, v2 = balancer.pre_attn(q, q, q)
        balancer.post_attn(q2)
        times["attn"].append(time.perf_counter() - start)
    py, cpp, attn = (statistics.median(times[v]) * 1e6 for v in ("py", "c++", "attn"))
    print(f"fixed cost of one route + reverse (1 process, 16 tokens, median of {calls}): "
          f"python {py:.1f} us, c++ {cpp:.1f} us, python adds {py - cpp:.1f} us; "
          f"pre_attn + post_attn (a bag of one GPU) from python {attn:.1f} us")
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
