"""SequenceBalancer with the KnapFormer reference implementation's API, over
the trainer's torch.distributed process group."""

import torch
import torch.distributed as dist

from knapformer import _C
from knapformer._torch_compat import device_backend

_COST_MODELS = ("transformer", "uniform", "linear")


def _global_rank(group, rank):
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


def _make_bag_groups(group, bags, backend):
    """One process group per multi-GPU bag, keyed by the bag's ranks in
    ``group``. dist.new_group must be entered by every process of the job in
    the same order (torch's rule), so every process makes every bag's group:
    those of its own world directly, those of other groups (when ``group`` is
    not the default one) after an all-gather of everyone's bags."""
    default = dist.distributed_c10d._get_default_group()
    to_global = [_global_rank(group, r) for r in range(group.size())]
    mine = {tuple(to_global[r] for r in bag): tuple(bag) for bag in bags}
    if group is default:
        every = list(mine)
    else:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, sorted(mine))
        every = sorted({tuple(bag) for bags_of_rank in gathered for bag in bags_of_rank})
    bag_groups = {}
    for global_ranks in every:
        made = dist.new_group(list(global_ranks), backend=backend)
        if global_ranks in mine and group.rank() in mine[global_ranks]:
            bag_groups[mine[global_ranks]] = made
    return bag_groups


def _make_host_groups(group, bags):
    """Gloo twins of ``group`` and of its multi-GPU bags, under the same rule
    as _make_bag_groups: every process makes every twin, in the same order
    (over a group other than the default one, after an all-gather of every
    process's group)."""
    default = dist.distributed_c10d._get_default_group()
    mine = tuple(_global_rank(group, r) for r in range(group.size()))
    if group is default:
        every = [mine]
    else:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        every = sorted(set(gathered))
    host_group = None
    for global_ranks in every:
        made = dist.new_group(list(global_ranks), backend="gloo")
        if global_ranks == mine:
            host_group = made
    host_bag_groups = _make_bag_groups(group, bags, "gloo") if bags or group is not default else {}
    return host_group, host_bag_groups


