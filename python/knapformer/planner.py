"""The planner core and the planner service from Python."""

import json
import operator

import torch

from knapformer import _C


def _lengths_json(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    try:
        return operator.index(value)  # numpy integers and the like
    except TypeError:
        raise TypeError(f"{type(value).__name__} is not a sequence length") from None


def plan(ranks, topology, d_model=3072, gamma=0.49, *, token_bytes=None, locality=True,
         max_tokens_per_gpu=0, cost_model="transformer", refine_rounds=256, rank=None,
         machine=None, attn_masks=None, cost_table=None, rank_speeds=None):
    """Plans one step for a whole world, like ``knapformer plan``.

    ``ranks[r]`` lists rank r's sequence lengths (a list of ints or a 1-D
    integer tensor); the world size is ``len(ranks)``. Returns the plan as a
    dict: ``chunks`` (the chunk table: ``src_rank, seq_index, offset, length,
    dst_rank`` per chunk), per-rank ``gpu_workload`` and
    ``gpu_workload_before``, ``before``/``after`` balance figures, tokens and
    bytes moved. With ``rank``, only that rank's slice (sends, recvs,
    compute_chunk_lengths, ulysses). ``topology="auto"`` chooses the bags
    (the answer's ``topology`` names them), pricing Ulysses traffic with
    ``machine``: a dict of any of flops_per_second,
    intra_node_bytes_per_second, inter_node_bytes_per_second, gpus_per_node,
    element_bytes, blocks_per_route (the rest: docs/planner.md's defaults).
    ``attn_masks[r][i]`` (optional) is the attention mask of ``ranks[r][i]``
    (``"full"``, ``"causal"``, ``{"window": W}``, ``{"spans": [[n,
    "full"|"causal"], ...]}``), as SequenceBalancer.plan_routing takes them:
    workloads then price each sequence's attention by the pairs it attends,
    and a rank's slice lists the ``attention_masks`` of what it attends.
    ``cost_model="measured"`` plans by ``cost_table``, the measured cost
    model (a dict as ``knapformer calibrate --table`` writes it; its d_model
    must be ``d_model``). ``rank_speeds`` (one relative speed per rank)
    plans by time, as SequenceBalancer's ``rank_speeds`` does: ``before``
    and ``after`` are then of time against the ideal.
    Raises ValueError naming the field for bad input (e.g.
    ``ranks[1][0]: sequence length -2 is outside ...``).
    """
    request = {"topology": topology, "d_model": d_model, "gamma": gamma,
               "ranks": [r.tolist() if isinstance(r, torch.Tensor) else r for r in ranks]}
    if token_bytes is not None:
        request["token_bytes"] = token_bytes
    if machine is not None:
        request["machine"] = machine
    if attn_masks is not None:
        request["masks"] = [list(rank) for rank in attn_masks]
    if rank_speeds is not None:
        request["rank_speeds"] = list(rank_speeds)
    if cost_table is not None:
        if cost_table.get("d_model") != d_model:
            raise ValueError(f"d_model: {d_model}, but cost_table was measured at d_model "
                             f"{cost_table.get('d_model')}")
        request["measured_attention"] = cost_table.get("measured_attention")
    text = _C._plan_json(json.dumps(request, default=_lengths_json), cost_model, bool(locality),
                         max_tokens_per_gpu, refine_rounds, rank)
    return json.loads(text)


def synthetic_lengths(data, world_size, seed=0, step=0):
    """Every rank's sequence lengths at ``step`` of the paper's synthetic data
    stream (section 4.1): ``data`` is a scenario (``low-res``, ``mixed-res``,
    ``joint``) or data codes ``g{G}b{B}i{R}f{F}s{S},...``. Reproducible: step s
    of rank r depends only on (seed, s, r)."""
    return _C.synthetic_lengths(data, world_size, seed, step)


def _parse_masks(masks):
    """Every rank's masks from the extension's JSON texts to plan's forms."""
    return [[json.loads(mask) for mask in rank] for rank in masks]


def synthetic_batch(data, world_size, seed=0, step=0):
    """``(lengths, masks)`` at ``step`` of a synthetic stream: the paper's
    (as ``synthetic_lengths``; masks None) or a masked one
    (``video-blockcausal``, ``interleaved``, ``llm-packed``: every sequence's
    mask in ``plan``'s forms), as ``knapformer simulate --data`` takes them."""
    if data in _C.masked_scenario_names():
        lengths, masks = _C.masked_batch(data, world_size, seed, step)
        return lengths, _parse_masks(masks)
    return synthetic_lengths(data, world_size, seed, step), None


class LengthsStream:
    """A user's own data, as ``knapformer simulate --lengths`` takes it: a
    text file with one sample per line, its token count and optionally its
    attention mask (``tokens[,mask]``, masks as ``full``, ``causal``,
    ``window=W``, ``spans=n:f;n:c;...``), dealt to ``world_size`` ranks as
    torch's DistributedSampler deals them (each epoch a permutation seeded by
    ``seed``; the file's order with ``shuffle=False``) and batched as the
    loader does: ``samples_per_gpu`` samples, or samples while their tokens
    fit ``tokens_per_gpu`` (exactly one). ``batch(step)`` gives
    ``(lengths, masks)``: every rank's lengths, and their masks in
    ``plan``'s forms (None when the file has none). A malformed file raises
    ValueError naming the file, the line and the field."""

    def __init__(self, path, world_size, *, samples_per_gpu=0, tokens_per_gpu=0, seed=0,
                 shuffle=True):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self._stream = _C._LengthsStream(text, str(path), world_size, samples_per_gpu,
                                         tokens_per_gpu, seed, bool(shuffle))

    @property
    def samples(self):
        return self._stream.samples

    @property
    def masked(self):
        """How many of the file's samples carry a mask."""
        return self._stream.masked

    def batch(self, step):
        lengths, masks = self._stream.batch(step)
        return lengths, None if masks is None else _parse_masks(masks)


def _flag_value(name, value):
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise TypeError(f"{name}: {type(value).__name__} is not a flag value")


class PlannerServer:
    """The planner service (gRPC, health, reflection, Prometheus metrics) in
    this process, e.g. hosted by a trainer's rank 0.

    ``listen`` is host:port (port 0 picks a free one: see ``address`` and
    ``port``); ``metrics`` is host:port of the /metrics page or None for
    none. Other keyword arguments are ``knapformer serve`` flags with
    underscores, e.g. ``rendezvous_timeout_ms=30000, locality=False``
    (see docs/service.md). Bad flags raise ValueError naming the flag. Stop it
    with ``shutdown()`` or use it as a context manager.
    """

    def __init__(self, listen="127.0.0.1:0", metrics=None, **flags):
        argv = ["--listen", listen, "--metrics", metrics if metrics else "off"]
        for name, value in flags.items():
            argv += ["--" + name.replace("_", "-"), _flag_value(name, value)]
        self._server = _C._PlannerServer(argv)

    @property
    def address(self):
        """host:port the service listens on (with the bound port)."""
        return self._server.address

    @property
    def port(self):
        return self._server.port

    @property
    def metrics_port(self):
        """The /metrics port, 0 without a metrics endpoint."""
        return self._server.metrics_port

    @property
    def running(self):
        return self._server.running

    def shutdown(self, grace=None):
        """Stops serving: waiting ranks get UNAVAILABLE (and plan locally);
        answers being sent get ``grace`` seconds (the shutdown_grace_ms flag
        by default). Idempotent."""
        self._server.shutdown(grace)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False
