"""The KnapFormer reference implementation's plan tables (its
SequenceBalancer's attributes: seq ids, chunk ids, bags, workloads), derived
from one step's knapformer plan for the balancing group (replica) of one rank.

Conventions, as in the reference:
- gpu ids are global ranks (``dist.get_rank()``); a balancing group is one
  replica of the topology;
- sequences are numbered from 0 within the balancing group, rank by rank in
  packing order; chunks likewise, sequence by sequence, in token order, so
  the chunk ids of a sequence are consecutive;
- workloads are the cost model's, divided by 1e12 (the reference's units);
- ``gpu_id2*`` tables are keyed by every gpu of the group in ascending order,
  ``balance_*`` tables describe where chunks are computed (after routing),
  the others where they come from.
"""

import math
import re
from collections import Counter

# One term of a topology spec, as the C++ parser accepts it.
_TERM = re.compile(r"g([1-9][0-9]*)n([1-9][0-9]*)")

# The reference divides its workloads by 1e12 (TFLOP-like units).
_WORKLOAD_UNIT = 1e12

# Every attribute of the reference's SequenceBalancer that describes a
# planned step (set by its plan_routing), in the order it sets them.
STEP_ATTRIBUTES = (
    "seq_id2gpu_id", "seq_id2seq_len", "seq_id2seq_workload", "gpu_id2seq_ids",
    "gpu_id2seq_lens", "gpu_id2seq_workloads", "gpu_id2total_workload", "per_gpu_capacity",
    "seq_id2assigned_bag_id", "bag_id2capacity", "bag_id2assigned_seq_ids", "bag_id2occupancy",
    "chunk_id2gpu_id", "chunk_id2chunk_len", "chunk_id2seq_id", "gpu_id2chunk_ids",
    "gpu_id2chunk_lens", "balance_chunk_id2gpu_id", "balance_gpu_id2chunk_ids",
    "balance_gpu_id2chunk_lens", "balance_gpu_id2seq_ids", "balance_chunk_id2chunk_len",
    "balance_gpu_id2total_workload", "orig_minmax_workload", "bala_minmax_workload",
)

# The reference's bag attributes (set by its constructor; here, under
# "auto", the bags of the last planned step).
BAG_ATTRIBUTES = ("parsed_bag_specs", "bag_gpu_options", "bag_gpu_options2bag_ids",
                  "bag_id2gpu_ids", "gpu_id2bag_id")

# The keys of the reference's get_routing_plan_summary(), in its order.
SUMMARY_KEYS = (
    "balance_gpu_ids", "bag_id2gpu_ids", "gpu_id2bag_id", "seq_id2seq_len",
    "seq_id2seq_workload", "gpu_id2seq_ids", "gpu_id2seq_lens", "gpu_id2seq_workloads",
    "gpu_id2chunk_ids", "gpu_id2chunk_lens", "balance_chunk_id2gpu_id",
    "balance_chunk_id2chunk_len", "chunk_id2seq_id",
)


def parse_bag_specs(spec):
    """[(gpus per bag, bags)] of a canonical-or-not fixed topology spec
    ("g1n2+g2n1+g4n1"), equal sizes merged, sizes ascending; None when
    ``spec`` is not g{G}n{N} terms (e.g. "auto")."""
    counts = Counter()
    for term in spec.split("+"):
        match = _TERM.fullmatch(term)
        if not match:
            return None
        counts[int(match[1])] += int(match[2])
    return sorted(counts.items())


def bags_of_spec(spec):
    """(first rank, gpus) of each bag of one replica of a fixed spec, in bag
    order: sizes ascending, ranks contiguous."""
    bags, first = [], 0
    for gpus, count in parse_bag_specs(spec):
        for _ in range(count):
            bags.append((first, gpus))
            first += gpus
    return bags


def ratio(values):
    """max / min as the planner reports WIR: 1 when everything is 0, inf when
    only the minimum is (the reference divides by zero there)."""
    high, low = max(values), min(values)
    if high == 0:
        return 1.0
    return high / low if low > 0 else math.inf


