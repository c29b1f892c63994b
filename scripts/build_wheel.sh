#!/bin/bash
# Builds the knapformer Python wheel (optimized) against the torch of one
# interpreter and prints its path:
#   bash scripts/build_wheel.sh                      # for /usr/bin/python3 (Debian's torch)
#   bash scripts/build_wheel.sh --venv DIR           # also installs it into a new venv at DIR
#                                                    # that sees that interpreter's torch
#                                                    # (--system-site-packages)
#   bash scripts/build_wheel.sh --python PATH [...]  # for another interpreter with torch
# The wheel is named for the interpreter (dist/knapformer-0.1.0-cp311-... on
# bookworm, cp313 on trixie). The build reads torch's folders, ABI and
# pybind11 from the interpreter (third_party/torch_configure.bzl) and
# refuses, naming the cause, a torch it cannot work with.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="" python="/usr/bin/python3"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv|--python)
      [[ -n "${2:-}" ]] || { echo "build_wheel: $1 needs a value" >&2; exit 2; }
      if [[ "$1" == --venv ]]; then venv="$2"; else python="$2"; fi
      shift 2 ;;
    *) echo "build_wheel: unknown argument '$1'" \
         "(usage: build_wheel.sh [--python PATH] [--venv DIR])" >&2
       exit 2 ;;
  esac
done
if [[ "$python" != /* ]]; then
  found="$(command -v "$python")" ||
    { echo "build_wheel: --python $python: not found" >&2; exit 2; }
  python="$found"
fi
[[ -x "$python" ]] || { echo "build_wheel: --python $python is not an executable" >&2; exit 2; }
# Debian's packages serve Debian's interpreter; another one brings its own torch.
if [[ "$python" == /usr/bin/python3* ]]; then
  bash "$root/scripts/setup.sh" --profile torch
fi
cd "$root"
flags=(-c opt --noshow_progress --repo_env=KNAPFORMER_PYTHON="$python")
bazel build "${flags[@]}" //:wheel >&2
# The wheel's name carries the interpreter's tag: ask Bazel which it made.
files='" ".join([f.path for f in target.files.to_list()])'
wheel="$(bazel cquery "${flags[@]}" --output=starlark --starlark:expr="$files" //:wheel \
  2>/dev/null)" || true
[[ -f "$wheel" ]] || { echo "build_wheel: bazel made no wheel (cquery said '$wheel')" >&2; exit 1; }
mkdir -p dist
install -m 0644 "$wheel" "dist/$(basename "$wheel")"
wheel="$root/dist/$(basename "$wheel")"
if [[ -n "$venv" ]]; then
  "$python" -m venv --system-site-packages "$venv" >&2
  "$venv/bin/pip" install --quiet --no-index --no-deps --force-reinstall "$wheel" >&2
  echo "installed into $venv: $venv/bin/python3 -c 'import knapformer'" >&2
fi
echo "$wheel"
