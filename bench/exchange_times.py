"""Times all-to-alls in every bag size the auto layout may use, for
`knapformer calibrate --exchanges` (which fits the machine's intra- and
inter-node bandwidths to these rows).

    torchrun --nproc_per_node 8 --redirects 1 --tee 1 bench/exchange_times.py \
        --out exchanges.csv && knapformer calibrate --exchanges exchanges.csv

(`--redirects 1 --tee 1`: torchrun on Python 3.11 dies without them.) For
every power of two G from 2 to --max-bag, the world splits into aligned
blocks of G ranks, as auto's bags are, and every block exchanges at once,
as Ulysses does in every bag of a step: one all_to_all_single per size of
--sizes bytes per GPU (equal splits, so (G-1)/G of them leave each GPU),
after --warmup untimed ones; a row is the slowest rank's time, the median
of --repeats. A block whose ranks span two nodes (--gpus-per-node, default
$LOCAL_WORLD_SIZE) is an "inter" row. NCCL with CUDA tensors when CUDA is
there, Gloo with CPU tensors otherwise. Rank 0 writes the CSV rows
"gpus,bytes_per_gpu,seconds,link".
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-bag", type=int, default=8)
    parser.add_argument("--sizes", default="65536,262144,1048576,4194304,16777216,67108864",
                        help="bytes per GPU, comma-separated")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int,
                        default=int(os.environ.get("LOCAL_WORLD_SIZE", "0")) or None)
    parser.add_argument("--out", default="-")
    return parser.parse_args()


def main():
    args = parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = args.gpus_per_node or world
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.max_bag < 2 or args.max_bag & (args.max_bag - 1):
        sys.exit(f"--max-bag: {args.max_bag} is not a power of two >= 2")
    if world < 2 or any(size <= 0 for size in sizes) or args.repeats < 1:
        sys.exit("needs 2 or more ranks, sizes > 0 and --repeats >= 1")
    device = torch.device("cuda") if cuda else torch.device("cpu")
    rows = []
    gpus = 2
    while gpus <= min(args.max_bag, world):
        # Every process enters every new_group, in the same order (torch's rule).
        blocks = [list(range(first, first + gpus)) for first in range(0, world - gpus + 1, gpus)]
        groups = [dist.new_group(block) for block in blocks]
        mine = rank // gpus
        if mine >= len(blocks):  # a world that is not a multiple of gpus: no bag here
            group = None
        else:
            group = groups[mine]
        inter = any(block[0] // per_node != block[-1] // per_node for block in blocks)
        for size in sizes:
            elements = size // 4 // gpus * gpus  # float32, equal splits
            send = torch.ones(elements, device=device)
            recv = torch.empty_like(send)
            times = []
            for i in range(args.warmup + args.repeats):
                dist.barrier()
                start = time.perf_counter()
                if group is not None:
                    dist.all_to_all_single(recv, send, group=group)
                if cuda:
                    torch.cuda.synchronize()
                slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64,
                                       device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                if i >= args.warmup:
                    times.append(float(slowest.item()))
            rows.append(f"{gpus},{elements * 4},{statistics.median(times):.9g},"
                        f"{'inter' if inter else 'intra'}")
        gpus *= 2
    if rank == 0:
        text = "gpus,bytes_per_gpu,seconds,link\n" + "\n".join(rows) + "\n"
        if args.out == "-":
            sys.stdout.write(text)
        else:
            with open(args.out, "w") as out:
                out.write(text)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
