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
if python3 - "$tmp/out" "$tmp/good.json" <<'PY'
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
then
  echo "ok   plan-coverage"
else
  echo "FAIL plan-coverage"
  failures=$((failures + 1))
fi
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
# Attention masks: priced by the pairs they attend, and every malformed
# one an error naming the rank, the sequence and the field.
cat >"$tmp/masked.json" <<'JSON'
{"topology": "g1n2", "d_model": 64, "gamma": 1.0, "ranks": [[4096], [3000]],
 "masks": [["causal"], ["full"]]}
JSON
expect plan-masks 0 "" -- "$bin" plan --input "$tmp/masked.json"
if python3 - "$tmp/out" <<'PY'; then echo "ok   plan-masks-priced"; else echo "FAIL plan-masks-priced"; failures=$((failures + 1)); fi
import json, sys
plan = json.load(open(sys.argv[1]))
causal = 24 * 4096 * 64 ** 2 + 4 * 64 * 4096 * 4097 / 2
assert abs(plan["gpu_workload_before"][0] - causal) < 1e-9 * causal, plan["gpu_workload_before"]
PY
expect plan-masks-rank 0 "" -- "$bin" plan --input "$tmp/masked.json" --rank 0
grep -qF '"attention_masks":["causal"]' "$tmp/out" || { echo "FAIL plan-masks-rank: $(cat "$tmp/out")"; failures=$((failures + 1)); }
bad_mask() {  # bad_mask NAME MASKS STDERR_SUBSTRING
  echo "{\"topology\": \"g1n2\", \"ranks\": [[10, 6], [5]], \"masks\": $2}" >"$tmp/$1.json"
  expect "$1" 2 "$3" -- "$bin" plan --input "$tmp/$1.json"
}
bad_mask mask-spans-sum '[["full", {"spans": [[2, "full"], [3, "causal"]]}], ["causal"]]' \
  "masks[0][1].spans: lengths add up to 5, the sequence has 6 tokens"
bad_mask mask-kind '[["full", "diagonal"], ["causal"]]' "masks[0][1]: unknown mask kind 'diagonal'"
bad_mask mask-window '[["full", "causal"], [{"window": 0}]]' "masks[1][0].window: must be at least 1, got 0"
bad_mask mask-some-ranks '[["full", "causal"], []]' "masks[1]: 0 masks for 1 sequences"
spans=$(python3 -c 'print([[1, "full"]] * 4097)' | tr "'" '"')
bad_mask mask-too-many-spans "[[{\"spans\": $spans}, \"full\"], [\"full\"]]" \
  "masks[0][0].spans: 4097 spans exceed the limit of 4096"
echo 'not json' >"$tmp/bad_json.json"
expect bad-json 2 "input: not valid JSON" -- "$bin" plan --input "$tmp/bad_json.json"
expect missing-file 2 "--input: cannot read" -- "$bin" plan --input "$tmp/none.json"
expect missing-input 2 "--input: required" -- "$bin" plan
expect unknown-option 2 "--bogus: unknown option (known: --input, --rank," -- "$bin" plan --bogus 1
expect unknown-command 2 "unknown command 'frobnicate'" -- "$bin" frobnicate
expect replay-is-python 2 "knapformer replay is Python (it times torch)" -- "$bin" replay
want="unknown command 'simulte' (plan, simulate, calibrate, serve, token, help; did you mean simulate?)"
expect unknown-command-close 2 "$want" \
  -- "$bin" simulte
# knapformer token: a kf2 token (server/job_token.h) under the key file's
# first key, its MAC checked as Python's hmac computes it, its expiry the
# TTL from now, its id on stderr; bad input names the field.
printf '# planner keys\n%s\n%s\n' 0123456789abcdef0123456789abcdef-first \
  0123456789abcdef0123456789abcdef-second >"$tmp/keys"
