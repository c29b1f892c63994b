"""Making SequenceBalancer's process groups: one per multi-GPU bag of the
topology (and one per replica), and the Gloo twins of the group and of its
bags for the small host-side collectives.

Apart from the balancer because torch's rule for dist.new_group is a job of
its own: every process of the job enters every call, in the same order, so
every process makes every bag's group, its own or not (after an all-gather
of everyone's bags over a group other than the default one). The
constructor only asks for the groups it needs."""

import torch.distributed as dist


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