def tflops_estimator(seq_len, d, num_layers, include_bwd=False):
    """The reference's hardware-FLOP count of one sequence, in TFLOP:
    (24*l*d^2 + 4*l^2*d) per layer forward; with the backward pass, 2x for it
    and 1x for recomputation (activation checkpointing)."""
    fwd_tflops = (24 * seq_len * (d * d) + 4 * (seq_len * seq_len) * d) * num_layers / 1e12
    return fwd_tflops * 4 if include_bwd else fwd_tflops


def workload_estimator(seq_len, d, gamma=1.0):
    """The reference's workload of one sequence: (24*l*d^2 + gamma*4*l^2*d) / 1e12."""
    return (24 * seq_len * (d * d) + gamma * 4 * (seq_len * seq_len) * d) / 1e12


class BagTables:
    """The reference's bag attributes of the balancing group made of group
    ranks ``ranks``, from every bag's (first group rank, gpus) in bag order."""

    def __init__(self, bags, ranks, gpu_of):
        self.bag_id2gpu_ids, self.gpu_id2bag_id, self.bag_of_global = {}, {}, {}
        for g, (first, gpus) in enumerate(bags):
            if first not in ranks:
                continue
            bag_id = len(self.bag_id2gpu_ids)
            self.bag_of_global[g] = bag_id
            members = [gpu_of[first + p] for p in range(gpus)]
            self.bag_id2gpu_ids[bag_id] = members
            for gpu in members:
                self.gpu_id2bag_id[gpu] = bag_id
        sizes = Counter(len(m) for m in self.bag_id2gpu_ids.values())
        self.parsed_bag_specs = sorted(sizes.items())
        self.bag_gpu_options = [gpus for gpus, _ in self.parsed_bag_specs]
        self.bag_gpu_options2bag_ids = {gpus: [] for gpus in self.bag_gpu_options}
        for bag_id, members in self.bag_id2gpu_ids.items():
            self.bag_gpu_options2bag_ids[len(members)].append(bag_id)

    @classmethod
    def of_spec(cls, spec, replica_size, rank, gpu_of):
        """The bags of a fixed topology spec, for the replica of ``rank``."""
        first_rank = rank // replica_size * replica_size
        bags = [(first_rank + first, gpus) for first, gpus in bags_of_spec(spec)]
        return cls(bags, range(first_rank, first_rank + replica_size), gpu_of)


