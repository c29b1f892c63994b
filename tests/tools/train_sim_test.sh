#!/bin/bash
# train-sim end to end on 4 Gloo processes: it runs, balanced and unbalanced
# training agree (the binary exits 1 otherwise), every step's plan lowers the
# predicted max/mean, and bad options are exit 2 naming the flag.
set -u
bin="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

if ! timeout 300 "$bin" --procs 4 --steps 3 --scale 32 >"$tmp/out" 2>"$tmp/err"; then
  fail "train-sim exited non-zero: $(cat "$tmp/out" "$tmp/err")"
fi
cat "$tmp/out"
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
unbalanced = re.findall(r"^\d+\s+unbalanced\s+((?:\d+ ){3}\d+)\s+[\d.]+\s+\d+\s+([\d.]+)$", text, re.M)
balanced = re.findall(r"^\s+balanced\s+((?:\d+ ){3}\d+)\s+[\d.]+\s+\d+\s+([\d.]+) \(local planner, waited [\d.]+ ms\)$", text, re.M)
assert len(unbalanced) == 3 and len(balanced) == 3, f"expected 3 steps of both rows:\n{text}"
for (_, before), (_, after) in zip(unbalanced, balanced):
    assert float(after) < float(before), f"plan did not lower max/mean: {before} -> {after}"
match = re.search(r"largest relative loss difference ([\d.e+-]+), gradient ([\d.e+-]+)", text)
assert match and float(match.group(1)) <= 1e-4 and float(match.group(2)) <= 1e-3, text
assert "max per-rank compute" in text and "FAILED" not in text, text
# --gamma fit (the default): 6 lengths timed on each of the 4 ranks; a fit
# the times refuse (noise at these tiny lengths) says why and keeps gamma 1.
fit = re.search(r"gamma ([\d.e+-]+) fitted to (\d+) timed blocks \(r\^2 ([\d.-]+); k = ([\d.e+-]+) s", text)
unfit = re.search(r"gamma 1 the default: no fit \(.+\)", text)
assert fit or unfit, f"no gamma fit in the header:\n{text}"
if fit:
    assert int(fit.group(2)) == 24 and float(fit.group(1)) >= 0 and float(fit.group(4)) > 0, fit.group(0)
print("ok   train-sim output,", (fit or unfit).group(0))
PY

# Planning ahead (locally here): every step after the first was prefetched,
# and training still matches the unbalanced run (the binary checks it).
# --planner none plans locally over a planner the environment names (one
# that never answers: a step asking it would fall back, named in its row).
if ! KNAPFORMER_PLANNER_ADDRESS=127.0.0.1:1 timeout 300 "$bin" --procs 4 --steps 3 --scale 32 \
    --plan-ahead 1 --gamma 2.5 --planner none >"$tmp/out" 2>"$tmp/err"; then
  fail "train-sim --plan-ahead 1 exited non-zero: $(cat "$tmp/out" "$tmp/err")"
fi
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
rows = re.findall(r"^\s+balanced\s.*\(local planner(, ahead)?, waited [\d.]+ ms\)$", text, re.M)
assert rows == ["", ", ahead", ", ahead"], f"steps 1 and 2 (only) planned ahead: {rows}\n{text}"
assert re.search(r"waiting for the plan \(slowest rank\): p50 [\d.]+ ms, p99 [\d.]+ ms; "
                 r"balanced step compute p50 \d+ ms \(planning one step ahead\)", text), text
assert "2 layers, gamma 2.5 --gamma, local planning" in text, text  # given, not fitted
print("ok   train-sim --plan-ahead 1")
PY
# Several topologies in one run, auto among them: every step is balanced
# with each (training matches the unbalanced run for all of them, or the
# binary exits 1), auto's rows name the layout it chose, auto is named by
# the bags it may use on 4 processes (max_bag=4, as simulate names it), and
# the summary compares auto with the best fixed topology measured in the
# same run.
if ! timeout 400 "$bin" --procs 4 --steps 3 --scale 32 --topology auto,g1n4,g4n1 \
    >"$tmp/out" 2>"$tmp/err"; then
  fail "train-sim --topology auto,g1n4,g4n1 exited non-zero: $(cat "$tmp/out" "$tmp/err")"
