#!/bin/bash
# bench/exchange_times.py on 4 Gloo processes as 2 nodes of 2 (torchrun),
# then `knapformer calibrate --exchanges` on what it wrote: a row per bag
# size and buffer size with the right link, and a fit of both links that
# names the machine fields. Data the fit cannot use is exit 2 naming why.
#   exchange_calibration_test.sh PYTHON EXCHANGE_TIMES_PY KNAPFORMER
set -u
python="$1"
script="$(realpath "$2")"
bin="$(realpath "$3")"
runfiles="${TEST_SRCDIR}/${TEST_WORKSPACE}"
export PYTHONPATH="$runfiles/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# shellcheck source=tests/testing/launcher.sh
source "$runfiles/tests/testing/launcher.sh"
choose_launcher "$python" 4
cd "$tmp"
if ! timeout 300 "$python" "${launcher[@]}" "$script" --gpus-per-node 2 \
    --sizes 65536,16777216 --repeats 3 --warmup 1 --out "$tmp/exchanges.csv" >"$tmp/run.log" 2>&1; then
  fail "exchange_times.py: $(cat "$tmp/run.log")"
fi
cat "$tmp/exchanges.csv"
"$python" - "$tmp/exchanges.csv" <<'PY' || failures=$((failures + 1))
import sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[0] == "gpus,bytes_per_gpu,seconds,link", lines
rows = [line.split(",") for line in lines[1:] if line]
# Bags of 2 stay in a node of 2; bags of 4 span both nodes.
assert [(r[0], r[1], r[3]) for r in rows] == [
    ("2", "65536", "intra"), ("2", "16777216", "intra"),
    ("4", "65536", "inter"), ("4", "16777216", "inter")], rows
assert all(float(r[2]) > 0 for r in rows), rows
print("ok   exchange rows")
PY

if ! "$bin" calibrate --exchanges "$tmp/exchanges.csv" >"$tmp/fit" 2>"$tmp/err"; then
  fail "calibrate --exchanges: $(cat "$tmp/err")"
fi
cat "$tmp/fit"
"$python" - "$tmp/fit" <<'PY' || failures=$((failures + 1))
import json, re, sys
text = open(sys.argv[1]).read()
for link in ("intra-node", "inter-node"):
    assert re.search(rf"^{link} +[\d.e+]+ bytes/s \([\d.e+]+ GB/s\), latency -?[\d.e+-]+ us "
                     r"\(not priced\), 2 samples, r\^2 ", text, re.M), text
machine = json.loads(re.search(r"^machine +(\{.*\})$", text, re.M).group(1))
assert set(machine) == {"intra_node_bytes_per_second", "inter_node_bytes_per_second"}, machine
# Loopback Gloo on this machine: well above 1 MB/s, below 1 TB/s.
assert all(1e6 < v < 1e12 for v in machine.values()), machine
flags = re.search(r"^flags +(.*)$", text, re.M).group(1)
assert re.fullmatch(r"--intra-node-gbps [\d.e+-]+ --inter-node-gbps [\d.e+-]+", flags), flags
print("ok   calibrate --exchanges")
PY

printf 'gpus,bytes_per_gpu,seconds,link\n2,1000000,0.001,intra\n2,1000000,0.0012,intra\n' \
  | "$bin" calibrate --exchanges - >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--exchanges: intra-node: every sample sends the same bytes" "$tmp/err"; then
  fail "one buffer size: exit $code, $(cat "$tmp/err")"
fi
printf '2,1000000,0.001,intra\n2,1000000,0.001,nvlink\n' | "$bin" calibrate --exchanges - \
  >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- '--exchanges: line 2: expected "gpus,bytes_per_gpu,seconds,intra|inter"' "$tmp/err"; then
  fail "an unknown link: exit $code, $(cat "$tmp/err")"
fi
printf 'gpus,bytes,seconds,link\n' | "$bin" calibrate --exchanges - >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- '--exchanges: no rows' "$tmp/err"; then
  fail "a header alone: exit $code, $(cat "$tmp/err")"
fi
"$bin" calibrate --exchanges - --d-model 64 </dev/null >"$tmp/out" 2>"$tmp/err"
code=$?
if [[ $code -ne 2 ]] || ! grep -qF -- "--exchanges: fits the links alone" "$tmp/err"; then
  fail "--exchanges with --d-model: exit $code, $(cat "$tmp/err")"
fi

echo "$failures failures"
[[ $failures -eq 0 ]]