class SequenceBalancer:
    """Balances the sequences of a training step over compute bags of ranks.

    ``bag_specs`` is the topology of one balancing group, e.g.
    ``"g1n2+g2n1+g4n1"`` (N bags of G GPUs per term); the process group's
    ranks are world_size / G replicas of it. ``"auto"`` (or
    ``"auto:max_bag=4"``) lets the planner choose the bags every step,
    aligned power-of-two blocks within a node, pricing Ulysses traffic with
    ``machine``; ``get_routing_plan_summary()["layout"]`` names the step's
    choice. Creating it is collective over the process group, and over the
    whole job when the topology has multi-GPU bags (their groups come from
    torch.distributed.new_group; under auto, one per block any step may
    use, made once here).

    Keyword arguments:
      process_group: the group to balance over (default: the default group).
        Gloo on CPU tensors, NCCL on CUDA tensors.
      planner_address: host:port of a planner service (default: the
        KNAPFORMER_PLANNER_ADDRESS environment variable; none = every rank
        plans locally from an all-gather of the lengths). A service that
        fails or is absent makes every rank plan locally, together.
      job_id: the service's name for this run (default: KNAPFORMER_JOB_ID,
        else "default").
      d_model: the cost model's model width; default: plan_routing's
        token_dim every step.
      max_tokens_per_gpu: at most this many tokens on any GPU (0 = no cap).
      cost_model: "transformer" (24*l*d^2 + gamma*4*l^2*d), "uniform" or
        "linear".
      locality: let the plan trade WIR (never max/mean) for fewer moved
        tokens. None = the planner's own setting.
      planner_mode: "group" (default: rank 0 asks the service for the
        whole group, the plan is broadcast) or "per-rank" (every rank asks
        for its own slice); see docs/service.md.
      group_id, planner_deadline (seconds per planner call), first_step,
      use_fitted_gamma: see docs/python.md.
      machine: for "auto", a dict of any of flops_per_second,
        intra_node_bytes_per_second, inter_node_bytes_per_second,
        gpus_per_node, element_bytes, blocks_per_route (the rest: an H100
        node of 8, bf16; docs/planner.md). Every rank must pass the same.
      agree_on_errors: every exchange first agrees on every rank's verdict
        (one small all-gather), so one rank's mistake raises on every rank
        at once (default). False saves that all-gather: a mistake then
        raises on its rank only, and its peers wait in the exchange until
        that process exits or the group's timeout.

    Every method that moves tensors is collective (every rank calls it, in
    the same order) and differentiable. Errors raise ValueError (invalid
    input) or RuntimeError carrying the C++ message, and are agreed: a
    mistake on one rank (a bad length, a tensor with the wrong rows, dtype
    or device) raises on every rank of the call's group (the process group
    for plan_routing and the routes, the bag for pre/post_attn) with the
    lowest failing rank's reason ("rank 2: ..."), at once, and the next call
    works (for the tensor calls: unless agree_on_errors=False). A peer that dies raises RuntimeError (UNAVAILABLE or
    DEADLINE_EXCEEDED) on every survivor within the process group's
    timeout; the balancer is unusable after that. Backward exchanges run in
    the reverse of the forward order on every rank.
    """

    def __init__(self, bag_specs, gamma=1.0, *, process_group=None, planner_address=None,
                 job_id=None, d_model=None, max_tokens_per_gpu=0, cost_model="transformer",
                 locality=True, group_id=None, planner_deadline=None, first_step=0,
                 use_fitted_gamma=False, agree_on_errors=True, planner_mode=None,
                 machine=None, _metadata_on_gloo=False):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("SequenceBalancer: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first")
        if not isinstance(bag_specs, str):
            raise ValueError(f"bag_specs: needs a topology string such as 'g1n2+g2n1+g4n1', "
                             f"got {type(bag_specs).__name__}")
        if cost_model not in _COST_MODELS:
            raise ValueError(f"cost_model: '{cost_model}' is not one of "
                             f"{', '.join(_COST_MODELS)}")
        group = process_group if process_group is not None else \
            dist.distributed_c10d._get_default_group()
        backend = device_backend(group)
        device = "cpu" if backend == "gloo" else f"cuda:{torch.cuda.current_device()}"
        if machine is not None and not isinstance(machine, dict):
            raise ValueError(f"machine: needs a dict of machine fields, got "
                             f"{type(machine).__name__}")
        machine = {} if machine is None else machine
        bags = _C.multi_gpu_bags(bag_specs, group.size(), machine)
        default = dist.distributed_c10d._get_default_group()
        # Over a group other than the default one, every process takes part in
        # making every group's bags, bags of its own or not.
        bag_groups = _make_bag_groups(group, bags, backend) if bags or group is not default else {}

        args = _C._BalancerArgs()
        args.device = device
        args.topology = bag_specs
        args.gamma = float(gamma)
        args.planner_address = planner_address
        args.job_id = job_id
        args.group_id = group_id
        args.d_model = 0 if d_model is None else int(d_model)
        args.max_tokens_per_gpu = int(max_tokens_per_gpu)
        args.cost_model = cost_model
        args.locality = None if locality is None else bool(locality)
        args.planner_deadline_s = None if planner_deadline is None else float(planner_deadline)
        args.planner_mode = None if planner_mode is None else str(planner_mode)
        args.first_step = int(first_step)
        args.use_fitted_gamma = bool(use_fitted_gamma)
        args.agree_on_errors = bool(agree_on_errors)
        args.machine = machine
        if d_model is not None and not 1 <= args.d_model <= 65536:
            raise ValueError(f"d_model: {d_model} is outside [1, 65536]")
        self.bag_specs = bag_specs
        self.gamma = gamma
        host_group, host_bag_groups = None, {}
        if backend == "nccl" or _metadata_on_gloo:
            # Gloo twins of the group and its bags for the small host-side
            # collectives (count checks, the length all-gather, error
            # agreement), so that they cost no GPU round trip and host sync.
            host_group, host_bag_groups = _make_host_groups(group, bags)
        self._impl = _C._SequenceBalancer(group, bag_groups, args, host_group, host_bag_groups)

    # -- planning ---------------------------------------------------------

    def plan_routing(self, local_seq_lens, token_dim=None):
        """Collective: plans this step. ``local_seq_lens`` are this rank's
        sequence lengths in packing order (a list of ints or a 1-D integer
        tensor; empty and zero-length are fine). ``token_dim`` is the hidden
        size: the cost model's d_model unless one was given at construction.
        A bad input on any rank raises on every rank."""
        # Checked in C++ after this rank has joined the step, so that a rank
        # that gets it wrong alone fails the step on every rank, not a hang.
        self._impl.plan_routing(local_seq_lens, token_dim)

    def prefetch_routing(self, local_seq_lens, token_dim=None):
        """Plan ahead: starts planning the next step (the next
        plan_routing's) with these lengths, while this step computes, so
        that plan_routing finds its plan ready. Call it on every rank (or on
        none) as soon as the data loader has the next batch; collective in
        the default planner mode, and only the planner's RPC runs in the
        background. The next plan_routing must pass the same lengths (and
        token_dim): otherwise it raises on every rank, naming the rank and
        the step."""
        self._impl.prefetch_routing(local_seq_lens, token_dim)

    def record_compute_seconds(self, seconds):
        """This rank's measured compute time of the current step, sent with
        the next plan for the service's online gamma fit."""
        self._impl.record_compute_seconds(float(seconds))

    # -- moving tensors -----------------------------------------------------

    def _refuse(self, what, message):
        """Raises ``message`` (ValueError) on this rank and, through the
        call's agreement, on every rank of its group: a rank must not fail
        alone before a collective its peers have entered."""
        self._impl.refuse(what, message)
        raise ValueError(message)  # not reached: refuse raises

    def _with_features(self, what, packed_seqs, packed_features):
        if not isinstance(packed_seqs, torch.Tensor):
            self._refuse(what, f"{what}: packed_seqs must be a tensor, got "
                               f"{type(packed_seqs).__name__}")
        tensors = [packed_seqs]
        if packed_features is not None:
            for i, feature in enumerate(packed_features):
                if not isinstance(feature, torch.Tensor):
                    self._refuse(what, f"{what}: packed_features[{i}] must be a tensor, got "
                                       f"{type(feature).__name__}")
                if feature.dim() < 1 or feature.shape[0] != packed_seqs.shape[0]:
                    rows = feature.shape[0] if feature.dim() else "no"
                    self._refuse(what, f"{what}: packed_features[{i}] has {rows} rows, "
                                       f"packed_seqs {packed_seqs.shape[0]}")
                tensors.append(feature)
        return tensors

    def _tensors(self, what, **named):
        for name, value in named.items():
            if not isinstance(value, torch.Tensor):
                self._refuse(what, f"{what}: {name} must be a tensor, got {type(value).__name__}")
        return list(named.values())

    def route(self, packed_seqs, packed_features=None):
        """Collective: ``packed_seqs`` [tokens, dim] (this rank's sequences
        packed in plan_routing's order) and per-token ``packed_features``
        (any dtypes) -> ``(chunk_lens, seqs, features)``: the chunks this rank
        computes on. ``chunk_lens`` is int32 on the input's device;
        ``features`` keep their dtypes and are None when none were given."""
        tensors = self._with_features("route", packed_seqs, packed_features)
        moved = self._impl.route(tensors)
        lengths = self._impl.lengths("chunk", str(packed_seqs.device))
        return lengths, moved[0], (moved[1:] if packed_features is not None else None)

    def reverse_route(self, packed_seqs, packed_features=None):
        """Collective: the inverse of route -> ``(seq_lens, seqs, features)``,
        every token back where it came from (gradients too)."""
        tensors = self._with_features("reverse_route", packed_seqs, packed_features)
        moved = self._impl.reverse_route(tensors)
        lengths = self._impl.lengths("sequence", str(packed_seqs.device))
        return lengths, moved[0], (moved[1:] if packed_features is not None else None)

    def pre_attn(self, packed_q, packed_k, packed_v):
        """Collective within the bag (Ulysses): q, k, v of the routed tokens,
        [tokens, heads, head_dim] -> ``(seq_lens, q, k, v)`` of whole
        sequences with heads / bag_gpus heads, in one exchange. ``seq_lens``
        (int32) is what a varlen attention kernel's cu_seqlens are made of."""
        moved = self._impl.pre_attn(
            self._tensors("pre_attn", packed_q=packed_q, packed_k=packed_k, packed_v=packed_v))
        lengths = self._impl.lengths("attention", str(packed_q.device))
        return lengths, moved[0], moved[1], moved[2]

    def post_attn(self, packed_out):
        """Collective within the bag: attention's output -> ``(chunk_lens,
        out)`` back on the routed tokens with every head."""
        moved = self._impl.post_attn(self._tensors("post_attn", packed_out=packed_out))
        lengths = self._impl.lengths("chunk", str(packed_out.device))
        return lengths, moved[0]

    # -- reporting ----------------------------------------------------------

    def get_routing_plan_summary(self):
        """The last planned step (local, no communication; RuntimeError
        before the first plan_routing): step, source
        ("planner service" or "local planner"), every rank's workload before
        and after (``workload_before``/``workload_after``), ``wir_*``,
        ``max_over_mean_*``, ``total_tokens``, ``moved_tokens``,
        ``token_bytes`` (of this step's route; the previous step's before it)
        and ``moved_bytes``, and this rank's ``seq_lens``, ``chunk_lens`` and
        ``attention_seq_lens``."""
        return self._impl.summary()

    def imbalance_report(self):
        """print_imbalance's text."""
        s = self.get_routing_plan_summary()
        lines = []
        for tag, workloads in (("original", s["workload_before"]),
                               ("balanced", s["workload_after"])):
            mean = sum(workloads) / len(workloads) if workloads else 0.0
            shares = " ".join(f"{r}: {w / mean:.2f}" if mean > 0 else f"{r}: 0"
                              for r, w in enumerate(workloads))
            lines.append(f"{tag} - per_gpu_capacity={mean:.4g} - {shares}")
        moved_bytes = f" ({s['moved_bytes']} bytes)" if s["token_bytes"] else ""
        lines.append(f"max/min workload ratio: {s['wir_before']:.4f} ---> {s['wir_after']:.4f}; "
                     f"max/mean {s['max_over_mean_before']:.4f} ---> "
                     f"{s['max_over_mean_after']:.4f}; moved {s['moved_tokens']} of "
                     f"{s['total_tokens']} tokens{moved_bytes}; step {s['step']} "
                     f"from the {s['source']}")
        return "\n".join(lines)

    def print_imbalance(self):
        """Prints every rank's workload relative to the mean, before and after
        balancing, WIR and max/mean, and the tokens moved (local)."""
        print(self.imbalance_report(), flush=True)

    @property
    def rank(self):
        return self._impl.rank

    @property
    def world_size(self):
        return self._impl.world_size

    @property
    def bag_gpus(self):
        """GPUs in this rank's compute bag."""
        return self._impl.bag_gpus

    @property
    def step(self):
        return self._impl.step