fi
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
chosen = re.findall(r"^\s+balanced\s.*\(local planner, waited [\d.]+ ms\) auto:max_bag=4 -> "
                    r"(g\d+n\d+(?:\+g\d+n\d+)*)$", text, re.M)
assert len(chosen) == 3, f"3 steps with auto's chosen layout:\n{text}"
for layout in chosen:
    terms = [tuple(map(int, re.match(r"g(\d+)n(\d+)", t).groups())) for t in layout.split("+")]
    assert sum(g * n for g, n in terms) == 4 and all(g in (1, 2, 4) for g, _ in terms), layout
for fixed in ("g1n4", "g4n1"):
    assert len(re.findall(rf"^\s+balanced\s.*ms\) {fixed}$", text, re.M)) == 3, text
match = re.search(r"^auto:max_bag=4 vs the best fixed topology (g1n4|g4n1): max per-rank compute "
                  r"(\d+) ms vs (\d+) ms \(([\d.]+)x\)$", text, re.M)
assert match, text
assert "mean over steps 1..2 [auto:max_bag=4]" in text and "FAILED" not in text, text
print(f"ok   train-sim auto: {chosen}, {match.group(0)}")
PY
"$bin" --procs 4 --topology auto:max_bag=3 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--topology: topology 'auto:max_bag=3': max_bag=3 is not a power of two" "$tmp/err"; then
  fail "auto:max_bag=3: exit $code, $(cat "$tmp/err")"
fi
"$bin" --procs 4 --topology auto --heads 2 --d-model 64 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--heads: 2 heads do not split over a bag of 4 GPUs of --topology auto:max_bag=4" "$tmp/err"; then
  fail "2 heads under auto on 4 processes: exit $code, $(cat "$tmp/err")"
fi

"$bin" --procs 4 --plan-ahead 2 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "plan-ahead" "$tmp/err"; then
  fail "--plan-ahead 2: exit $code, $(cat "$tmp/err")"
fi

# A masked stream: every step planned mask-blind and with the masks, on
# the same weights and tokens, attention always masked (block-sparse);
# both runs match the unbalanced one (the binary exits 1 otherwise), and
# the summary compares the two plans' slowest ranks (a figure: which one
# is faster is measured, not asserted).
if ! timeout 400 "$bin" --procs 4 --steps 2 --data interleaved --scale 16 --layers 1 \
    --topology g1n2+g2n1 >"$tmp/out" 2>"$tmp/err"; then
  fail "train-sim --data interleaved exited non-zero: $(cat "$tmp/out" "$tmp/err")"
fi
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
blind = re.findall(r"^\s+mask-blind\s+((?:\d+ ){3}\d+)\s", text, re.M)
masked = re.findall(r"^\s+masked\s+((?:\d+ ){3}\d+)\s", text, re.M)
assert len(blind) == 2 and len(masked) == 2, f"both plans every step:\n{text}"
assert "data interleaved (lengths / 16)" in text, text
assert re.search(r"masked vs mask-blind \[g1n2\+g2n1\]: max per-rank compute \d+ ms vs \d+ ms "
                 r"\([\d.]+x\); WIR [\d.]+ vs [\d.]+", text), text
match = re.search(r"largest relative loss difference ([\d.e+-]+), gradient ([\d.e+-]+)", text)
assert match and float(match.group(1)) <= 1e-4 and float(match.group(2)) <= 1e-3, text
print("ok   train-sim --data interleaved")
PY
"$bin" --procs 4 --data interleaved --topology g1n4,g2n2,g4n1,auto,g1n2+g2n1 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--topology: 5 topologies, at most 4 with a masked stream" "$tmp/err"; then
  fail "5 topologies with a masked stream: exit $code, $(cat "$tmp/err")"
fi

