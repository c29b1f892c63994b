"""Draws one step's balancing plan: every GPU's workload before and after,
the bags, and the tokens each rank sends to each other rank.

    python3 -m knapformer.plot plan.json plan.png [--title T]

reads ``knapformer plan``'s JSON (or a saved ``get_routing_plan_summary()``;
``-`` for stdin). From Python: ``plot_plan(summary_or_plan, path)``. Needs
matplotlib, imported only when drawing.
"""
import argparse
import json
import math
import os
import sys

from knapformer._reference_tables import parse_bag_specs

_DPI = 100
_FORMATS = {".png": "png", ".svg": "svg"}
_NO_MATPLOTLIB = ("knapformer.plot_plan needs matplotlib: pip install matplotlib "
                  "(Debian: apt-get install python3-matplotlib)")
_PLAN_KEYS = ("gpu_workload_before", "gpu_workload")
_SUMMARY_KEYS = ("workload_before", "workload_after")

# Okabe-Ito colours (distinct under the common colour-vision deficiencies);
# before/after differ in lightness too, so they also read in grey.
_BEFORE = "#56B4E9"
_AFTER = "#0072B2"
_BOUND = "#D55E00"
_MEAN = "#000000"
_BAG = "#666666"
_DIAGONAL = "#D55E00"
_NO_TOKENS = "#EEEEEE"
_COLORMAP = "viridis"

# Fixed margins in inches: axes sit where _draw puts them before any drawing,
# so their transforms (and the picture) do not depend on text measurement.
# Sums of 1/8 inches that come to whole 1/4 inches keep the size in pixels
# exact at 100 dpi (Agg truncates it).
_LEFT, _GAP, _CBAR_GAP, _CBAR, _RIGHT = 1.0, 1.0, 0.125, 0.25, 0.875
_BOTTOM, _TOP = 1.25, 1.0


def plot_plan(summary_or_plan, path, *, title=None):
    """Draws a step's plan and writes it to ``path`` (``.png`` or ``.svg``).

    ``summary_or_plan``: ``knapformer.plan(...)``'s dict (``knapformer plan``'s
    JSON), a ``SequenceBalancer.get_routing_plan_summary()`` dict, or the path
    of a JSON file holding either. Left: each rank's workload before and after
    balancing, the mean (a perfectly balanced GPU's share), the planner's
    bound on the best possible maximum where given, and the bags outlined.
    Right: the tokens each source rank (row) sends to each destination rank
    (column), log colour scale; outlined diagonal cells are the tokens that
    stay on their rank. ``title`` replaces the default heading. Returns
    ``path``. Raises ValueError for another suffix or input that is not a
    plan, ImportError without matplotlib.
    """
    suffix = os.path.splitext(os.fspath(path))[1]
    if suffix.lower() not in _FORMATS:
        raise ValueError(f"plot_plan: {os.fspath(path)}: unsupported suffix "
                         f"'{suffix}' (expected .png or .svg)")
    data = _load(summary_or_plan)
    try:
        import matplotlib
        import matplotlib.style
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(_NO_MATPLOTLIB) from error

    # The user's matplotlibrc must not change the picture's size (savefig.bbox)
    # or colours; a fixed SVG hash salt makes equal plans give equal files.
    with matplotlib.style.context("default"), \
            matplotlib.rc_context({"svg.hashsalt": "knapformer"}):
        fig = Figure(figsize=_figure_size(data["world_size"]), dpi=_DPI)
        FigureCanvasAgg(fig)
        _draw(fig, data, title=title)
        fmt = _FORMATS[suffix.lower()]
        fig.savefig(path, format=fmt, dpi=_DPI, facecolor="white", transparent=False,
                    metadata={"Date": None} if fmt == "svg" else None)
    return path


