#!/bin/bash
# Builds the knapformer Python wheel (optimized) and prints its path:
#   bash scripts/build_wheel.sh            # -> dist/knapformer-0.1.0-cp311-cp311-linux_x86_64.whl
#   bash scripts/build_wheel.sh --venv DIR # also installs it into a new venv at DIR that sees
#                                          # Debian's torch (--system-site-packages)
# The wheel holds the package and its extension, built against Debian's
# python3-torch (libtorch 1.13) for /usr/bin/python3 (3.11).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv=""
if [[ "${1:-}" == "--venv" ]]; then
  [[ -n "${2:-}" ]] || { echo "build_wheel: --venv needs a directory" >&2; exit 2; }
  venv="$2"
elif [[ $# -gt 0 ]]; then
  echo "build_wheel: unknown argument '$1' (usage: build_wheel.sh [--venv DIR])" >&2
  exit 2
fi
bash "$root/scripts/setup.sh"
cd "$root"
bazel build -c opt --noshow_progress //python:wheel >&2
wheel="knapformer-0.1.0-cp311-cp311-linux_x86_64.whl"
mkdir -p dist
install -m 0644 "bazel-bin/python/$wheel" "dist/$wheel"
if [[ -n "$venv" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv" >&2
  "$venv/bin/pip" install --quiet --no-index --no-deps --force-reinstall "dist/$wheel" >&2
  echo "installed into $venv: $venv/bin/python3 -c 'import knapformer'" >&2
fi
echo "$root/dist/$wheel"