# check_token KIND SCOPE TTL_SECONDS: the token in $tmp/out is right.
check_token() {
  python3 - "$tmp/out" "$tmp/err" "$@" <<'PY'
import hashlib, hmac, sys, time
out, err, kind, scope, ttl = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
key = b"0123456789abcdef0123456789abcdef-first"
token = open(out).read().strip()
version, got_kind, expires, key_id, token_id, mac, got_scope = token.split(".", 6)
mac_of = lambda message: hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
assert (version, got_kind, got_scope) == ("kf2", kind, scope), token
assert key_id == mac_of("knapformer key id")[:8], token
assert mac == mac_of(f"knapformer token v2\n{kind}\n{expires}\n{key_id}\n{token_id}\n{scope}"), token
assert abs(int(expires) - (time.time() + ttl)) < 120, (expires, time.time() + ttl)
assert f"id {token_id}" in open(err).read(), open(err).read()
PY
}
expect token 0 "" -- "$bin" token --job team-a/run-1 --ttl 30d --key-file "$tmp/keys"
check_token job team-a/run-1 $((30 * 86400)) || { echo "FAIL token"; failures=$((failures + 1)); }
expect token-prefix 0 "" -- "$bin" token --prefix team-a/ --ttl 12h --key-file "$tmp/keys"
check_token prefix team-a/ $((12 * 3600)) || { echo "FAIL token-prefix"; failures=$((failures + 1)); }
expect token-no-job 2 "knapformer token: --job or --prefix: one of them is required" \
  -- "$bin" token --ttl 1d --key-file "$tmp/keys"
expect token-prefix-slash 2 "--prefix: 'team-a' must end in /" \
  -- "$bin" token --prefix team-a --ttl 1d --key-file "$tmp/keys"
expect token-bad-job 2 "--job: 'a b' is not a job id the planner accepts" \
  -- "$bin" token --job "a b" --ttl 1d --key-file "$tmp/keys"
expect token-job-slash 2 "--job: 'team-a/' is not a job id the planner accepts (spec.job_id: ends in '/'" \
  -- "$bin" token --job team-a/ --ttl 1d --key-file "$tmp/keys"
expect token-no-ttl 2 "--ttl: required" -- "$bin" token --job j --key-file "$tmp/keys"
expect token-long-ttl 2 "--ttl: '400d' is not a duration in (0, 366d]" \
  -- "$bin" token --job j --ttl 400d --key-file "$tmp/keys"
expect token-no-keys 2 "--key-file: required" -- "$bin" token --job j --ttl 1d
printf 'short\n' >"$tmp/short_keys"
expect token-short-key 2 "short_keys, line 1: a key of 5 characters; at least 32" \
  -- "$bin" token --job j --ttl 1d --key-file "$tmp/short_keys"
expect token-missing-keys 2 "none.keys: cannot be read" \
  -- "$bin" token --job j --ttl 1d --key-file "$tmp/none.keys"
expect help 0 "" -- "$bin" help
grep -q "^  serve " "$tmp/out" || { echo "FAIL help: no serve in the usage"; failures=$((failures + 1)); }

fail() { echo "FAIL $1"; failures=$((failures + 1)); }

# No command: the usage, on stderr (it is an error), exit 2.
"$bin" >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -eq 2 && ! -s "$tmp/out" ]] && grep -q "^usage: knapformer <command>" "$tmp/err"; then
  echo "ok   no-command"
else
  fail "no-command: exit $code, stdout $(head -c 100 "$tmp/out"), stderr $(head -c 100 "$tmp/err")"
fi

# Every command answers --help and -h with its own usage: stdout, exit 0,
# nothing on stderr, one line per option (with its default where it has
# one), within 100 columns; `help COMMAND` prints the same.
for command in plan simulate calibrate serve; do
  for flag in --help -h; do
    "$bin" "$command" "$flag" >"$tmp/help" 2>"$tmp/err"
    code=$?
    if [[ $code -ne 0 || -s "$tmp/err" ]]; then
      fail "$command-$flag: exit $code, stderr: $(cat "$tmp/err")"
    elif ! head -n 1 "$tmp/help" | grep -q "^usage: knapformer $command "; then
      fail "$command-$flag: not its usage: $(head -n 3 "$tmp/help")"
    elif awk 'length > 100 { exit 1 }' "$tmp/help"; [[ $? -ne 0 ]]; then
      fail "$command-$flag: lines past 100 columns: $(awk 'length > 100' "$tmp/help")"
    elif ! grep -q "^  -h, --help  *print this text and exit$" "$tmp/help"; then
      fail "$command-$flag: no -h, --help line"
    else
      echo "ok   $command-$flag"
    fi
  done
  "$bin" help "$command" >"$tmp/help_command" 2>"$tmp/err"
  if [[ $? -eq 0 ]] && cmp -s "$tmp/help" "$tmp/help_command" && [[ ! -s "$tmp/err" ]]; then
    echo "ok   help-$command"
  else
    fail "help-$command: differs from $command --help: $(head -n 3 "$tmp/help_command")"
  fi
  # Every option the usage lists is one the command parses: given without a
  # value it is never unknown (and no command starts: a value is missing).
  options="$(sed -n '/^options:$/,$p' "$tmp/help" | grep -o '^  --[a-z-]*' | sed 's/^  --//')"
  [[ $(wc -w <<<"$options") -ge 3 ]] || fail "$command-options: too few in the usage: $options"
  for option in $options; do
    timeout 10 "$bin" "$command" "--$option" >/dev/null 2>"$tmp/err" </dev/null
    if [[ $? -eq 0 ]] || grep -q "unknown option" "$tmp/err"; then
      fail "$command-options: --$option is in the usage but: $(cat "$tmp/err")"
    fi
  done
  echo "ok   $command-options-parse ($(wc -w <<<"$options") options)"