def _load(summary_or_plan):
    """The plan's figures from either input format, checked."""
    value = summary_or_plan
    if isinstance(value, (str, bytes, os.PathLike)):
        name = os.fsdecode(value)
        with open(name, encoding="utf-8") as file:
            try:
                value = json.load(file)
            except ValueError as error:
                raise ValueError(f"plot_plan: {name}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"plot_plan: expected a plan or summary dict, got "
                         f"{type(value).__name__}")
    if "gpu_workload" in value:
        form, keys = "plan", _PLAN_KEYS
        before, after = value.get("before"), value.get("after")
        figures = {"wir_before": _field(before, "wir"), "wir_after": _field(after, "wir"),
                   "max_over_mean_before": _field(before, "max_over_mean"),
                   "max_over_mean_after": _field(after, "max_over_mean")}
        layout = value.get("topology")
    elif "workload_after" in value:
        form, keys = "summary", _SUMMARY_KEYS
        figures = {key: value.get(key) for key in ("wir_before", "wir_after",
                                                   "max_over_mean_before",
                                                   "max_over_mean_after")}
        layout = value.get("layout", value.get("topology"))
    else:
        present = [k for k in _PLAN_KEYS + _SUMMARY_KEYS if k in value]
        raise ValueError(
            "plot_plan: not a plan or summary: missing "
            + ", ".join(k for k in _PLAN_KEYS if k not in value) + " (knapformer plan) or "
            + ", ".join(k for k in _SUMMARY_KEYS if k not in value)
            + " (get_routing_plan_summary())" + (f"; has {', '.join(present)}" if present else ""))
    if "sends" in value and not isinstance(value.get(keys[1]), (list, tuple)):
        raise ValueError(f"plot_plan: rank {value.get('rank')}'s slice of a plan (knapformer "
                         "plan --rank) has neither every rank's workload nor the chunk table; "
                         "plot the whole plan")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"plot_plan: {form} is missing {', '.join(missing)}")
    workload_before = _numbers(value[keys[0]], keys[0])
    workload_after = _numbers(value[keys[1]], keys[1])
    world_size = value.get("world_size", len(workload_after))
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"plot_plan: world_size: {world_size!r} is not a positive count")
    for key, workloads in zip(keys, (workload_before, workload_after)):
        if len(workloads) != world_size:
            raise ValueError(f"plot_plan: {key}: {len(workloads)} ranks, world_size is "
                             f"{world_size}")
    chunks = value.get("chunks")
    if chunks is not None:
        chunks = _chunks(chunks, world_size)
    bound = value.get("lower_bound_max_over_mean")
    return {
        "form": form, "world_size": world_size,
        "workload_before": workload_before, "workload_after": workload_after,
        "layout": layout if isinstance(layout, str) else None,
        "chunks": chunks, "step": value.get("step"),
        "lower_bound_max_over_mean": bound if _is_number(bound) else None,
        "moved_tokens": value.get("moved_tokens"), "total_tokens": value.get("total_tokens"),
        **figures,
    }


def _field(table, key):
    return table.get(key) if isinstance(table, dict) else None


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(values, key):
    if not isinstance(values, (list, tuple)) or \
            not all(_is_number(v) and math.isfinite(v) for v in values):
        raise ValueError(f"plot_plan: {key}: expected a list of finite numbers per rank")
    return [float(v) for v in values]


def _chunks(chunks, world_size):
    """Checked (src_rank, dst_rank, length) per chunk."""
    if not isinstance(chunks, (list, tuple)):
        raise ValueError("plot_plan: chunks: expected a list of chunk dicts")
    checked = []
    for i, chunk in enumerate(chunks):
        if not isinstance(chunk, dict):
            raise ValueError(f"plot_plan: chunks[{i}]: expected a dict")
        fields = []
        for key, limit in (("src_rank", world_size), ("dst_rank", world_size),
                           ("length", None)):
            v = chunk.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or \
                    (limit is not None and v >= limit):
                bound = f" in [0, {limit})" if limit is not None else " >= 0"
                raise ValueError(f"plot_plan: chunks[{i}].{key}: {v!r} is not an integer{bound}")
            fields.append(v)
        checked.append(tuple(fields))
    return checked


def _replica_bags(spec):
    """Bag sizes of one replica, in rank order (sizes ascending, as the
    planner lays them out); None when ``spec`` is not g{G}n{N} terms."""
    counts = parse_bag_specs(spec)
    if counts is None or sum(g * n for g, n in counts) > 1 << 20:
        return None  # beyond any world: spares expanding a typo'd giant spec
    return [g for g, n in counts for _ in range(n)]


def _bags(layout, world_size):
    """(first_rank, gpus) of every bag and the first rank of every replica
    after the first; ([], []) for a layout that does not parse or fit."""
    if not layout:
        return [], []
    replicas = [_replica_bags(spec) for spec in layout.split(";")]
    if any(bags is None for bags in replicas):
        return [], []
    group = sum(replicas[0])
    if any(sum(bags) != group for bags in replicas):
        return [], []
    if len(replicas) == 1:
        if world_size % group:
            return [], []
        replicas *= world_size // group
    elif len(replicas) * group != world_size:
        return [], []
    bags, starts, rank = [], [], 0
    for bags_of_replica in replicas:
        if rank:
            starts.append(rank)
        for gpus in bags_of_replica:
            bags.append((rank, gpus))
            rank += gpus
    return bags, starts


