"""SequenceBalancer with the KnapFormer reference implementation's API, over
the trainer's torch.distributed process group."""

import json
import math
import time

import torch
import torch.distributed as dist

from knapformer import _C
from knapformer import _compile
from knapformer import _masks
from knapformer import _reference_tables as reference
from knapformer._reference_tables import tflops_estimator, workload_estimator  # noqa: F401
from knapformer._torch_compat import device_backend

_COST_MODELS = ("transformer", "uniform", "linear", "measured")


# The autograd graph task this thread runs, -1 outside a backward pass
# (torch 2.x; on 1.13 recomputation is not checked).
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_compiling = _compile.compiling
_Tensor = torch.Tensor


def _global_rank(group, rank):
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, rank)


def _make_bag_groups(group, bags, backend, made_for_group=None):
    """One process group per multi-GPU bag, keyed by the bag's ranks in
    ``group``. dist.new_group must be entered by every process of the job in
    the same order (torch's rule), so every process makes every bag's group:
    those of its own world directly, those of other groups (when ``group`` is
    not the default one) after an all-gather of everyone's bags. Every group
    made for a bag of ``group`` (this rank's or not: torch's handle for a
    non-member) also goes into ``made_for_group``, keyed by global ranks."""
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
        if global_ranks in mine and made_for_group is not None:
            made_for_group[global_ranks] = made
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


def _arguments(bag_specs, gamma, device, planner_address, job_id, group_id, d_model,
               max_tokens_per_gpu, cost_model, locality, planner_deadline, planner_mode,
               require_planner, first_step, use_fitted_gamma, agree_on_errors, machine,
               planner_token=None, planner_tls=None, log_steps=None, cost_table=None,
               planner_mesh_tls=None):
    """The C++ balancer's arguments, checked; ValueError naming a bad one."""
    if not isinstance(bag_specs, str):
        raise ValueError(f"bag_specs: needs a topology string such as 'g1n2+g2n1+g4n1', "
                         f"got {type(bag_specs).__name__}")
    if cost_model not in _COST_MODELS:
        raise ValueError(f"cost_model: '{cost_model}' is not one of {', '.join(_COST_MODELS)}")
    if (cost_model == "measured") != (cost_table is not None):
        raise ValueError("cost_table: give it exactly with cost_model='measured' (the dict "
                         "knapformer calibrate --table writes)")
    if cost_table is not None and not isinstance(cost_table, dict):
        raise ValueError(f"cost_table: needs a dict, got {type(cost_table).__name__}")
    if machine is not None and not isinstance(machine, dict):
        raise ValueError(f"machine: needs a dict of machine fields, got {type(machine).__name__}")
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
    args.cost_table_json = None if cost_table is None else json.dumps(cost_table)
    args.locality = None if locality is None else bool(locality)
    args.planner_deadline_s = None if planner_deadline is None else float(planner_deadline)
    args.planner_mode = None if planner_mode is None else str(planner_mode)
    args.require_planner = None if require_planner is None else bool(require_planner)
    args.log_steps = None if log_steps is None else bool(log_steps)
    if planner_token is not None:
        if not isinstance(planner_token, str):
            raise ValueError(f"planner_token: needs a string (knapformer token --job ID), got "
                             f"{type(planner_token).__name__}")
        args.planner_token = planner_token
    args.planner_mesh_tls = None if planner_mesh_tls is None else bool(planner_mesh_tls)
    if planner_tls is not None:
        if not isinstance(planner_tls, dict) or not set(planner_tls) <= {"ca", "cert", "key"}:
            raise ValueError(f"planner_tls: needs a dict of PEM file paths with the keys ca, "
                             f"cert and key (any of them), got {planner_tls!r}")
        args.planner_tls_ca = planner_tls.get("ca")
        args.planner_tls_cert = planner_tls.get("cert")
        args.planner_tls_key = planner_tls.get("key")
    args.first_step = int(first_step)
    args.use_fitted_gamma = bool(use_fitted_gamma)
    if agree_on_errors == "every_exchange":
        args.agree_on_errors, args.agree_every_exchange = True, True
    elif isinstance(agree_on_errors, bool):
        args.agree_on_errors = agree_on_errors
    else:
        raise ValueError(f"agree_on_errors: needs True, False or 'every_exchange', got "
                         f"{agree_on_errors!r}")
    args.machine = {} if machine is None else machine
    if d_model is not None and not 1 <= args.d_model <= 65536:
        raise ValueError(f"d_model: {d_model} is outside [1, 65536]")
    return args