done
# The defaults shown are the ones used.
"$bin" simulate --help >"$tmp/help"
grep -q -- "--steps N .*(default 20)$" "$tmp/help" ||
  fail "simulate-defaults: no --steps default 20"
grep -q -- "--inter-node-gbps X .*(default 50)$" "$tmp/help" ||
  fail "simulate-defaults: no machine flag default"
"$bin" serve --help >"$tmp/help"
grep -q -- "--max-pending-steps N .*(default 1024)$" "$tmp/help" ||
  fail "serve-defaults: no --max-pending-steps default 1024"
# Help wins over a bad option next to it, and does not run the command.
expect help-beside-bad-option 0 "" -- "$bin" simulate --topologyy g1n8 --help
grep -q "^usage: knapformer simulate" "$tmp/out" || fail "help-beside-bad-option: no usage"
expect help-unknown-command 2 "knapformer help: unknown command 'frobnicate'" \
  -- "$bin" help frobnicate
expect help-train-sim 0 "" -- "$bin" help train-sim
grep -q "bash scripts/knapformer train-sim --help" "$tmp/out" || fail "help-train-sim: no pointer"

# An unknown option names the closest valid one, in every command.
want="knapformer simulate: --topologyy: unknown option (did you mean --topology?)"
expect suggest-simulate 2 "$want" \
  -- "$bin" simulate --topologyy g1n8
expect suggest-simulate-transposed 2 "--stpes: unknown option (did you mean --steps?)" \
  -- "$bin" simulate --stpes 2
expect suggest-plan 2 "knapformer plan: --rnak: unknown option (did you mean --rank?)" \
  -- "$bin" plan --input "$tmp/good.json" --rnak 1
expect suggest-plan-prefix 2 "--max-tokens: unknown option (did you mean --max-tokens-per-gpu?)" \
  -- "$bin" plan --max-tokens 9
want="knapformer calibrate: --exchange: unknown option (did you mean --exchanges?)"
expect suggest-calibrate 2 "$want" \
  -- "$bin" calibrate --exchange x.csv
expect suggest-calibrate-underscore 2 "--d_model: unknown option (did you mean --d-model?)" \
  -- "$bin" calibrate --input x.csv --d_model 64
expect suggest-serve 2 "knapformer serve: --max-job: unknown option (did you mean --max-jobs?)" \
  -- "$bin" serve --max-job 3
expect suggest-help 2 "--hlep: unknown option (did you mean --help?)" -- "$bin" serve --hlep
expect suggest-one-dash 2 "unexpected argument '-topology' (did you mean --topology?)" \
  -- "$bin" simulate -topology g1n8
want="--verbose: unknown option (known: --input, --d-model, --table, --exchanges; --help for the usage)"
expect suggest-none 2 "$want" \
  -- "$bin" calibrate --verbose
expect missing-value-before-option 2 "--topology: missing value" \
  -- "$bin" simulate --topology --steps 2

# --pretty: the same JSON, indented by 2 spaces; without it, one line.
"$bin" plan --input "$tmp/good.json" >"$tmp/compact.json" 2>"$tmp/err"
expect plan-pretty 0 "" -- "$bin" plan --input "$tmp/good.json" --pretty
cp "$tmp/out" "$tmp/pretty.json"
if python3 - "$tmp/compact.json" "$tmp/pretty.json" <<'PY'
import json, sys
compact, pretty = (open(p).read() for p in sys.argv[1:])
assert compact.count("\n") == 1 and compact.endswith("\n"), "the default is not one line"
assert json.loads(pretty) == json.loads(compact), "--pretty changed the plan"
lines = pretty.splitlines()
assert lines[0] == "{" and lines[-1] == "}", lines[:2]
assert lines[1].startswith('  "') and not lines[1].startswith('   '), lines[1]
assert any(line.startswith('    ') for line in lines), "nothing nested"
assert all((len(l) - len(l.lstrip(" "))) % 2 == 0 for l in lines), "indent not by 2"
PY
then
  echo "ok   plan-pretty-json"
