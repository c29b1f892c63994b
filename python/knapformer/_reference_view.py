"""SequenceBalancer's view in the KnapFormer reference implementation's
terms: the attributes and methods that mirror the reference balancer's API
beside knapformer's own. Its tracking of balance over a run
(turn_on_tracking, the tracked_* lists, print_tracking_results) and its
run-time metrics; its plan and bag tables (gpu_id2seq_lens,
chunk_id2seq_id, bag_id2gpu_ids, ...: read-only properties derived from the
step's plan), bag_id2process_group, local_seq_lens and ulysses_bag (the
reference's UlyssesBag for this rank's bag).

A mixin of SequenceBalancer (ReferenceView), apart from it so that the
balancer's own API reads without the reference's; the tables themselves are
made by _reference_tables.py from the plan, which knows nothing of the
balancer. It reads what SequenceBalancer sets: _impl, _group, _gpu_of,
_tables, _spec_bags, _bag_process_groups, this_gpu_id, metrics, and its
_device()."""

import math
import time

from knapformer import _reference_tables as reference
from knapformer._reference_tables import tflops_estimator


class ReferenceView:
    """The reference implementation's attributes and methods of SequenceBalancer."""

    # -- the reference's tracking of balance over a run ----------------------

    def turn_on_tracking(self, num_layers=1, include_bwd=False):
        """From the next plan_routing on, records every step's
        per_gpu_capacity, max/min workload before and after balancing and
        hardware TFLOPs of its balancing group (``tracked_*`` lists), as the
        reference does; ``num_layers`` and ``include_bwd`` scale the TFLOPs
        (tflops_estimator)."""
        self._track_from_scratch(True)
        self.num_layers = num_layers
        self.include_bwd = include_bwd

    def turn_off_tracking(self):
        """Stops tracking and empties the tracked lists."""
        self._track_from_scratch(False)

    def _track_from_scratch(self, tracking):
        self.tracking = tracking
        self.tracked_per_gpu_capacity = []
        self.tracked_original_imbalance_ratio = []
        self.tracked_balanced_imbalance_ratio = []
        self.tracked_tflops = []

    def tracking_results(self):
        """Mean and (population) standard deviation of the tracked
        per_gpu_capacity and imbalance ratios: {name: (mean, std)}."""
        def mean_std(values):
            if not values:
                return math.nan, math.nan
            mean = sum(values) / len(values)
            if math.isinf(mean):
                return mean, math.nan
            return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return {"Per GPU Capacity": mean_std(self.tracked_per_gpu_capacity),
                "Original Imbalance Ratio": mean_std(self.tracked_original_imbalance_ratio),
                "Balanced Imbalance Ratio": mean_std(self.tracked_balanced_imbalance_ratio)}

    def print_tracking_results(self):
        """Prints tracking_results(), one line per figure, as the reference
        logs them."""
        for name, (mean, std) in self.tracking_results().items():
            print(f"{name}: {mean}, std: {std}", flush=True)

    def _track(self):
        tables = self._reference_tables("turn_on_tracking")
        self.tracked_per_gpu_capacity.append(tables.per_gpu_capacity)
        self.tracked_original_imbalance_ratio.append(
            reference.ratio(list(tables.gpu_id2total_workload.values())))
        self.tracked_balanced_imbalance_ratio.append(
            reference.ratio(list(tables.balance_gpu_id2total_workload.values())))
        d_model = self._impl.planned_d_model
        self.tracked_tflops.append(sum(
            tflops_estimator(length, d_model, self.num_layers, self.include_bwd)
            for length in tables.seq_id2seq_len.values()))

    def _count_step(self):
        """The reference's run-time metrics, at the end of a step."""
        end = time.time()
        total_tokens = self._impl.planned_total_tokens
        self.metrics["end_time"] = end
        self.metrics["duration_sec"] = end - self.metrics["start_time"]
        self.metrics["total_tokens"] = total_tokens
        self.metrics["avg_per_gpu_tokens"] = total_tokens / self._impl.world_size

    # -- the reference's plan tables -----------------------------------------

    def _whole_plan(self):
        """This step's reference tables (made on first use), or None where
        this rank has only its slice of the plan (per-rank planner mode)."""
        if self._tables is None:
            flat = self._impl.tables()
            if flat is not None:
                self._tables = reference.ReferenceTables(flat, self._group.rank(), self._gpu_of)
        return self._tables

    def _reference_tables(self, name):
        """This step's reference tables; AttributeError before the first
        step, RuntimeError in the per-rank planner mode, naming `name`."""
        if not self._impl.planned:
            raise AttributeError(
                f"'SequenceBalancer' object has no attribute '{name}' before the first "
                "plan_routing (it describes a planned step)")
        tables = self._whole_plan()
        if tables is None:
            raise RuntimeError(
                f"SequenceBalancer.{name}: this rank has only its own slice of the step's "
                "plan (planner_mode='per-rank'); the reference's whole-step tables need "
                "planner_mode='group' (the default) or local planning")
        return tables

    def _bag_tables(self, name):
        """The bags of this rank's balancing group: the last planned step's
        (under auto, its chosen layout), else the topology's."""
        if self._tables is not None:
            return self._tables.bags
        if self._spec_bags is not None:
            return self._spec_bags
        return self._reference_tables(name).bags

    @property
    def bag_id2process_group(self):
        """Each bag of this balancing group -> its process group (None for a
        one-GPU bag; torch's non-member handle for a bag without this rank)."""
        bags = self._bag_tables("bag_id2process_group")
        return {b: (self._bag_process_groups.get(tuple(members)) if len(members) > 1 else None)
                for b, members in bags.bag_id2gpu_ids.items()}

    @property
    def local_seq_lens(self):
        """This rank's lengths of the planned step, int32 on its device."""
        if not self._impl.planned:
            raise AttributeError("'SequenceBalancer' object has no attribute 'local_seq_lens' "
                                 "before the first plan_routing (it describes a planned step)")
        return self._impl.lengths("sequence", str(self._device()))

    @property
    def ulysses_bag(self):
        """This rank's bag of the planned step, with the reference's
        UlyssesBag attributes and its pre_attn / post_attn."""
        return _UlyssesBagView(self)