class SequenceBalancer:
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
                 log_steps=None, cost_table=None, planner_mesh_tls=None,
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
                              planner_mesh_tls=planner_mesh_tls)
            bags = _C.multi_gpu_bags(bag_specs, group.size(), args.machine)
            replica_size = _C.replica_size(bag_specs, group.size(), args.machine)
            mine = ("ok", _C._encoded_settings(args))
        except (ValueError, TypeError, RuntimeError) as error:
            failure = error
            mine = ("error", f"{type(error).__name__}: {error}")
        everyone = [None] * group.size()
        dist.all_gather_object(everyone, mine, group=group)
        if failure is not None:
            raise failure
        refused = [(r, text) for r, (kind, text) in enumerate(everyone) if kind == "error"]
        if refused:
            rank, text = refused[0]
            raise ValueError(f"SequenceBalancer: rank {rank} refused its arguments ({text}); "
                             "every rank fails with it")
        _C._check_settings_agree([text for _, text in everyone])
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

    def _eager(self, what):
        """False while torch.compile traces the call (the exchange is then
        the custom op of knapformer/_compile.py). In eager mode, checks that
        an exchange called during a backward pass, i.e. activation
        checkpointing recomputing a forward, uses the plan its forward used:
        plan_routing must not have run in between. Every rank runs the same
        program, so every rank refuses alike (agreed, like any refusal)
        instead of moving rows by another step's plan. One call per
        exchange: it is on every eager exchange's path."""
        if self._handle is not None and _compiling():
            return False
        if _graph_task_id() == -1:
            self._forward_plans = self._plans
        elif self._forward_plans != self._plans:
            self._refuse(what, f"{what}: recomputed in a backward pass (activation "
                               "checkpointing) after plan_routing planned step "
                               f"{self._impl.step}, but its forward ran under the plan before: "
                               "run the backward before the next plan_routing")
        return True

    # -- under torch.compile -------------------------------------------------

    def _shape_carriers(self):
        """The step's shape carriers (knapformer/_compile.py), by row set."""
        device = self._device()
        carriers = {}
        for which in ("sequence", "chunk", "attention"):
            lengths = self._impl.lengths(which, "cpu")
            bag_gpus = 1 if which == "sequence" else self._impl.bag_gpus
            carriers[which] = _compile.shape_carrier(int(lengths.sum()), lengths.numel(),
                                                     bag_gpus, device)
        return carriers

    def _traced_exchange(self, call, tensors, to, source, features=()):
        """``call`` as the custom op: (lengths of ``to``, moved tensors); for
        the routes, the reference's (lengths, tensor, features) triple."""
        if self._shapes is None:
            # What the eager call says too (an error agreed on every rank).
            self._impl.refuse(call, f"{call}: no plan for this step yet; call plan_routing first")
        lengths = _compile.lengths(self._handle, to, self._shapes[to])
        if call in ("pre_attn", "post_attn") and self._shapes[to].shape[2] == 1:
            # A one-GPU bag: identity, as in eager mode (torch specialises a
            # size of 1, so this is decided when tracing, not each step).
            return lengths, list(tensors)
        moved = _compile.exchange(self._handle, call, tensors, self._shapes[to],
                                  self._shapes[source])
        if call in ("route", "reverse_route"):
            return lengths, moved[0], (moved[1:] if features is not None else None)
        return lengths, moved

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
    setattr(SequenceBalancer, _name, _step_attribute(_name))
for _name in reference.BAG_ATTRIBUTES:
    setattr(SequenceBalancer, _name, _bag_attribute(_name))
del _name