else
  fail "plan-pretty-json"
fi
expect plan-pretty-rank 0 "" -- "$bin" plan --input "$tmp/good.json" --rank 3 --pretty
grep -q '^  "ulysses": {$' "$tmp/out" ||
  fail "plan-pretty-rank: no indented ulysses: $(head -c 300 "$tmp/out")"
expect plan-pretty-value 2 "--pretty: takes no value, got 'yes'" \
  -- "$bin" plan --input "$tmp/good.json" --pretty=yes
expect serve-bad-flag 2 "--max-pending-steps: '0' is not a whole number" -- "$bin" serve --max-pending-steps 0
expect serve-bad-retain 2 "--retain-freed-memory: must be on or off, got 'yes'" -- "$bin" serve --retain-freed-memory yes

expect simulate-ok 0 "" -- "$bin" simulate --data low-res --steps 2 --topology g1n32,g8n4
grep -q "^g8n4 " "$tmp/out" || { echo "FAIL simulate-ok: no g8n4 row"; failures=$((failures + 1)); }
expect simulate-bad-data 2 "--data: data code 'g1b1i256f1s9': s exceeds the limit of 1" -- "$bin" simulate --data g1b1i256f1s9
# A declared fleet: the plans by time beside the FLOP-balanced ones, every
# figure of time, and bad speeds named.
expect simulate-rank-speeds 0 "" -- "$bin" simulate --data low-res --steps 2 \
  --topology g1n32 --rank-speeds 3:0.5
python3 - "$tmp/out" <<'PY' || failures=$((failures + 1))
import re, sys
text = open(sys.argv[1]).read()
assert "rank speeds 0.5 x1, 1 x31: plans balance time" in text, text
row = re.search(r"^g1n32\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$", text, re.M)
assert row, text
aware, bound, flops, buys = map(float, row.groups())
assert bound <= aware < 1.01 * bound and flops > 1.5 and buys > 1.4, text
print("ok   simulate-rank-speeds figures")
PY
expect simulate-rank-speeds-rank 2 "--rank-speeds: rank 32 in '32:0.5' is outside [0, 32)" \
  -- "$bin" simulate --rank-speeds 32:0.5
expect simulate-rank-speeds-count 2 "--rank-speeds: 2 speeds for a world of 32 ranks" \
  -- "$bin" simulate --rank-speeds 1,0.5
expect simulate-bad-world 2 "--world: world: 30 must be a positive multiple" -- "$bin" simulate --world 30
expect simulate-bad-topology 2 "--topology g4n3: world_size: 32 is not a multiple of the group size 12" -- "$bin" simulate --topology g4n3
expect simulate-bad-steps 2 "--steps: 'x' is not a whole number" -- "$bin" simulate --steps x
# A user's own lengths: simulated and advised; a malformed line named by
# file, line and field; the batching flags required with it, refused without.
printf '# tokens[,mask]\n4096\n1300,causal\n700\n16000\n' >"$tmp/lengths.txt"
expect simulate-lengths 0 "" -- "$bin" simulate --lengths "$tmp/lengths.txt" \
  --samples-per-gpu 2 --world 8 --steps 3 --topology g1n8,g4n2,auto
grep -q "^advice: --topology " "$tmp/out" || fail "simulate-lengths: no advice line"
# The advice ends with the trainer's call: simulate's gamma; a machine only
# where a flag differs from the default one (what SequenceBalancer assumes).
grep -qE '; in the trainer: SequenceBalancer\("[^"]+", gamma=0\.49\)$' "$tmp/out" ||
  fail "simulate-lengths: the advice does not end with the trainer's call: $(tail -n 1 "$tmp/out")"
expect simulate-lengths-machine 0 "" -- "$bin" simulate --lengths "$tmp/lengths.txt" \
  --samples-per-gpu 2 --world 8 --steps 2 --topology g1n8,auto --tflops 10 --gpus-per-node 4 \
  --gamma 0.7
grep -qE '; in the trainer: SequenceBalancer\("[^"]+", gamma=0\.7, machine=\{"flops_per_second": 1e\+13, "gpus_per_node": 4\}\)$' \
  "$tmp/out" || fail "simulate-lengths-machine: the call lacks the machine: $(tail -n 1 "$tmp/out")"
