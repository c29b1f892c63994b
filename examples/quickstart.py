"""knapformer's quick start (the README's Python section, line for line):
one attention block on 4 CPU processes, balanced, checked against the same
block without balancing.

    python3 -m knapformer.launch --nproc_per_node 4 examples/quickstart.py
"""
import torch
import torch.distributed as dist
from knapformer import SequenceBalancer

def attention(q, k, v, seq_lens):  # each sequence attends to itself
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, tokens, head_dim]
    out = [torch.softmax(qs @ ks.transpose(1, 2) / qs.shape[-1] ** 0.5, -1) @ vs
           for qs, ks, vs in zip(*(t.split(seq_lens.tolist(), 1) for t in (q, k, v)))]
    return torch.cat(out, 1).transpose(0, 1) if out else q.transpose(0, 1)

def block(x, seq_lens, balancer=None):  # x + attention(x), 4 heads
    q, k, v = qkv(x).view(len(x), 3, 4, 16).unbind(1)
    if balancer:
        seq_lens, q, k, v = balancer.pre_attn(q, k, v)  # whole sequences, heads / bag GPUs
    o = attention(q, k, v, seq_lens)
    if balancer:
        _, o = balancer.post_attn(o)  # back to this rank's chunks, every head
    return x + proj(o.reshape(len(x), 64))

dist.init_process_group("gloo")  # "nccl" and CUDA tensors on GPUs
rank = dist.get_rank()
torch.manual_seed(0)  # the same weights on every rank
qkv, proj = torch.nn.Linear(64, 192).double(), torch.nn.Linear(64, 64).double()
seq_lens = [1024] if rank == 0 else [64, 128, 32]  # rank 0 holds a long sequence
x = torch.randn(sum(seq_lens), 64, dtype=torch.float64)

balancer = SequenceBalancer("g4n1", gamma=0.49)  # one bag of 4 GPUs: see below
balancer.plan_routing(seq_lens, token_dim=64)
chunk_lens, routed, _ = balancer.route(x)  # the chunks this rank computes on
_, y, _ = balancer.reverse_route(block(routed, chunk_lens, balancer))

expected = block(x, torch.tensor(seq_lens))
assert torch.allclose(y, expected, rtol=1e-10, atol=1e-12), f"rank {rank}: differs"
if rank == 0:
    balancer.print_imbalance()
print(f"rank {rank}: the balanced block equals the unbalanced one", flush=True)
dist.destroy_process_group()
