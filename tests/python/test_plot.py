"""knapformer.plot: plot_plan on real plans, and python3 -m knapformer.plot."""
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

import pytest

import knapformer
from knapformer import plot

try:
    import matplotlib
    import matplotlib.colors
    import matplotlib.image
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
except ImportError:
    matplotlib = None

needs_matplotlib = pytest.mark.skipif(matplotlib is None, reason="matplotlib is not installed")
# Plans drawn: nothing here depends on the torch release.
pytestmark = pytest.mark.torch_independent

RANKS = [[300, 20], [5], [900], []]
TOPOLOGY = "g1n2+g2n1"
# Within 2 of 255 per channel: the middle of a bar or cell is drawn unblended.
TOLERANCE = 2 / 255


def small_plan():
    return knapformer.plan(RANKS, TOPOLOGY, d_model=64, gamma=0.49)


def synthetic_plan(world_size, topology):
    ranks = knapformer.synthetic_lengths("mixed-res", world_size, seed=0, step=0)
    return knapformer.plan(ranks, topology, d_model=64, gamma=0.49)


def as_summary(plan, chunks=True):
    """What get_routing_plan_summary() reports for the same step."""
    summary = {
        "step": 3, "source": "local planner", "rank": 0, "world_size": plan["world_size"],
        "topology": plan["topology"], "layout": plan["topology"], "bag_gpus": 1,
        "d_model": plan["d_model"], "gamma": plan["gamma"],
        "workload_before": plan["gpu_workload_before"], "workload_after": plan["gpu_workload"],
        "wir_before": plan["before"]["wir"] or float("inf"), "wir_after": plan["after"]["wir"],
        "max_over_mean_before": plan["before"]["max_over_mean"],
        "max_over_mean_after": plan["after"]["max_over_mean"],
        "total_tokens": plan["total_tokens"], "moved_tokens": plan["moved_tokens"],
        "token_bytes": plan["token_bytes"], "moved_bytes": plan["moved_bytes"],
        "seq_lens": [300, 20], "chunk_lens": [300, 20], "attention_seq_lens": [300, 20],
        "tables": {0: [1, 2], 1: [3]},  # int keys: strings once saved as JSON
    }
    if chunks:
        summary["chunks"] = plan["chunks"]
    return summary


def render(source, path):
    """plot_plan's picture of ``source`` and the axes it was drawn on."""
    assert plot.plot_plan(source, path) == path
    data = plot._load(source)
    fig = Figure(figsize=plot._figure_size(data["world_size"]), dpi=plot._DPI)
    FigureCanvasAgg(fig)
    axes = plot._draw(fig, data)
    image = matplotlib.image.imread(str(path))
    width, height = plot._figure_size(data["world_size"])
    assert image.shape[:2] == (round(height * plot._DPI), round(width * plot._DPI))
    return image, axes, data


def pixel(image, ax, x, y):
    """The picture's colour at data point (x, y) of ``ax``."""
    px, py = ax.transData.transform((x, y))
    return image[int(image.shape[0] - py), int(px), :3]


def assert_colour(actual, expected):
    expected = matplotlib.colors.to_rgb(expected)
    assert max(abs(a - e) for a, e in zip(actual, expected)) <= TOLERANCE, (actual, expected)


def assert_workload_bars(image, ax, data):
    """The tallest rank's bars show up in their colours, an idle rank's not."""
    before, after = data["workload_before"], data["workload_after"]
    mean = sum(after) / len(after)
    low = mean / 2  # below the mean and bound lines, inside any bar taller than the mean
    busiest = max(range(len(after)), key=lambda r: (after[r], -r))
    assert after[busiest] > mean
    assert_colour(pixel(image, ax, busiest + 0.19, low), plot._AFTER)
    was_busiest = max(range(len(before)), key=lambda r: (before[r], -r))
    assert_colour(pixel(image, ax, was_busiest - 0.19, low), plot._BEFORE)
    idle = [r for r in range(len(before)) if before[r] == 0.0]
    for rank in idle:
        assert_colour(pixel(image, ax, rank - 0.19, low), "white")


