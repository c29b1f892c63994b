"""The C++ balancer's arguments (_C._BalancerArgs) made from
SequenceBalancer's keyword arguments, each checked: a bad one is a
ValueError naming it.

Apart from the balancer because checking arguments needs no process group
and no planner: the constructor agrees on their encoding across ranks before
anything collective, and gpu_check's hub_checks makes balancer arguments
with the same function (imported from knapformer.sequence_balancer)."""

import json

from knapformer import _C

_COST_MODELS = ("transformer", "uniform", "linear", "measured")


def _arguments(bag_specs, gamma, device, planner_address, job_id, group_id, d_model,
               max_tokens_per_gpu, cost_model, locality, planner_deadline, planner_mode,
               require_planner, first_step, use_fitted_gamma, agree_on_errors, machine,
               planner_token=None, planner_tls=None, log_steps=None, cost_table=None,
               planner_mesh_tls=None, rank_speeds=None):
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
    if isinstance(rank_speeds, str):
        if rank_speeds != "learned":
            raise ValueError(f"rank_speeds: '{rank_speeds}' is not 'learned' (or give a list of "
                             f"speeds, one per rank)")
        args.learn_rank_speeds = True
    elif rank_speeds is not None:
        try:
            args.rank_speeds = [float(s) for s in rank_speeds]
        except (TypeError, ValueError):
            raise ValueError(f"rank_speeds: needs 'learned' or a list of numbers, one per rank, "
                             f"got {rank_speeds!r}") from None
    if d_model is not None and not 1 <= args.d_model <= 65536:
        raise ValueError(f"d_model: {d_model} is outside [1, 65536]")
    return args