grep -q "4 samples, 1 with masks; 2 samples per GPU" "$tmp/out" ||
  fail "simulate-lengths: no data line"
printf '4096\n12x\n' >"$tmp/bad-lengths.txt"
expect simulate-lengths-bad-line 2 \
  "--lengths: $tmp/bad-lengths.txt:2: tokens: '12x' is not a whole number" \
  -- "$bin" simulate --lengths "$tmp/bad-lengths.txt" --samples-per-gpu 1
printf '40,spans=10:c;20:f\n' >"$tmp/bad-lengths.txt"
expect simulate-lengths-bad-mask 2 \
  "--lengths: $tmp/bad-lengths.txt:1: mask.spans: lengths add up to 30, the sequence has 40" \
  -- "$bin" simulate --lengths "$tmp/bad-lengths.txt" --samples-per-gpu 1
expect simulate-lengths-no-batching 2 "--lengths: give --samples-per-gpu N or --tokens-per-gpu T" \
  -- "$bin" simulate --lengths "$tmp/lengths.txt"
expect simulate-batching-without-lengths 2 "--tokens-per-gpu: only with --lengths FILE" \
  -- "$bin" simulate --tokens-per-gpu 4096
expect simulate-lengths-and-data 2 "--data and --lengths: give one" \
  -- "$bin" simulate --lengths "$tmp/lengths.txt" --data low-res --samples-per-gpu 1
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
expect calibrate-bad-line 2 "--input: line 3: expected \"length,seconds[,mask]\", got \"512,soon\"" -- "$bin" calibrate --input "$tmp/bad_times.csv" --d-model 64
printf '512,0.001\n512,0.0011\n' >"$tmp/one_length.csv"
expect calibrate-one-length 2 "time at least two different lengths" -- "$bin" calibrate --input "$tmp/one_length.csv" --d-model 64
expect calibrate-no-d 2 "--d-model: required" -- "$bin" calibrate --input "$tmp/one_length.csv"

# calibrate --table: the measured cost model from the same times, which
# simulate plans by (and whose figures differ from the transformer's).
expect calibrate-table 0 "" -- "$bin" calibrate --input "$tmp/times.csv" --d-model 3072 --table "$tmp/table.json"
python3 - "$tmp/out" "$tmp/table.json" <<'PY' || { echo "FAIL calibrate-table-file"; failures=$((failures + 1)); }
import json, re, sys
text, table = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
assert re.search(r"^measured table +8 attention sizes written to .*table.json", text, re.M), text
assert table["cost_model"] == "measured" and table["d_model"] == 3072, table
pairs, work = table["measured_attention"]["pairs"], table["measured_attention"]["work"]
assert pairs == [float(l * l) for l in [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]], pairs
assert work == sorted(work) and work[0] >= 0, work
# The times follow gamma 0.49: the table is its attention term, within noise.
for p, w in zip(pairs, work):
    if p >= 8192 ** 2:  # shorter, the attention is within the noise of the linear term
        assert abs(w / (0.49 * 4 * p * 3072) - 1) < 0.25, (p, w)
PY
expect simulate-measured 0 "" -- "$bin" simulate --data mixed-res --steps 2 --topology g4n8 --cost-model measured --cost-table "$tmp/table.json"
grep -q "cost model measured, d_model 3072 (attention measured at 8 sizes)" "$tmp/out" ||
  { echo "FAIL simulate-measured-header: $(head -3 "$tmp/out")"; failures=$((failures + 1)); }
expect simulate-measured-no-table 2 "--cost-model measured: needs --cost-table FILE" -- "$bin" simulate --cost-model measured
expect simulate-table-not-measured 2 "--cost-table: only with --cost-model measured" -- "$bin" simulate --cost-table "$tmp/table.json"
expect simulate-table-d-model 2 "--d-model: 64, but --cost-table $tmp/table.json was measured at d_model 3072" -- "$bin" simulate --cost-model measured --cost-table "$tmp/table.json" --d-model 64
printf '{"cost_model": "measured", "d_model": 64, "measured_attention": {"pairs": [4, 1], "work": [1, 2]}}' >"$tmp/bad_table.json"
expect simulate-bad-table 2 "--cost-table: $tmp/bad_table.json: measured_attention.pairs[1]: 1 must be greater than pairs[0] (4)" -- "$bin" simulate --cost-model measured --cost-table "$tmp/bad_table.json"
expect plan-measured-no-table 2 "measured_attention: the measured cost model needs its table" -- "$bin" plan --input "$tmp/good.json" --cost-model measured

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
