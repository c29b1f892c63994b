"""SequenceBalancer with the KnapFormer reference implementation's API, over
the trainer's torch.distributed process group.

The class's other jobs live in modules of their own: the process groups it
makes (_process_groups.py), its arguments' checks (_balancer_arguments.py),
the switch to torch.compile's custom ops (_compile_switch.py, a mixin) and
the reference implementation's attributes and tracking (_reference_view.py,
a mixin)."""

import time

import torch
import torch.distributed as dist

from knapformer import _C
from knapformer import _compile
from knapformer import _masks
from knapformer import _reference_tables as reference
from knapformer._balancer_arguments import _arguments
from knapformer._collectives import all_gather_bytes
from knapformer._compile_switch import CompileSwitch
from knapformer._process_groups import _global_rank, _make_bag_groups, _make_host_groups
from knapformer._reference_tables import tflops_estimator, workload_estimator  # noqa: F401
from knapformer._reference_view import ReferenceView
from knapformer._torch_compat import device_backend

_Tensor = torch.Tensor


class SequenceBalancer(ReferenceView, CompileSwitch):
    """Balances the sequences of a training step over compute bags of ranks.

    ``bag_specs`` is the topology of one balancing group, e.g.
    ``"g1n2+g2n1+g4n1"`` (N bags of G GPUs per term); the process group's
    ranks are world_size / G replicas of it. ``"auto"`` (or
    ``"auto:max_bag=4"``) lets the planner choose the bags every step,
    aligned power-of-two blocks within a node, pricing Ulysses traffic with
    ``machine``; ``get_routing_plan_summary()["layout"]`` names the step's
    choice. Creating it is collective over the process group, and over the
    whole job when the topology has multi-GPU bags or several replicas
    (their groups come from torch.distributed.new_group; under auto, one
    per block any step may use, made once here).

    The reference implementation's attributes are here too, with its names,
    types and meaning: ``this_gpu_id``, ``balance_process_group`` (the
    rank's replica), ``balance_gpu_ids``, the bag tables
    (``bag_id2gpu_ids``, ...) and, after plan_routing, the step's tables
    (``gpu_id2seq_lens``, ``chunk_id2seq_id``, ``balance_gpu_id2chunk_lens``,
    ...; docs/python.md lists them): read-only, derived from the step's
    plan for this rank's replica, made when first read. They need the whole
    plan on this rank, which the per-rank planner mode does not give
    (RuntimeError there). Tracking (turn_on_tracking, ``tracked_*``,
    print_tracking_results) and nice_print as in the reference.

    Keyword arguments:
      process_group: the group to balance over (default: the default group).
        Gloo on CPU tensors, NCCL on CUDA tensors.
      planner_address: the planner service as a gRPC target, host:port or
        several replicas (dns:///NAME:PORT, ipv4:a:p,b:q: group mode only;
        a step one of them loses is asked from another) (default: the
        KNAPFORMER_PLANNER_ADDRESS environment variable; none = every rank
        plans locally from an all-gather of the lengths). A service that
        fails or is absent makes every rank plan locally, together.
      job_id: the service's name for this run (default: KNAPFORMER_JOB_ID,
        else "default").
      d_model: the cost model's model width; default: plan_routing's
        token_dim every step.
      max_tokens_per_gpu: at most this many tokens on any GPU (0 = no cap).
      cost_model: "transformer" (24*l*d^2 + gamma*4*l^2*d), "uniform",
        "linear" or "measured" (with ``cost_table``).
      cost_table: the measured cost model's table, a dict as ``knapformer
        calibrate --table`` (or ``knapformer replay --cost-table``) writes
        it, json.load of the file; its d_model is the model width.
      locality: let the plan trade WIR (never max/mean) for fewer moved
        tokens. None = the planner's own setting.
      planner_mode: "group" (default: rank 0 asks the service for the
        whole group, the plan is broadcast) or "per-rank" (every rank asks
        for its own slice); see docs/service.md.
      planner_token: the job token of a planner run with --auth=token
        (``knapformer token --job ID --ttl 30d``), sent with every call
        (default: the KNAPFORMER_PLANNER_TOKEN environment variable). Never
        in clear over a network: refused without ``planner_tls`` unless the
        address is loopback or a unix socket, or ``planner_mesh_tls``.
      planner_mesh_tls: True where a service mesh encrypts the connection
        to the planner, so the token may go over plaintext (default:
        KNAPFORMER_PLANNER_MESH_TLS).
      planner_tls: TLS to the planner, a dict of PEM file paths: "ca" (the
        planner's certificate is verified against it), "cert" and "key"
        (this client's, for mutual TLS) (default: KNAPFORMER_PLANNER_TLS_CA,
        _CERT, _KEY; none = plaintext). docs/service.md#security.
      group_id, planner_deadline (seconds per step's planner request), first_step,
      use_fitted_gamma: see docs/python.md.
      machine: for "auto", a dict of any of flops_per_second,
        intra_node_bytes_per_second, inter_node_bytes_per_second,
        gpus_per_node, element_bytes, blocks_per_route (the rest: an H100
        node of 8, bf16; docs/planner.md). Every rank must pass the same.
      require_planner: a step the planner service does not plan (down,
        unreachable, a mistyped address) raises RuntimeError (UNAVAILABLE)
        on every rank instead of being planned locally. Default: the
        KNAPFORMER_REQUIRE_PLANNER environment variable (1/true), else
        False; needs a planner address. Without it, the summary's
        ``local_steps`` and ``local_reason`` count the steps planned locally.
      log_steps: rank 0 logs one line per step to stderr: where its plan
        came from (the planner service or the local planner, and why
        locally), the bags, max/mean before and after, the tokens moved and
        how long the step waited for its plan. Default: the
        KNAPFORMER_LOG_STEPS environment variable (1/true), else False.
      rank_speeds: balance time, not FLOPs, on GPUs of unequal speeds: a
        list of relative speeds, one per rank (any scale; [1, 1, 0.5, 1]
        gives rank 2 half a share), or "learned": each rank's speed learned
        online from record_compute_seconds (a rank that runs slow gets
        less work within a few steps, and its share back when it recovers).
        Default: one speed. Needs group mode with a planner (the default);
        docs/planner.md, "Speeds".
      agree_on_errors: one rank's mistake in an exchange raises on every
        rank at once (default True): the first exchange of each call agrees
        on every rank's verdict and tensors in one small all-gather, later
        ones (the next layers, the next steps) carry one status byte per rank
        with their rows. "every_exchange" (debugging): the all-gather before
        every exchange. False: a mistake raises on its rank only, and its
        peers wait in the exchange until that process exits or the group's
        timeout.

    Creating it first agrees on every rank's settings (topology, d_model,
    gamma, cost model, locality, token cap, planner address and mode,
    require_planner, job and group ids, first_step, machine): one that
    differs raises RuntimeError (FAILED_PRECONDITION) on every rank at once,
    naming the setting, its values and their ranks.

    Every method that moves tensors is collective (every rank calls it, in
    the same order) and differentiable. Errors raise ValueError (invalid
    input) or RuntimeError carrying the C++ message, and are agreed: a
    mistake on one rank (a bad length, a tensor with the wrong rows, dtype
    or device) raises on every rank of the call's group (the process group
    for plan_routing and the routes, the bag for pre/post_attn) with the
    lowest failing rank's reason ("rank 2: ...", global ranks) or naming the
    ranks whose tensors differ, the field and both values, at once, and the next call
    works (for the tensor calls: unless agree_on_errors=False). A peer that
    dies raises RuntimeError (UNAVAILABLE or DEADLINE_EXCEEDED) on every
    survivor within the process group's timeout; the balancer is unusable
    after that. Backward exchanges run in
    the reverse of the forward order on every rank.
    """

    def __init__(self, bag_specs, gamma=1.0, *, process_group=None, planner_address=None,
                 job_id=None, d_model=None, max_tokens_per_gpu=0, cost_model="transformer",
                 locality=True, group_id=None, planner_deadline=None, first_step=0,
                 use_fitted_gamma=False, agree_on_errors=True, planner_mode=None,
                 machine=None, require_planner=None, planner_token=None, planner_tls=None,
                 log_steps=None, cost_table=None, planner_mesh_tls=None, rank_speeds=None,
                 _metadata_on_gloo=False):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("SequenceBalancer: torch.distributed is not initialized; call "
                               "torch.distributed.init_process_group first")
        group = process_group if process_group is not None else \
            dist.distributed_c10d._get_default_group()
        backend = device_backend(group)
        device = "cpu" if backend == "gloo" else f"cuda:{torch.cuda.current_device()}"
        # Every rank's settings are agreed before anything else collective,
        # and before anything one rank could refuse alone: a rank configured
        # differently would otherwise make other groups than its peers (a
        # hang), or fail while they wait for it.
        failure = None
        try:
            args = _arguments(bag_specs, gamma, device, planner_address, job_id, group_id,
                              d_model, max_tokens_per_gpu, cost_model, locality,
                              planner_deadline, planner_mode, require_planner, first_step,
                              use_fitted_gamma, agree_on_errors, machine,
                              planner_token=planner_token, planner_tls=planner_tls,
                              log_steps=log_steps, cost_table=cost_table,
                              planner_mesh_tls=planner_mesh_tls, rank_speeds=rank_speeds)
            bags = _C.multi_gpu_bags(bag_specs, group.size(), args.machine)
            replica_size = _C.replica_size(bag_specs, group.size(), args.machine)
            mine = _C._encoded_settings(args)
        except (ValueError, TypeError, RuntimeError) as error:
            failure = error
            mine = _C._encoded_refusal(f"{type(error).__name__}: {error}")
        # Typed reports (client/settings_agreement.proto), not pickles.
        everyone = all_gather_bytes(mine, group, device)
        if failure is not None:
            raise failure
        try:
            _C._check_settings_agree(everyone)
        except ValueError as refused:  # another rank refused its arguments
            raise ValueError(f"SequenceBalancer: {refused}") from None
        default = dist.distributed_c10d._get_default_group()
        # Over a group other than the default one, every process takes part in
        # making every group's bags, bags of its own or not.
        self._bag_process_groups = {}
        bag_groups = _make_bag_groups(group, bags, backend, self._bag_process_groups) \
            if bags or group is not default else {}
        # The reference balances each replica alone over its own group.
        replicas = [tuple(range(first, first + replica_size))
                    for first in range(0, group.size(), replica_size)]
        if len(replicas) > 1 or group is not default:
            made = _make_bag_groups(group, replicas if len(replicas) > 1 else [], backend)
            balance_group = made.get(replicas[group.rank() // replica_size], group)
        else:
            balance_group = group

        self.bag_specs = bag_specs
        self.gamma = gamma
        self._group = group
        self._gpu_of = [_global_rank(group, r) for r in range(group.size())]
        self._tables = None  # the step's reference tables, made when first read
        self._spec_bags = None if bag_specs.startswith("auto") else \
            reference.BagTables.of_spec(bag_specs, replica_size, group.rank(), self._gpu_of)
        self.this_gpu_id = dist.get_rank()
        self.this_device = torch.device("cpu") if device == "cpu" else \
            torch.cuda.current_device()
        self.balance_process_group = balance_group
        first = group.rank() // replica_size * replica_size
        self.balance_gpu_ids = self._gpu_of[first:first + replica_size]
        self.metrics = {"start_time": 0, "end_time": 0, "total_tokens": 0, "duration_sec": 0,
                        "avg_per_gpu_tokens": 0}
        self.tracking = False
        host_group, host_bag_groups = None, {}
        if backend == "nccl" or _metadata_on_gloo:
            # Gloo twins of the group and its bags for the small host-side
            # collectives (count checks, the length all-gather, error
            # agreement), so that they cost no GPU round trip and host sync.
            host_group, host_bag_groups = _make_host_groups(group, bags)
        self._impl = _C._SequenceBalancer(group, bag_groups, args, host_group, host_bag_groups)
        # For torch.compile: the custom ops' handle and the step's shape
        # carriers (knapformer/_compile.py), made by plan_routing.
        self._handle = _compile.register(self) if _compile.available() else None
        self._shapes = None
        # Plans made (plan_routing calls), and the count when the last
        # exchange outside a backward pass ran (_eager).
        self._plans = 0
        self._forward_plans = None
        self._device_names = {}

    # -- planning ---------------------------------------------------------

    def plan_routing(self, local_seq_lens, token_dim=None, attn_masks=None):
        """Collective: plans this step. ``local_seq_lens`` are this rank's
        sequence lengths in packing order (a list of ints or a 1-D integer
        tensor; empty and zero-length are fine). ``token_dim`` is the hidden
        size: the cost model's d_model unless one was given at construction.
        ``attn_masks`` (optional) gives each sequence's attention mask, one
        per length: ``"full"``, ``"causal"``, ``{"window": W}`` (causal, each
        token sees its W latest keys) or ``{"spans": [[n, "full"|"causal"],
        ...]}`` (block-causal: each span attends to every earlier span, and
        to itself fully or causally; the n add up to the length). The plan
        then prices each sequence's attention by the pairs it attends. In a
        step where any rank gives masks, every rank with sequences must.
        A bad input on any rank raises on every rank."""
        self.metrics["start_time"] = time.time()
        self._tables = None
        self._plans += 1
        masks_json, masks_error = _masks.to_json(attn_masks)
        # Checked in C++ after this rank has joined the step, so that a rank
        # that gets it wrong alone fails the step on every rank, not a hang.
        self._impl.plan_routing(local_seq_lens, token_dim, masks_json, masks_error)
        if self._handle is not None:
            self._shapes = self._shape_carriers()
        if self.tracking:
            self._track()

    def prefetch_routing(self, local_seq_lens, token_dim=None, attn_masks=None):
        """Plan ahead: starts planning the next step (the next
        plan_routing's) with these lengths, while this step computes, so
        that plan_routing finds its plan ready. Call it on every rank (or on
        none) as soon as the data loader has the next batch; collective in
        the default planner mode, and only the planner's RPC runs in the
        background. The next plan_routing must pass the same lengths (and
        token_dim and attn_masks): otherwise it raises on every rank, naming
        the rank and the step."""
        masks_json, masks_error = _masks.to_json(attn_masks)
        self._impl.prefetch_routing(local_seq_lens, token_dim, masks_json, masks_error)

    def get_attention_masks(self):
        """The attention masks of the sequences this rank's attention sees
        this step, in the order of the lengths pre_attn returns (one per
        sequence, in plan_routing's forms), to build the attention kernel's
        mask from; None in a step planned without masks. Local, no
        communication."""
        return _masks.from_json(self._impl.attention_masks())

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

    def route(self, packed_seqs, packed_features=None, force_fp32_buffer=False):
        """Collective: ``packed_seqs`` [tokens, dim] (this rank's sequences
        packed in plan_routing's order) and per-token ``packed_features``
        (any dtypes) -> ``(chunk_lens, seqs, features)``: the chunks this rank
        computes on. ``chunk_lens`` is int32 on the input's device;
        ``features`` keep their dtypes and are None when none were given.
        ``force_fp32_buffer`` is accepted for the reference's signature and
        changes nothing: every tensor moves bit for bit in its own dtype, so
        there is no shared buffer dtype to choose."""
        tensors = self._with_features("route", packed_seqs, packed_features)
        if not self._eager("route"):
            return self._traced_exchange("route", tensors, "chunk", "sequence", packed_features)
        moved = self._impl.route(tensors)
        lengths = self._impl.lengths("chunk", self._device_name(packed_seqs.device))
        return lengths, moved[0], (moved[1:] if packed_features is not None else None)

    def reverse_route(self, packed_seqs, packed_features=None, force_fp32_buffer=False):
        """Collective: the inverse of route -> ``(seq_lens, seqs, features)``,
        every token back where it came from (gradients too).
        ``force_fp32_buffer``: as in route."""
        tensors = self._with_features("reverse_route", packed_seqs, packed_features)
        if not self._eager("reverse_route"):
            return self._traced_exchange("reverse_route", tensors, "sequence", "chunk",
                                         packed_features)
        moved = self._impl.reverse_route(tensors)
        lengths = self._impl.lengths("sequence", self._device_name(packed_seqs.device))
        self._count_step()
        return lengths, moved[0], (moved[1:] if packed_features is not None else None)

    def pre_attn(self, packed_q, packed_k, packed_v):
        """Collective within the bag (Ulysses): q, k, v of the routed tokens,
        [tokens, heads, head_dim] -> ``(seq_lens, q, k, v)`` of whole
        sequences with heads / bag_gpus heads, in one exchange. ``seq_lens``
        (int32) is what a varlen attention kernel's cu_seqlens are made of."""
        if isinstance(packed_q, _Tensor) and isinstance(packed_k, _Tensor) and \
                isinstance(packed_v, _Tensor):
            tensors = [packed_q, packed_k, packed_v]
        else:
            tensors = self._tensors("pre_attn", packed_q=packed_q, packed_k=packed_k,
                                    packed_v=packed_v)
        if not self._eager("pre_attn"):
            lengths, moved = self._traced_exchange("pre_attn", tensors, "attention", "chunk")
            return lengths, moved[0], moved[1], moved[2]
        moved = self._impl.pre_attn(tensors)
        lengths = self._impl.lengths("attention", self._device_name(packed_q.device))
        return lengths, moved[0], moved[1], moved[2]

    def post_attn(self, packed_seqs):
        """Collective within the bag: attention's output -> ``(chunk_lens,
        out)`` back on the routed tokens with every head."""
        tensors = [packed_seqs] if isinstance(packed_seqs, _Tensor) else \
            self._tensors("post_attn", packed_seqs=packed_seqs)
        if not self._eager("post_attn"):
            lengths, moved = self._traced_exchange("post_attn", tensors, "chunk", "attention")
            return lengths, moved[0]
        moved = self._impl.post_attn(tensors)
        lengths = self._impl.lengths("chunk", self._device_name(packed_seqs.device))
        return lengths, moved[0]

    def _device_name(self, device):
        """str(device), remembered: the length tensors are made on it at
        every exchange."""
        name = self._device_names.get(device)
        if name is None:
            name = self._device_names[device] = str(device)
        return name

    # -- reporting ----------------------------------------------------------

    def get_routing_plan_summary(self):
        """The last planned step (local, no communication; RuntimeError
        before the first plan_routing): step, source
        ("planner service" or "local planner"), every rank's workload before
        and after (``workload_before``/``workload_after``), ``wir_*``,
        ``max_over_mean_*``, ``total_tokens``, ``moved_tokens``,
        ``token_bytes`` (of this step's route; the previous step's before it)
        and ``moved_bytes``, this rank's ``seq_lens``, ``chunk_lens`` and
        ``attention_seq_lens``, its ``attn_masks`` as given and the
        ``attention_masks`` of the sequences its attention sees (None in a
        step without masks); the whole step's ``chunks`` (as `knapformer
        plan` prints them) and the reference implementation's 13 keys
        (``chunk_id2seq_id``, ``gpu_id2seq_lens``, ...) for this rank's
        balancing group. The last two need the whole plan on this rank: not
        in the per-rank planner mode, where they are left out."""
        summary = self._impl.summary()  # raises before the first step
        for key in ("attn_masks", "attention_masks"):
            summary[key] = _masks.from_json(summary[key])
        tables = self._whole_plan()
        if tables is not None:
            summary["chunks"] = reference.chunk_list(tables.flat)
            summary.update(tables.summary())
        return summary

    def nice_print(self):
        """Prints every entry of get_routing_plan_summary(), one line each,
        prefixed with this rank (the reference logs them)."""
        for key, value in self.get_routing_plan_summary().items():
            print(f"Rank {self.this_gpu_id} {key}: {value}", flush=True)

    def _device(self):
        return torch.device("cpu") if isinstance(self.this_device, torch.device) \
            else torch.device("cuda", self.this_device)

    def imbalance_report(self):
        """print_imbalance's text."""
        s = self._impl.summary()
        lines = []
        for tag, workloads in (("original", s["workload_before"]),
                               ("balanced", s["workload_after"])):
            mean = sum(workloads) / len(workloads) if workloads else 0.0
            shares = " ".join(f"{r}: {w / mean:.2f}" if mean > 0 else f"{r}: 0"
                              for r, w in enumerate(workloads))
            # In the reference's units (the per_gpu_capacity attribute's).
            lines.append(f"{tag} - per_gpu_capacity={mean / 1e12:.4g} - {shares}")
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
