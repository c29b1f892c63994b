"""Times one DiT-like transformer block on single sequences of several lengths
and writes the `length,seconds` CSV that `knapformer calibrate` fits the cost
model's gamma to:

    python3 examples/time_block.py --d-model 1024 --heads 16 --out times.csv
    knapformer calibrate --input times.csv --d-model 1024

The block (LayerNorm, qkv Linear, attention per sequence, output projection,
LayerNorm, MLP 4x with GELU, residuals) does 24*l*d^2 FLOPs of linear work and
4*l^2*d of attention per sequence in its forward pass: the two terms of the
cost model 24*l*d^2 + gamma*4*l^2*d. Replace `Block` with your own block to
fit gamma for it (docs/tuning.md). By default every timed call runs forward
and backward, as a training step does; --no-backward times the forward alone
(as the paper's and the reference's estimators do).

Each length gets --warmup untimed calls, then --repeat timed ones; the CSV has
their median (CUDA is synchronized around every timed call). Plain torch: the
knapformer package is not needed; where it is importable, the fit is printed
too.
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

CPU_LENGTHS = "128,256,512,1024,2048"
CUDA_LENGTHS = "1024,2048,4096,8192,16384,32768"


def attention(q, k, v):
    """softmax(q k^T / sqrt(head_dim)) v over [heads, tokens, head_dim]:
    torch's fused kernel where this torch has one (2.0 and later), else the
    same product written out."""
    fused = getattr(F, "scaled_dot_product_attention", None)
    if fused is not None:
        return fused(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores, dim=-1), v)


class Block(torch.nn.Module):
    """A pre-norm transformer block on packed sequences: x is [tokens, d_model],
    seq_lens the lengths of the sequences packed in it (attention stays within
    each)."""

    def __init__(self, d_model, heads):
        super().__init__()
        if d_model % heads != 0:
            raise ValueError(f"--d-model {d_model} is not a multiple of --heads {heads}")
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, 3 * d_model)
        self.proj = torch.nn.Linear(d_model, d_model)
        self.norm2 = torch.nn.LayerNorm(d_model)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d_model, 4 * d_model),
                                       torch.nn.GELU(approximate="tanh"),
                                       torch.nn.Linear(4 * d_model, d_model))

    def forward(self, x, seq_lens):
        tokens, d_model = x.shape
        head_dim = d_model // self.heads
        q, k, v = self.qkv(self.norm1(x)).view(tokens, 3, self.heads, head_dim).unbind(1)
        outputs = []
        for q_s, k_s, v_s in zip(q.split(seq_lens), k.split(seq_lens), v.split(seq_lens)):
            o = attention(q_s.transpose(0, 1), k_s.transpose(0, 1), v_s.transpose(0, 1))
            outputs.append(o.transpose(0, 1).reshape(-1, d_model))
        x = x + self.proj(torch.cat(outputs))
        return x + self.mlp(self.norm2(x))


def time_length(block, length, args, device, dtype):
    """Median seconds of one call (forward, and backward with --backward) on
    one sequence of `length` tokens."""
    d_model = block.proj.in_features
    x = torch.randn(length, d_model, device=device, dtype=dtype, requires_grad=args.backward)
    grad = torch.randn_like(x) if args.backward else None

    def call():
        if args.backward:
            block(x, [length]).backward(grad)
        else:
            with torch.no_grad():
                block(x, [length])

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup):
        call()
    times = []
    for _ in range(args.repeat):
        block.zero_grad(set_to_none=True)
        x.grad = None
        synchronize()
        start = time.perf_counter()
        call()
        synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def parse_lengths(text):
    try:
        lengths = [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"time_block.py: --lengths: needs integers separated by commas, got "
                         f"{text!r}") from None
    if any(n < 1 for n in lengths) or len(set(lengths)) < 2:
        raise SystemExit(f"time_block.py: --lengths: needs at least two different lengths "
                         f">= 1 (the fit separates the two terms by them), got {text!r}")
    return sorted(set(lengths))


def print_fit(lengths, seconds, d_model):
    """The fit `knapformer calibrate` would print, where knapformer imports."""
    try:
        from knapformer import _C
        fit = _C.fit_cost_model(lengths, seconds, d_model)
    except ImportError:
        return
    except (ValueError, RuntimeError) as error:
        print(f"knapformer's fit refuses these times: {error}")
        return
    print(f"knapformer's fit: gamma {fit['gamma']:.4f}, k {fit['k']:.6g} s per unit, "
          f"r^2 {fit['r_squared']:.4f}, max relative error "
          f"{100 * fit['max_relative_error']:.1f}%")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--d-model", type=int, default=256, help="your block's width")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lengths", default=None,
                        help=f"comma-separated (default: {CPU_LENGTHS} on cpu, "
                        f"{CUDA_LENGTHS} on cuda)")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per length")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per length")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--backward", action=argparse.BooleanOptionalAction, default=True,
                        help="time forward and backward (default), or the forward alone")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's CPU threads (0: torch's default)")
    parser.add_argument("--out", default="times.csv")
    args = parser.parse_args(argv)
    if args.d_model < 1 or args.heads < 1 or args.repeat < 1 or args.warmup < 0:
        raise SystemExit("time_block.py: --d-model, --heads and --repeat need values >= 1, "
                         "--warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("time_block.py: --device cuda: this torch sees no CUDA device")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    lengths = parse_lengths(args.lengths or (CUDA_LENGTHS if args.device == "cuda"
                                             else CPU_LENGTHS))
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    try:
        block = Block(args.d_model, args.heads).to(device=device, dtype=dtype)
    except ValueError as error:
        raise SystemExit(f"time_block.py: {error}") from None

    what = "forward+backward" if args.backward else "forward"
    seconds = []
    for length in lengths:
        seconds.append(time_length(block, length, args, device, dtype))
        print(f"length {length:>7}: {seconds[-1] * 1e3:10.3f} ms ({what})", flush=True)
    with open(args.out, "w", encoding="utf-8") as out:
        # The header must be the first line (`knapformer calibrate` skips a
        # header there only); `#` lines are comments anywhere.
        out.write("length,seconds\n")
        out.write(f"# one block, d_model {args.d_model}, {args.heads} heads, {what}, "
                  f"{args.device} {args.dtype}, median of {args.repeat} after "
                  f"{args.warmup} warm-up calls\n")
        for length, s in zip(lengths, seconds):
            out.write(f"{length},{s:.9g}\n")
    print(f"wrote {args.out}; fit gamma with:\n"
          f"  knapformer calibrate --input {args.out} --d-model {args.d_model}")
    print_fit(lengths, seconds, args.d_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