@needs_matplotlib
def test_small_plan_png(tmp_path):
    plan = small_plan()
    image, axes, data = render(plan, tmp_path / "plan.png")
    assert_workload_bars(image, axes["workload"], data)
    assert data["layout"] == "g1n2+g2n1" and data["lower_bound_max_over_mean"] > 1

    tokens = axes["tokens"]
    cells = tokens.images[0]
    colour = cells.cmap(cells.norm(450))
    # Off the middle: small worlds print each cell's count there.
    assert_colour(pixel(image, tokens, 3 - 0.3, 2 - 0.3), colour)  # rank 2 -> 3, moved
    assert_colour(pixel(image, tokens, 2 - 0.3, 2 - 0.3), colour)  # rank 2 stays
    assert_colour(pixel(image, tokens, 0 + 0.3, 3 + 0.3), plot._NO_TOKENS)  # 3 -> 0: none
    # The diagonal's outline: the left edge of cell (1, 1) is drawn over a cell
    # with no tokens (1, 0), in the outline's colour.
    edge = pixel(image, tokens, 0.5, 1.25)
    outline = matplotlib.colors.to_rgb(plot._DIAGONAL)
    empty = matplotlib.colors.to_rgb(plot._NO_TOKENS)
    assert sum((a - o) ** 2 for a, o in zip(edge, outline)) < \
        sum((a - e) ** 2 for a, e in zip(edge, empty)), edge
    assert "moved 450 of 1,225 tokens" in tokens.get_title()


@needs_matplotlib
def test_replicated_synthetic_plan_png(tmp_path):
    """32 ranks: four replicas of g1n2+g2n1+g4n1, the paper's mixed-res data."""
    plan = synthetic_plan(32, "g1n2+g2n1+g4n1")
    image, axes, data = render(plan, tmp_path / "plan.png")
    assert_workload_bars(image, axes["workload"], data)

    counts = {}
    for chunk in plan["chunks"]:
        if chunk["src_rank"] != chunk["dst_rank"]:
            key = (chunk["src_rank"], chunk["dst_rank"])
            counts[key] = counts.get(key, 0) + chunk["length"]
    (src, dst), most = max(counts.items(), key=lambda item: (item[1], item[0]))
    cells = axes["tokens"].images[0]
    assert cells.get_array()[src, dst] == most
    assert_colour(pixel(image, axes["tokens"], dst, src), cells.cmap(cells.norm(most)))


@needs_matplotlib
@pytest.mark.parametrize("chunks", [True, False])
def test_summary_png(tmp_path, chunks):
    """A saved summary (file path, int keys now strings) draws as the plan does;
    without its chunk table (per-rank planner mode) the token map says so."""
    plan = synthetic_plan(32, "g1n2+g2n1+g4n1")
    saved = tmp_path / "summary.json"
    saved.write_text(json.dumps(as_summary(plan, chunks)))
    image, axes, data = render(str(saved), tmp_path / "summary.png")
    assert_workload_bars(image, axes["workload"], data)
    assert any("step 3" in text.get_text() for text in axes["workload"].figure.texts)
    texts = [text.get_text() for text in axes["tokens"].texts]
    if chunks:
        assert len(axes["tokens"].images) == 1
    else:
        assert not axes["tokens"].images
        assert "chunk table not on this rank (per-rank planner mode)" in texts
        assert not axes["colorbar"].get_visible()
    assert f"moved {plan['moved_tokens']:,} of {plan['total_tokens']:,}" in \
        axes["tokens"].get_title()


@needs_matplotlib
@pytest.mark.parametrize("world_size,topology", [(8, "g1n2+g2n1+g4n1"),
                                                 (64, "g1n8+g2n4+g4n2+g8n1"),
                                                 (256, "g1n2+g2n1+g4n1")])
def test_svg(tmp_path, world_size, topology):
    if world_size == 8:
        ranks = [lengths[:2] for lengths in
                 knapformer.synthetic_lengths("mixed-res", 32, seed=0, step=0)[24:]]
        plan = knapformer.plan(ranks, topology, d_model=64, gamma=0.49)
    else:
        plan = synthetic_plan(world_size, topology)
    path = tmp_path / "plan.svg"
    assert plot.plot_plan(plan, path, title="step 0 of the run") == path
    root = ElementTree.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    width, height = plot._figure_size(world_size)
    assert root.get("width").endswith("pt") and root.get("height").endswith("pt")
    assert float(root.get("width")[:-2]) == width * 72
    assert float(root.get("height")[:-2]) == height * 72
    assert "step 0 of the run" in path.read_text()  # text drawn as paths keeps a comment


@needs_matplotlib
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_same_plan_same_file_and_no_global_state(tmp_path, suffix):
    plan = small_plan()
    rc = dict(dict.items(matplotlib.rcParams))  # dict.items: no backend resolution
    plot.plot_plan(plan, tmp_path / ("a" + suffix))
    plot.plot_plan(plan, tmp_path / ("b" + suffix))
    assert (tmp_path / ("a" + suffix)).read_bytes() == (tmp_path / ("b" + suffix)).read_bytes()
    assert dict(dict.items(matplotlib.rcParams)) == rc
    assert "matplotlib.pyplot" not in sys.modules


