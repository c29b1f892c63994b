"""The report: a check's result (one row, or one rank's part of it), rows merged from
every rank's results, the text table, the JSON file and the exit status they give."""
import json
import math
import os
import sys

# Exit statuses of the command.
OK, FAILED, BAD_ARGUMENTS, NO_GPU = 0, 1, 2, 3

# The variable the command's own tests inject faults with; a report names it.
FAULT_ENV = "KNAPFORMER_GPU_CHECK_FAULT"

_SEVERITY = {"PASS": 0, "INFO": 1, "SKIP": 2, "FAIL": 3}


def result(name, verdict, detail, figures=None):
    """One check's result: a row of the report, or one rank's part of it."""
    return {"name": name, "verdict": verdict, "figures": dict(figures or {}), "detail": detail}


def one_line(error, limit=300):
    """An error's (or a text's) first line, at most limit characters."""
    text = str(error).strip().splitlines()
    text = text[0] if text else type(error).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def last_line(text):
    """A traceback's last line (the error), for a detail."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else str(text)


def problems_text(problems, limit=3):
    """The first problems found, joined for a detail."""
    more = f" (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "; ".join(problems[:limit]) + more


def merge_ranks(name, per_rank):
    """One row from every rank's result of one check ({rank: result, or a string saying
    why that rank has none}). The verdict is the worst (FAIL > SKIP > INFO > PASS), its
    detail and figures those of the lowest rank with it; every rank's own is kept."""
    ranks = {}
    for rank in sorted(per_rank):
        got = per_rank[rank]
        if not isinstance(got, dict):
            got = result(name, "FAIL", str(got) if got else f"rank {rank} sent no result")
        ranks[rank] = got
    chosen = max(ranks, key=lambda r: (_SEVERITY.get(ranks[r]["verdict"], 3), -r))
    row = dict(ranks[chosen])
    row["name"] = name
    verdicts = {ranks[r]["verdict"] for r in ranks}
    if len(ranks) > 1 and (row["verdict"] == "FAIL" or len(verdicts) > 1):
        others = [r for r in ranks if r != chosen and ranks[r]["verdict"] == row["verdict"]]
        also = f" (also rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})" \
            if others else ""
        row["detail"] = f"rank {chosen}: {row['detail']}{also}"
    row["ranks"] = {str(r): {k: v for k, v in ranks[r].items() if k != "name"} for r in ranks}
    return row


def exit_status(rows):
    """FAILED where a row FAILed, else OK."""
    return FAILED if any(row["verdict"] == "FAIL" for row in rows) else OK


def _figure_text(figures, width, limit=3):
    parts = []
    for key, value in list(figures.items())[:limit]:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            parts.append(f"{key}={value}")
        elif isinstance(value, int):
            parts.append(f"{key}={value}")
        else:
            parts.append(f"{key}={value:.3g}")
    if len(figures) > limit:
        parts.append("...")
    text = " ".join(parts)
    return text if len(text) <= width else text[:width - 3] + "..."


def _build_text(build, transport):
    if not build:
        return f"no build_info (an older build); raw NCCL transport: {'yes' if transport else 'no'}"
    cuda = build.get("torch_cuda")
    abi = build.get("cxx11_abi")
    return (f"{build.get('version', '?')}, built by {build.get('built_by', '?')} against torch "
            f"{build.get('torch', '?')} ({'CUDA ' + str(cuda) if cuda else 'no CUDA'}), "
            f"Python {build.get('python', '?')}, "
            f"{'new' if abi else 'old' if abi is not None else '?'} C++ ABI, raw NCCL "
            f"transport: {'yes' if build.get('nccl_transport', transport) else 'no'}")


def render_report(header, rows):
    """The report as text: the header, one row per check, every FAIL's whole detail."""
    nccl = header.get("nccl") or "none"
    cuda = header.get("torch_cuda") or "none (CPU build)"
    lines = [f"knapformer gpu_check: {header.get('mode', '?')}",
             f"  devices:    {'; '.join(header.get('devices') or ['none'])}",
             f"  torch:      {header.get('torch')}, CUDA {cuda}, NCCL {nccl}",
             "  knapformer: " + _build_text(header.get("build_info") or {},
                                            header.get("nccl_transport_available")),
             f"  python:     {header.get('python')} on {header.get('host')}"]
    if header.get("fault"):
        lines.append(f"  FAULT INJECTED ({FAULT_ENV}={header['fault']}): a test run, "
                     "not a verdict on this machine")
    lines.append("")
    figures = [_figure_text(row.get("figures") or {}, 48) for row in rows]
    name_w = max([len("check")] + [len(row["name"]) for row in rows])
    fig_w = max([len("figures")] + [len(f) for f in figures])
    lines.append(f"{'check':<{name_w}}  verdict  {'figures':<{fig_w}}  detail")
    lines.append(f"{'-' * name_w}  -------  {'-' * fig_w}  {'-' * 40}")
    for row, figure in zip(rows, figures):
        detail = row.get("detail") or ""
        if len(detail) > 110:
            detail = detail[:107] + "..."
        lines.append(f"{row['name']:<{name_w}}  {row['verdict']:<7}  {figure:<{fig_w}}  {detail}")
    counts = {v: sum(1 for row in rows if row["verdict"] == v) for v in _SEVERITY}
    lines.append("")
    lines.append(f"{len(rows)} checks: {counts['PASS']} PASS, {counts['FAIL']} FAIL, "
                 f"{counts['INFO']} INFO, {counts['SKIP']} SKIP; exit status "
                 f"{exit_status(rows)}")
    for row in rows:
        if row["verdict"] == "FAIL":
            lines.append(f"FAIL {row['name']}: {row.get('detail', '')}")
    return "\n".join(lines) + "\n"


def _finite(value):
    """JSON without NaN/Infinity, which strict readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json(path, header, rows, status):
    counts = {v: sum(1 for row in rows if row["verdict"] == v) for v in _SEVERITY}
    document = {"header": header, "checks": rows, "counts": counts, "exit_status": status}
    text = json.dumps(_finite(document), indent=2, default=str) + "\n"
    temporary = f"{path}.tmp{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temporary, path)  # a reader never sees half a file


def write_json_saying_where(path, header, rows, status, label="JSON"):
    """write_json, then the file's path on stdout; a file that cannot be written is
    said on stderr and costs the report nothing else."""
    try:
        write_json(path, header, rows, status)
        print(f"{label}: {os.path.abspath(path)}", flush=True)
    except OSError as error:
        print(f"gpu_check: could not write {path}: {error}", file=sys.stderr, flush=True)


def finish(path, header, rows):
    """Prints the report, writes its JSON to path; returns the exit status."""
    status = exit_status(rows)
    print(render_report(header, rows), end="", flush=True)
    write_json_saying_where(path, header, rows, status)
    return status