class ReferenceTables:
    """The reference's step attributes for the balancing group of group rank
    ``rank``, from ``tables`` (knapformer._C's flat plan lists) and the
    global rank of every group rank (``gpu_of``)."""

    def __init__(self, tables, rank, gpu_of):
        self.flat = tables  # the whole step's plan as _C gave it
        size = tables["replica_size"]
        replica = rank // size
        ranks = range(replica * size, (replica + 1) * size)
        gpus = [gpu_of[r] for r in ranks]
        self.balance_gpu_ids = gpus
        bags = BagTables(zip(tables["bag_first_rank"], tables["bag_gpus"]), ranks, gpu_of)
        self.bags = bags
        for name in BAG_ATTRIBUTES:
            setattr(self, name, getattr(bags, name))
        self._bag_of_global = bags.bag_of_global
        self._sequences(tables, ranks, gpu_of)
        self._chunks(tables, ranks, gpu_of)

        before = {gpu_of[r]: tables["workload_before"][r] / _WORKLOAD_UNIT for r in ranks}
        after = {gpu_of[r]: tables["workload_after"][r] / _WORKLOAD_UNIT for r in ranks}
        self.gpu_id2total_workload = before
        self.balance_gpu_id2total_workload = after
        self.per_gpu_capacity = sum(before.values()) / len(gpus)
        self.orig_minmax_workload = (min(before.values()), max(before.values()))
        self.bala_minmax_workload = (min(after.values()), max(after.values()))
        self.bag_id2capacity = {b: self.per_gpu_capacity * len(members)
                                for b, members in self.bag_id2gpu_ids.items()}
        self.bag_id2occupancy = {}
        for b, seq_ids in self.bag_id2assigned_seq_ids.items():
            work = sum(self.seq_id2seq_workload[s] for s in seq_ids)
            capacity = self.bag_id2capacity[b]
            self.bag_id2occupancy[b] = work / capacity if capacity > 0 else 0.0

    def _sequences(self, tables, ranks, gpu_of):
        self.seq_id2gpu_id, self.seq_id2seq_len, self.seq_id2seq_workload = {}, {}, {}
        self.gpu_id2seq_ids = {gpu_of[r]: [] for r in ranks}
        self.gpu_id2seq_lens = {gpu_of[r]: [] for r in ranks}
        self.gpu_id2seq_workloads = {gpu_of[r]: [] for r in ranks}
        self.seq_id2assigned_bag_id = {}
        self.bag_id2assigned_seq_ids = {b: [] for b in self.bag_id2gpu_ids}
        self._seq_id_of = {}
        for src, index, length, bag, work in zip(tables["seq_src_rank"], tables["seq_index"],
                                                 tables["seq_length"], tables["seq_bag"],
                                                 tables["seq_workload"]):
            if src not in ranks:
                continue
            seq_id = len(self.seq_id2seq_len)
            gpu = gpu_of[src]
            self._seq_id_of[(src, index)] = seq_id
            self.seq_id2gpu_id[seq_id] = gpu
            self.seq_id2seq_len[seq_id] = length
            self.seq_id2seq_workload[seq_id] = work / _WORKLOAD_UNIT
            self.gpu_id2seq_ids[gpu].append(seq_id)
            self.gpu_id2seq_lens[gpu].append(length)
            self.gpu_id2seq_workloads[gpu].append(work / _WORKLOAD_UNIT)
            if bag >= 0:  # an empty sequence goes nowhere
                bag_id = self._bag_of_global[bag]
                self.seq_id2assigned_bag_id[seq_id] = bag_id
                self.bag_id2assigned_seq_ids[bag_id].append(seq_id)
        self.balance_gpu_id2seq_ids = {gpu_of[r]: [] for r in ranks}
        for bag_id, seq_ids in self.bag_id2assigned_seq_ids.items():
            for gpu in self.bag_id2gpu_ids[bag_id]:
                self.balance_gpu_id2seq_ids[gpu] = list(seq_ids)

    def _chunks(self, tables, ranks, gpu_of):
        self.chunk_id2gpu_id, self.chunk_id2chunk_len, self.chunk_id2seq_id = {}, {}, {}
        self.gpu_id2chunk_ids = {gpu_of[r]: [] for r in ranks}
        self.gpu_id2chunk_lens = {gpu_of[r]: [] for r in ranks}
        received = {r: [] for r in ranks}
        for src, index, length, dst in zip(tables["chunk_src_rank"], tables["chunk_seq_index"],
                                           tables["chunk_length"], tables["chunk_dst_rank"]):
            if src not in ranks:
                continue
            chunk_id = len(self.chunk_id2seq_id)
            self.chunk_id2gpu_id[chunk_id] = gpu_of[src]
            self.chunk_id2chunk_len[chunk_id] = length
            self.chunk_id2seq_id[chunk_id] = self._seq_id_of[(src, index)]
            self.gpu_id2chunk_ids[gpu_of[src]].append(chunk_id)
            self.gpu_id2chunk_lens[gpu_of[src]].append(length)
            received[dst].append(chunk_id)
        # Computed in chunk id order on each gpu, as the route delivers them.
        self.balance_chunk_id2gpu_id, self.balance_chunk_id2chunk_len = {}, {}
        self.balance_gpu_id2chunk_ids, self.balance_gpu_id2chunk_lens = {}, {}
        for r in ranks:
            gpu = gpu_of[r]
            self.balance_gpu_id2chunk_ids[gpu] = tuple(received[r])
            self.balance_gpu_id2chunk_lens[gpu] = tuple(self.chunk_id2chunk_len[c]
                                                        for c in received[r])
            for c in received[r]:
                self.balance_chunk_id2gpu_id[c] = gpu
                self.balance_chunk_id2chunk_len[c] = self.chunk_id2chunk_len[c]

    def summary(self):
        """The reference's get_routing_plan_summary() entries."""
        return {key: getattr(self, key) for key in SUMMARY_KEYS}


def chunk_list(tables):
    """The whole step's chunk table as `knapformer plan` prints it."""
    return [{"src_rank": s, "seq_index": i, "offset": o, "length": n, "dst_rank": d}
            for s, i, o, n, d in zip(tables["chunk_src_rank"], tables["chunk_seq_index"],
                                     tables["chunk_offset"], tables["chunk_length"],
                                     tables["chunk_dst_rank"])]