# A slow rank (its times divided by 0.5, as a GPU at half speed takes):
# every step balanced by FLOPs and by speeds learned from the ranks'
# timings; the speeds learned name rank 1 slow within a few steps, and the
# summary compares the two by the ideal (figures, not asserted faster: 4
# processes on 2 cores).
if ! timeout 400 "$bin" --procs 4 --steps 6 --scale 32 --layers 1 --topology g1n4 \
    --data g2b16i512f1s0,g2b4i1024f1s0 --rank-speeds learned --slow-rank 1:0.5 \
    >"$tmp/out" 2>"$tmp/err"; then
  fail "train-sim --slow-rank exited non-zero: $(cat "$tmp/out" "$tmp/err")"
fi
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
flops = re.findall(r"^\s+by FLOPs\s+(?:\d+ ){3}\d+\s.*the ideal$", text, re.M)
speed = re.findall(r"^\s+by speed\s+(?:\d+ ){3}\d+\s.*the ideal(.*)$", text, re.M)
assert len(flops) == 6 and len(speed) == 6, f"both plans every step:\n{text}"
slow = [re.search(r"rank 1 (0\.\d+)", s) for s in speed[3:]]
assert all(m and float(m.group(1)) < 0.75 for m in slow), f"rank 1 learned slow:\n{text}"
assert "speeds" not in speed[0], f"nothing learned before a timing:\n{text}"
assert re.search(r"by speed vs by FLOPs \[g1n4\]: max per-rank compute \d+ ms vs \d+ ms "
                 r"\([\d.]+x\); slowest rank over the ideal [\d.]+ vs [\d.]+", text), text
match = re.search(r"largest relative loss difference ([\d.e+-]+), gradient ([\d.e+-]+)", text)
assert match and float(match.group(1)) <= 1e-4 and float(match.group(2)) <= 1e-3, text
print("ok   train-sim --slow-rank --rank-speeds learned")
PY
for bad in "--slow-rank 4:0.5|--slow-rank: '4:0.5' names no rank of --procs 4" \
           "--slow-rank 1:0|--slow-rank: '1:0' has a fraction outside [0.05, 1]" \
           "--slow-rank 1:0.5:9-3|has no step range FROM-TO" \
           "--rank-speeds 1,1|--rank-speeds: 2 speeds for a world of 4 ranks" \
           "--rank-speeds fast|--rank-speeds: 'fast' is not a number"; do
  IFS='|' read -r flags message <<<"$bad"
  # shellcheck disable=SC2086  # the flags are words
  "$bin" --procs 4 $flags >"$tmp/out" 2>"$tmp/err"
  code=$?
  if [[ $code -ne 2 ]] || ! grep -qF -- "$message" "$tmp/err"; then
    fail "$flags: exit $code, $(cat "$tmp/err")"
  fi
done
"$bin" --procs 4 --data interleaved --rank-speeds learned >"$tmp/out" 2>"$tmp/err"
if [[ $? -ne 2 ]] || ! grep -qF -- "--rank-speeds: not with a masked stream" "$tmp/err"; then
  fail "--rank-speeds with a masked stream: $(cat "$tmp/err")"
fi

"$bin" --procs 4 --gamma fast >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--gamma: 'fast' is neither fit nor a finite number >= 0" "$tmp/err"; then
  fail "--gamma fast: exit $code, $(cat "$tmp/err")"
fi

"$bin" --procs 4 --heads 3 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--heads: 3 heads do not divide --d-model 64" "$tmp/err"; then
  fail "bad --heads: exit $code, $(cat "$tmp/err")"
fi
"$bin" --procs 3 --steps 1 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--data/--procs: world: 3 must be a positive multiple" "$tmp/err"; then
  fail "3 processes for a 4-GPU data block: exit $code, $(cat "$tmp/err")"
fi
"$bin" --procs 4 --topology g4n1 --heads 2 --d-model 64 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--heads: 2 heads do not split over a bag of 4 GPUs" "$tmp/err"; then
  fail "2 heads over a bag of 4: exit $code, $(cat "$tmp/err")"
fi
"$bin" --procs 4 --topology g3n1 >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--topology/--procs:" "$tmp/err"; then
  fail "a 3-GPU topology for 4 processes: exit $code, $(cat "$tmp/err")"
fi

echo "$failures failures"
[[ $failures -eq 0 ]]
