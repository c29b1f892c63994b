#!/bin/bash
# The GPU figures docs/planner.md lacks, in one call on a GPU machine: the
# package installed and its GPU check (scripts/gpu_check.sh), then
# `knapformer replay` of the paper's FLUX block (--model flux: d_model 3072,
# 24 heads of 128, bf16) on its three scenarios at 32 simulated GPUs, and a
# Markdown table of them for docs/planner.md, the device named.
#   bash scripts/replay_paper_table.sh --out DIR [--budget-s S] [--steps N]
#        [--topology T,...] [--python PY] [--venv DIR] [--packages DIR]
#        [--no-install] [--skip-check] [-- REPLAY_ARGS...]
#     --out        where the reports go: gpu_check.json, replay-SCENARIO.{txt,json},
#                  table.md
#     --budget-s   wall seconds for the replays (default 420: a 10-minute device
#                  run less the install and the check); each scenario gets an
#                  equal share of what is left when it starts, and one that
#                  overruns it is stopped and reported as such
#     --steps      steps per scenario (default 2: fewer steps before fewer topologies)
#     --topology   default g1n32,g2n16,g4n8,g8n4,auto (the paper's g8n4 among them)
#     --python, --venv, --packages, --no-install: as scripts/gpu_check.sh
#     --skip-check  no GPU check (the install still runs unless --no-install)
# Anything after -- goes to every replay (e.g. --device cpu --d-model 64 to
# try the script without a GPU; it then replaces --model flux).
# Exits 0 when every scenario's replay finished, 1 otherwise, 2 for a usage
# error, 4 when the install failed.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="" budget=420 steps=2 topology="g1n32,g2n16,g4n8,g8n4,auto"
python="$(command -v python3 || true)" check_args=() skip_check=0 install=1
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "replay_paper_table: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out|--budget-s|--steps|--topology|--python|--venv|--packages)
      [[ -n "${2:-}" ]] || die "$1 needs a value"
      case "$1" in
        --out) out="$2" ;; --budget-s) budget="$2" ;; --steps) steps="$2" ;;
        --topology) topology="$2" ;; --python) python="$2"; check_args+=(--python "$2") ;;
        --venv) check_args+=(--venv "$2"); python="$2/bin/python" ;;
        --packages) check_args+=(--packages "$2") ;;
      esac
      shift 2 ;;
    --no-install) install=0; check_args+=(--no-install); shift ;;
    --skip-check) skip_check=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done
replay_args=("$@")
[[ -n "$out" ]] || die "--out DIR is required"
[[ "$budget" =~ ^[0-9]+$ && "$budget" -ge 1 ]] || die "--budget-s: a positive number of seconds, got '$budget'"
[[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 1 ]] || die "--steps: a positive integer, got '$steps'"
mkdir -p "$out" || die "cannot make --out $out"
out="$(cd "$out" && pwd)"

# The install and the GPU check (its report in $out), or the install alone.
if [[ $skip_check -eq 0 ]]; then
  (cd "$out" && bash "$root/scripts/gpu_check.sh" "${check_args[@]}" -- --json "$out/gpu_check.json")
  status=$?
  [[ $status -eq 4 ]] && exit 4
  echo "replay_paper_table: the GPU check exited $status (report: $out/gpu_check.json)"
elif [[ $install -eq 1 ]]; then
  (cd "$out" && bash "$root/scripts/gpu_check.sh" "${check_args[@]}" -- --dry-run >/dev/null)
  [[ $? -eq 4 ]] && exit 4
fi
[[ -x "$(command -v "$python")" ]] || die "no interpreter '$python' (--python, --venv)"

# --model flux unless the caller chose the widths.
model=(--model flux)
for arg in "${replay_args[@]}"; do
  [[ "$arg" == --model* || "$arg" == --d-model* ]] && model=()
done
started=$SECONDS failed=0
scenarios=(low-res mixed-res joint)
for i in "${!scenarios[@]}"; do
  scenario="${scenarios[$i]}"
  left=$((budget - (SECONDS - started)))
  share=$((left / (${#scenarios[@]} - i)))
  if [[ $share -lt 10 ]]; then
    echo "replay_paper_table: $scenario: not run, the budget is spent" | tee "$out/replay-$scenario.txt"
    failed=1
    continue
  fi
  # Outside the checkout: the installed package is the one imported.
  (cd "$out" && timeout --kill-after=10 "$share" "$python" -m knapformer.replay \
    --data "$scenario" --world 32 --steps "$steps" --topology "$topology" \
    --json "$out/replay-$scenario.json" "${model[@]}" "${replay_args[@]}") \
    >"$out/replay-$scenario.txt" 2>&1
  status=$?
  if [[ $status -ne 0 ]]; then
    failed=1
    [[ $status -eq 124 || $status -eq 137 ]] &&
      echo "replay_paper_table: stopped after its share of the budget, ${share} s" \
        >>"$out/replay-$scenario.txt"
    rm -f "$out/replay-$scenario.json"
  fi
  echo "replay_paper_table: $scenario: exit $status in $((SECONDS - started)) s so far"
  grep "^advice:" "$out/replay-$scenario.txt" || tail -n 3 "$out/replay-$scenario.txt"
done

# The table for docs/planner.md, from the scenarios that finished.
(cd "$out" && "$python" - "$out" <<'EOF') | tee "$out/table.md"
import json
import os
import sys

out = sys.argv[1]
rows, device = [], None
for scenario in ("low-res", "mixed-res", "joint"):
    path = os.path.join(out, f"replay-{scenario}.json")
    if not os.path.exists(path):
        rows.append(f"| {scenario} | (not finished: replay-{scenario}.txt) |||||||||")
        continue
    with open(path, encoding="utf-8") as f:
        report = json.load(f)
    device = report.get("device", device)
    for r in report["results"]:
        hfu = "-" if r["hfu"] is None else f"{100 * r['hfu']:.1f}%"
        rows.append(
            f"| {scenario} | {r['topology']} | {r['cost_model']} | "
            f"{r['fbl_seconds'] * r['speedup']:.3f} | {r['fbl_seconds']:.3f} | "
            f"{r['speedup']:.2f}x | {r['tps']:.0f} | {hfu} | "
            f"{r['predicted_max_over_mean']:.3f} | {r['measured_max_over_mean']:.3f} |")
print(f"Measured on {device or 'no device (no scenario finished)'}; gamma fitted there.\n")
print("| scenario | topology | model | FBL unbalanced (s) | FBL balanced (s) | buys | TPS | HFU "
      "| max/mean predicted | max/mean measured |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
print("\n".join(rows))
EOF
exit $failed
