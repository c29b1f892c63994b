#!/bin/bash
# End-to-end checks of the knapformer binary: exit codes, one-line errors
# naming the field, and JSON that matches the input.
set -u
bin="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

expect() {  # expect NAME EXIT_CODE STDERR_SUBSTRING -- command...
  local name="$1" code="$2" needle="$3"
  shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  if [[ $got -ne $code ]]; then
    echo "FAIL $name: exit $got, expected $code; stderr: $(cat "$tmp/err")"
    failures=$((failures + 1))
  elif [[ -n "$needle" ]] && ! grep -qF -- "$needle" "$tmp/err"; then
    echo "FAIL $name: stderr lacks '$needle': $(cat "$tmp/err")"
    failures=$((failures + 1))
  elif [[ $code -ne 0 && $(wc -l <"$tmp/err") -ne 1 ]]; then
    echo "FAIL $name: error is not one line: $(cat "$tmp/err")"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

cat >"$tmp/good.json" <<'JSON'
{"topology": "g1n2+g2n1+g4n1", "d_model": 3072, "gamma": 0.49,
 "ranks": [[4096, 256], [1024], [], [16384, 300, 300], [512], [64], [0], [2048]]}
JSON
expect plan-ok 0 "" -- "$bin" plan --input "$tmp/good.json"
# Every token of every input sequence appears exactly once in the chunks.
python3 - "$tmp/out" "$tmp/good.json" <<'PY' || { echo "FAIL plan-coverage"; failures=$((failures + 1)); }
import json, sys
plan = json.load(open(sys.argv[1])); req = json.load(open(sys.argv[2]))
covered = {}
for c in plan["chunks"]:
    covered.setdefault((c["src_rank"], c["seq_index"]), []).append((c["offset"], c["length"]))
for r, lengths in enumerate(req["ranks"]):
    for i, l in enumerate(lengths):
        pieces = sorted(covered.pop((r, i), []))
        pos = 0
        for off, n in pieces:
            assert off == pos and n > 0, (r, i, pieces)
            pos += n
        assert pos == l, (r, i, pos, l)
assert not covered, covered
assert len(plan["gpu_workload"]) == 8
assert abs(sum(plan["gpu_workload"]) - sum(plan["gpu_workload_before"])) < 1e-6 * sum(plan["gpu_workload_before"])
PY
echo "ok   plan-coverage"
# Moved bytes price the moved tokens at 2 x d_model bytes (a bf16 hidden
# state) unless the request says otherwise.
if python3 - "$tmp/out" <<'PY'; then echo "ok   plan-moved-bytes"; else echo "FAIL plan-moved-bytes"; failures=$((failures + 1)); fi
import json, sys
plan = json.load(open(sys.argv[1]))
moved = sum(c["length"] for c in plan["chunks"] if c["src_rank"] != c["dst_rank"])
assert plan["moved_tokens"] == moved > 0, (plan["moved_tokens"], moved)
assert plan["token_bytes"] == 2 * 3072, plan["token_bytes"]
assert plan["moved_bytes"] == moved * 2 * 3072, plan["moved_bytes"]
PY
expect plan-stdin 0 "" -- bash -c "\"$bin\" plan --input - < \"$tmp/good.json\""
expect plan-rank 0 "" -- "$bin" plan --input "$tmp/good.json" --rank 3
grep -q '"ulysses"' "$tmp/out" || { echo "FAIL plan-rank: no ulysses field"; failures=$((failures + 1)); }
expect plan-locality-off 0 "" -- "$bin" plan --input "$tmp/good.json" --locality off
expect plan-cap-ok 0 "" -- "$bin" plan --input "$tmp/good.json" --max-tokens-per-gpu 20000
expect plan-cap-impossible 2 "max_tokens_per_gpu: sequence 0 of rank 3 (16384 tokens) fits in no bag under the cap of 1000 tokens per GPU" -- "$bin" plan --input "$tmp/good.json" --max-tokens-per-gpu 1000
expect plan-locality-bad 2 "--locality: must be on or off, got 'maybe'" -- "$bin" plan --input "$tmp/good.json" --locality maybe
expect plan-rank-range 2 "--rank: '8' is not a whole number in [0, 7]" -- "$bin" plan --input "$tmp/good.json" --rank 8

echo '{"topology": "g1n2abc", "ranks": [[1],[2]]}' >"$tmp/bad_topology.json"
expect bad-topology 2 "topology term 'g1n2abc': unexpected trailing 'abc'" -- "$bin" plan --input "$tmp/bad_topology.json"
echo '{"topology": "g1n2+g2n1+g4n1", "ranks": [[1],[2],[3]]}' >"$tmp/bad_world.json"
expect bad-world 2 "ranks: 3 ranks is not a multiple of the group size 8" -- "$bin" plan --input "$tmp/bad_world.json"
echo '{"topology": "g1n2", "ranks": [[1],[-2]]}' >"$tmp/bad_length.json"
expect bad-length 2 "ranks[1][0]: sequence length -2" -- "$bin" plan --input "$tmp/bad_length.json"
echo '{"topology": "g1n2", "ranks": [[1],[2]], "gamma": -1}' >"$tmp/bad_gamma.json"
expect bad-gamma 2 "gamma: must be a finite number" -- "$bin" plan --input "$tmp/bad_gamma.json"
echo 'not json' >"$tmp/bad_json.json"
expect bad-json 2 "input: not valid JSON" -- "$bin" plan --input "$tmp/bad_json.json"
expect missing-file 2 "--input: cannot read" -- "$bin" plan --input "$tmp/none.json"
expect missing-input 2 "--input: required" -- "$bin" plan
expect unknown-option 2 "--bogus: unknown option" -- "$bin" plan --bogus 1
expect unknown-command 2 "unknown command 'frobnicate'" -- "$bin" frobnicate
expect help 0 "" -- "$bin" help
grep -q "^  serve " "$tmp/out" || { echo "FAIL help: no serve in the usage"; failures=$((failures + 1)); }
expect serve-bad-flag 2 "--max-pending-steps: '0' is not a whole number" -- "$bin" serve --max-pending-steps 0
expect serve-bad-retain 2 "--retain-freed-memory: must be on or off, got 'yes'" -- "$bin" serve --retain-freed-memory yes

expect simulate-ok 0 "" -- "$bin" simulate --data low-res --steps 2 --topology g1n32,g8n4
grep -q "^g8n4 " "$tmp/out" || { echo "FAIL simulate-ok: no g8n4 row"; failures=$((failures + 1)); }
expect simulate-bad-data 2 "--data: data code 'g1b1i256f1s9': s exceeds the limit of 1" -- "$bin" simulate --data g1b1i256f1s9
expect simulate-bad-world 2 "--world: world: 30 must be a positive multiple" -- "$bin" simulate --world 30
expect simulate-bad-topology 2 "--topology g4n3: world_size: 32 is not a multiple of the group size 12" -- "$bin" simulate --topology g4n3
expect simulate-bad-steps 2 "--steps: 'x' is not a whole number" -- "$bin" simulate --steps x
expect simulate-bad-gamma 2 "--gamma: 'nan' is not a finite number" -- "$bin" simulate --gamma nan
# Moved tokens and bytes per step: bytes = tokens x --token-bytes.
expect simulate-moved 0 "" -- "$bin" simulate --data low-res --steps 2 --topology g8n4 --token-bytes 1000
if python3 - "$tmp/out" <<'PY'; then echo "ok   simulate-moved-figures"; else echo "FAIL simulate-moved-figures: $(cat "$tmp/out")"; failures=$((failures + 1)); fi
import re, sys
text = open(sys.argv[1]).read()
assert "token bytes 1000;" in text, text
row = next(line for line in text.splitlines() if line.startswith("g8n4 "))
share, tokens, nbytes = re.search(r"(\d+\.\d)% +(\S+) +(\S+) +\d+/\d+$", row.rstrip()).groups()
unit = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
def value(s):
    m = re.fullmatch(r"([\d.]+)([kMGT]?)", s)
    return float(m.group(1)) * unit[m.group(2)]
# g8 bags: at least 7/8 of every token moves; low-res has 1024 samples of
# 256 visual and 0-392 text tokens a step (~463k).
assert 80 < float(share) < 100, share
assert 3e5 < value(tokens) < 5e5, tokens
assert abs(value(nbytes) / value(tokens) - 1000) < 10, (tokens, nbytes)
PY
expect simulate-bad-token-bytes 2 "--token-bytes: '-1' is not a whole number in [0, 16777216]" -- "$bin" simulate --token-bytes -1
expect simulate-cap-impossible 2 "step 0, topology g1n32: max_tokens_per_gpu: sequence" -- "$bin" simulate --data low-res --steps 1 --topology g1n32 --max-tokens-per-gpu 100

# calibrate: times made from a known gamma (0.49) with 2% noise come back as it.
python3 - >"$tmp/times.csv" <<'PY'
import random
random.seed(3)
d, k, gamma = 3072, 2.5e-15, 0.49
print("length,seconds")
for length in [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]:
    for _ in range(5):
        seconds = k * (24 * length * d * d + gamma * 4 * length * length * d)
        print(f"{length},{seconds * (1 + random.gauss(0, 0.02)):.9g}")
PY
expect calibrate-ok 0 "" -- "$bin" calibrate --input "$tmp/times.csv" --d-model 3072
python3 - "$tmp/out" <<'PY' || { echo "FAIL calibrate-gamma"; failures=$((failures + 1)); }
import re, sys
text = open(sys.argv[1]).read()
gamma = float(re.search(r"^gamma\s+([\d.]+)$", text, re.M).group(1))
assert abs(gamma - 0.49) < 0.025, text
assert "40 samples" in text, text
PY
printf 'length,seconds\n256,0.001\n512,soon\n' >"$tmp/bad_times.csv"
expect calibrate-bad-line 2 "--input: line 3: expected \"length,seconds\", got \"512,soon\"" -- "$bin" calibrate --input "$tmp/bad_times.csv" --d-model 64
printf '512,0.001\n512,0.0011\n' >"$tmp/one_length.csv"
expect calibrate-one-length 2 "time at least two different lengths" -- "$bin" calibrate --input "$tmp/one_length.csv" --d-model 64
expect calibrate-no-d 2 "--d-model: required" -- "$bin" calibrate --input "$tmp/one_length.csv"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