def test_importing_the_module_leaves_matplotlib_alone():
    code = ("import sys, knapformer; loaded = set(sys.modules); import knapformer.plot; "
            "print(sorted(m for m in set(sys.modules) - loaded if m.startswith('matplotlib')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError) as error:
        plot.plot_plan(small_plan(), tmp_path / "plan.png")
    assert str(error.value) == ("knapformer.plot_plan needs matplotlib: pip install matplotlib "
                                "(Debian: apt-get install python3-matplotlib)")
    assert not (tmp_path / "plan.png").exists()


@pytest.mark.parametrize("source,text", [
    ({"world_size": 4}, "missing gpu_workload_before, gpu_workload (knapformer plan) or "
                        "workload_before, workload_after"),
    ({"gpu_workload": [1.0]}, "plan is missing gpu_workload_before"),
    ({"workload_after": [1.0]}, "summary is missing workload_before"),
    ({"workload_before": [1.0, 2.0], "workload_after": [1.0, 2.0], "world_size": 4},
     "workload_before: 2 ranks, world_size is 4"),
    ({"workload_before": [1.0], "workload_after": [float("nan")]},
     "workload_after: expected a list of finite numbers per rank"),
    ({"workload_before": [1.0], "workload_after": [1.0],
      "chunks": [{"src_rank": 0, "dst_rank": 1, "length": 3}]}, "chunks[0].dst_rank: 1 is"),
    ([1, 2], "got list"),
])
def test_bad_input(tmp_path, source, text):
    with pytest.raises(ValueError, match=re.escape(text)):
        plot.plot_plan(source, tmp_path / "plan.png")


def test_a_rank_slice_is_not_a_plan(tmp_path):
    one_rank = knapformer.plan(RANKS, TOPOLOGY, rank=2)
    with pytest.raises(ValueError, match="rank 2's slice of a plan"):
        plot.plot_plan(one_rank, tmp_path / "plan.png")


def test_bad_suffix(tmp_path):
    with pytest.raises(ValueError, match=r"plan\.jpg: unsupported suffix '\.jpg'"):
        plot.plot_plan(small_plan(), tmp_path / "plan.jpg")


def test_bags():
    assert plot._bags("g1n2+g2n1+g4n1", 8) == ([(0, 1), (1, 1), (2, 2), (4, 4)], [])
    assert plot._bags("g4n1+g1n1+g1n1+g2n1", 16) == (
        [(0, 1), (1, 1), (2, 2), (4, 4), (8, 1), (9, 1), (10, 2), (12, 4)], [8])
    assert plot._bags("g1n2+g2n1;g2n2", 8) == ([(0, 1), (1, 1), (2, 2), (4, 2), (6, 2)], [4])
    for layout, world_size in [("auto", 8), ("auto:max_bag=4", 8), ("g1n3", 8),
                               ("g1n2;g1n4", 6), ("g1n2;g1n2", 6), ("", 4), (None, 4)]:
        assert plot._bags(layout, world_size) == ([], []), layout


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "knapformer.plot", *map(str, args)],
                          input=stdin, capture_output=True, text=True, timeout=120)


@needs_matplotlib
def test_cli(tmp_path):
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(json.dumps(small_plan()))
    result = run_cli(plan_json, tmp_path / "plan.png")
    # Quiet: also no runpy warning that knapformer/__init__ imported this module early.
    assert result.returncode == 0 and not result.stderr, result.stderr
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    result = run_cli("-", tmp_path / "stdin.svg", "--title", "from stdin",
                     stdin=plan_json.read_text())
    assert result.returncode == 0, result.stderr
    assert "from stdin" in (tmp_path / "stdin.svg").read_text()


def test_cli_errors(tmp_path):
    plan_json = tmp_path / "plan.json"
    plan_json.write_text(json.dumps(small_plan()))
    for args, text in [((plan_json, tmp_path / "plan.gif"), "unsupported suffix '.gif'"),
                       ((tmp_path / "absent.json", tmp_path / "plan.png"), "absent.json"),
                       (("-", tmp_path / "plan.png"), "stdin: not JSON")]:
        result = run_cli(*args, stdin="{")
        assert result.returncode == 2, (args, result.stderr)
        assert text in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not (tmp_path / "plan.png").exists()
    result = run_cli("-h")
    assert result.returncode == 0 and "usage: python3 -m knapformer.plot" in result.stdout
    assert run_cli().returncode == 2  # argparse: the arguments are missing