def _panel_sizes(world_size):
    """(workload panel width, token map side) in inches."""
    side = 4.0 if world_size <= 32 else 5.5
    quarters = -(-(4 * world_size + 40) // 5)  # 0.2 inch a rank + 2, up to the next 1/4
    return min(max(quarters / 4, 5.0), 12.0), side


def _figure_size(world_size):
    width, side = _panel_sizes(world_size)
    return (_LEFT + width + _GAP + side + _CBAR_GAP + _CBAR + _RIGHT, _BOTTOM + side + _TOP)


def _tick_step(world_size, inches):
    # Powers of two line up with bag and node boundaries.
    step = 1
    while step < world_size and step * inches / world_size < 0.28:
        step *= 2
    return step


def _ratio(value):
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "\u221e"  # a plan's JSON has null for max/min with an idle GPU
    return f"{value:.3g}"


def _figures(data, workloads, suffix):
    """The input's balance figure, or the one computed from the workloads."""
    wir, max_over_mean = data["wir_" + suffix], data["max_over_mean_" + suffix]
    top, low = max(workloads), min(workloads)
    mean = sum(workloads) / len(workloads)
    if not _is_number(max_over_mean):
        max_over_mean = top / mean if mean > 0 else None
    if not _is_number(wir):
        wir = top / low if low > 0 else None
    return wir, max_over_mean


def _draw(fig, data, *, title=None):
    """Draws ``data`` (from ``_load``) on ``fig`` (sized by ``_figure_size``);
    returns the axes: {"workload", "tokens", "colorbar"}."""
    import matplotlib
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    size = data["world_size"]
    fig_w, fig_h = fig.get_size_inches()
    width, side = _panel_sizes(size)
    bottom = _BOTTOM / fig_h

    def box(left, w):
        return [left / fig_w, bottom, w / fig_w, side / fig_h]

    ax = fig.add_axes(box(_LEFT, width))
    tokens_x = _LEFT + width + _GAP
    tokens = fig.add_axes(box(tokens_x, side))
    cbar = fig.add_axes(box(tokens_x + side + _CBAR_GAP, _CBAR))

    layout = data["layout"] or "unknown layout"
    if len(layout) > 80:  # many replicas' own specs
        layout = layout[:77] + "..."
    heading = title if title is not None else (
        f"knapformer plan: {layout}, {size} ranks"
        + (f", step {data['step']}" if data["step"] is not None else ""))
    fig.suptitle(heading, y=1 - 0.12 / fig_h, va="top", fontsize=12)

    before, after = data["workload_before"], data["workload_after"]
    mean = sum(after) / size
    bound = data["lower_bound_max_over_mean"]
    ranks = np.arange(size)
    ax.bar(ranks - 0.19, before, width=0.36, color=_BEFORE, zorder=2)
    ax.bar(ranks + 0.19, after, width=0.36, color=_AFTER, zorder=2)
    top = max(before + after + [mean * bound if bound else 0.0])
    top = top if top > 0 else 1.0
    ax.set_xlim(-0.6, size - 0.4)
    ax.set_ylim(0, top * 1.16)
    ax.axhline(mean, color=_MEAN, linewidth=1.0, zorder=3)
    handles = [Patch(color=_BEFORE, label="before balancing"),
               Patch(color=_AFTER, label="after balancing"),
               Line2D([], [], color=_MEAN, linewidth=1.0, label="mean = per-GPU capacity")]
    if bound:
        ax.axhline(mean * bound, color=_BOUND, linestyle="--", linewidth=1.2, zorder=3)
        handles.append(Line2D([], [], color=_BOUND, linestyle="--", linewidth=1.2,
                              label="bound: best possible max"))
    bags, starts = _bags(data["layout"], size)
    inches_per_rank = width / (size + 0.2)
    for first, gpus in bags:
        # Each box just clears its own bars: a row of one-GPU bags at full
        # height would hide the bars behind a fence of outlines.
        height = max(before[first:first + gpus] + after[first:first + gpus]) + top * 0.04
        ax.add_patch(Rectangle((first - 0.45, 0), gpus - 0.1, height, fill=False,
                               edgecolor=_BAG, linewidth=0.8, zorder=4))
        label = f"g{gpus}"
        if gpus * inches_per_rank >= 0.08 * len(label) + 0.06:
            ax.text(first + (gpus - 1) / 2, height + top * 0.01, label, ha="center",
                    va="bottom", fontsize=8, color=_BAG)
    for start in starts:
        ax.axvline(start - 0.5, color=_BAG, linestyle=":", linewidth=1.0, zorder=1)
    if bags:
        handles.append(Patch(fill=False, edgecolor=_BAG, label="bag (GPUs sharing sequences)"))
    step = _tick_step(size, width)
    ax.set_xticks(range(0, size, step))
    ax.tick_params(labelsize=8)
    ax.set_xlabel("rank")
    ax.set_ylabel("workload (cost model)")
    wir_before, mom_before = _figures(data, before, "before")
    wir_after, mom_after = _figures(data, after, "after")
    ax.set_title(f"workload per GPU\nWIR (max/min) {_ratio(wir_before)} \u2192 {_ratio(wir_after)}"
                 f", max/mean {_ratio(mom_before)} \u2192 {_ratio(mom_after)}", fontsize=10)
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.5 / side),
              ncol=3, fontsize=8, frameon=False)

    matrix = np.zeros((size, size), dtype=np.int64)
    for src, dst, length in data["chunks"] or ():
        matrix[src, dst] += length
    moved = data["moved_tokens"]
    total = data["total_tokens"]
    if data["chunks"] is not None:
        moved = int(matrix.sum() - np.trace(matrix)) if not _is_number(moved) else moved
        total = int(matrix.sum()) if not _is_number(total) else total
    totals = ""
    if _is_number(moved) and _is_number(total):
        share = f" ({100 * moved / total:.1f}%)" if total else ""
        totals = f"\nmoved {moved:,} of {total:,} tokens{share}"
    tokens.set_title("tokens moved, rank \u2192 rank" + totals, fontsize=10)
    tokens.set_xlabel("destination rank")
    tokens.set_ylabel("source rank")
    tokens.tick_params(labelsize=8)
    step = _tick_step(size, side)
    if data["chunks"] is None:
        note = ("chunk table not on this rank (per-rank planner mode)"
                if data["form"] == "summary" else "no chunk table in the input")
        tokens.text(0.5, 0.5, note, ha="center", va="center", wrap=True, fontsize=9,
                    transform=tokens.transAxes)
        tokens.set_xticks([])
        tokens.set_yticks([])
        cbar.set_visible(False)
        return {"workload": ax, "tokens": tokens, "colorbar": cbar}
    nonzero = matrix[matrix > 0]
    if nonzero.size:
        low, high = float(nonzero.min()), float(nonzero.max())
        # A log scale keeps the few moved tokens visible beside the many staying.
        norm = LogNorm(vmin=min(low, high / 10), vmax=high)
    else:
        norm = Normalize(vmin=0, vmax=1)
    cmap = matplotlib.colormaps[_COLORMAP].with_extremes(bad=_NO_TOKENS)
    image = tokens.imshow(np.ma.masked_equal(matrix, 0), cmap=cmap, norm=norm,
                          interpolation="nearest", aspect="equal")
    tokens.set_xlim(-0.5, size - 0.5)
    tokens.set_ylim(size - 0.5, -0.5)
    tokens.set_xticks(range(0, size, step))
    tokens.set_yticks(range(0, size, step))
    if size <= 128:  # beyond, cells are under a pixel; outlines would hide them
        for r in range(size):
            tokens.add_patch(Rectangle((r - 0.5, r - 0.5), 1, 1, fill=False,
                                       edgecolor=_DIAGONAL, linewidth=1.2 if size <= 32 else 0.6))
    if size <= 8:
        for (src, dst), count in np.ndenumerate(matrix):
            if count:
                shade = norm(count)
                tokens.text(dst, src, f"{count:,}", ha="center", va="center", fontsize=8,
                            color="white" if shade < 0.6 else "black")
    colorbar = fig.colorbar(image, cax=cbar)
    colorbar.set_label("tokens (outlined diagonal: stay on their rank)", fontsize=8)
    cbar.tick_params(labelsize=8)
    return {"workload": ax, "tokens": tokens, "colorbar": cbar}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python3 -m knapformer.plot",
        description="Draws a step's balancing plan (knapformer plan's JSON or a saved "
                    "get_routing_plan_summary()) as a PNG or SVG picture.")
    parser.add_argument("input", help="the plan's JSON file; - for stdin")
    parser.add_argument("output", help="the picture to write: .png or .svg")
    parser.add_argument("--title", help="heading instead of the layout and world size")
    args = parser.parse_args(argv)
    try:
        if args.input == "-":
            try:
                source = json.load(sys.stdin)
            except ValueError as error:
                raise ValueError(f"stdin: not JSON ({error})") from None
        else:
            source = args.input
        plot_plan(source, args.output, title=args.title)
    except (OSError, ValueError, ImportError) as error:
        print(f"knapformer.plot: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