class _UlyssesBagView:
    """The reference's UlyssesBag for this rank's bag of the planned step:
    its tables (the balancing group's, after routing), this rank's chunk and
    attention lengths, and pre_attn / post_attn through the balancer."""

    def __init__(self, balancer):
        tables = balancer._reference_tables("ulysses_bag")
        self._balancer = balancer
        self.this_gpu_id = balancer.this_gpu_id
        self.bag_id = tables.bags.gpu_id2bag_id[self.this_gpu_id]
        self.gpu_ids = tables.bag_id2gpu_ids[self.bag_id]
        self.gpu_id2chunk_ids = tables.balance_gpu_id2chunk_ids
        self.gpu_id2chunk_lens = tables.balance_gpu_id2chunk_lens
        self.chunk_id2gpu_id = tables.balance_chunk_id2gpu_id
        self.chunk_id2chunk_len = tables.balance_chunk_id2chunk_len
        self.chunk_id2seq_id = tables.chunk_id2seq_id
        self.seq_id2seq_len = tables.seq_id2seq_len
        self.process_group = balancer.bag_id2process_group[self.bag_id]
        device = str(balancer._device())
        self.this_chunk_lens = balancer._impl.lengths("chunk", device)
        self.this_attn_seq_lens = balancer._impl.lengths("attention", device)

    def pre_attn(self, packed_q, packed_k, packed_v):
        return self._balancer.pre_attn(packed_q, packed_k, packed_v)

    def post_attn(self, packed_chunks):
        return self._balancer.post_attn(packed_chunks)


def _step_attribute(name):
    def get(self):
        return getattr(self._reference_tables(name), name)
    get.__name__ = name
    get.__doc__ = (f"The reference implementation's ``{name}`` for the last planned step "
                   "(this rank's balancing group; read-only, derived from the plan: editing "
                   "it changes no route).")
    return property(get)


def _bag_attribute(name):
    def get(self):
        return getattr(self._bag_tables(name), name)
    get.__name__ = name
    get.__doc__ = (f"The reference implementation's ``{name}`` of this rank's balancing "
                   "group (under auto: the last planned step's layout; read-only).")
    return property(get)


for _name in reference.STEP_ATTRIBUTES:
    setattr(ReferenceView, _name, _step_attribute(_name))
for _name in reference.BAG_ATTRIBUTES:
    setattr(ReferenceView, _name, _bag_attribute(_name))
del _name
