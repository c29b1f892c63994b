#!/bin/bash
# One command on a GPU machine: install knapformer from this checkout with
# pip against the interpreter's own torch, then run its GPU check
# (python -m knapformer.gpu_check; under torchrun with one rank per GPU
# when there are several). docs/development.md has the whole recipe.
#   bash scripts/gpu_check.sh [--python PY] [--venv DIR] [--packages DIR [--prefix DIR]]
#                             [--no-install] [-- GPU_CHECK_ARGS...]
#     --python    the interpreter with the trainer's CUDA torch (default: python3 on PATH)
#     --venv      install into a new venv at DIR made with --system-site-packages
#                 (default: into PY's own environment, as `pip install` would)
#     --packages  Debian packages carried here (scripts/carry_packages.sh download):
#                 unpacked into --prefix (default ~/.cache/knapformer/deps), used
#                 for the build, and kept there (the extension loads them from there)
#     --no-install  run the check on what is installed
# Anything after -- goes to knapformer.gpu_check (e.g. --json FILE, --dry-run).
# Exits with the check's status (0: nothing failed), or 2 for a usage error
# and 4 when the install fails.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="$(command -v python3 || true)" venv="" packages="" prefix="$HOME/.cache/knapformer/deps"
install=1
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "gpu_check: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python|--venv|--packages|--prefix)
      [[ -n "${2:-}" ]] || die "$1 needs a value"
      case "$1" in
        --python) python="$2" ;; --venv) venv="$2" ;;
        --packages) packages="$2" ;; --prefix) prefix="$2" ;;
      esac
      shift 2 ;;
    --no-install) install=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done
[[ -n "$python" && -x "$(command -v "$python")" ]] || die "no interpreter '$python' (--python)"
python="$(command -v "$python")"

if [[ -n "$venv" ]]; then
  if [[ ! -x "$venv/bin/python" ]]; then
    "$python" -m venv --system-site-packages "$venv" || { echo "gpu_check: no venv" >&2; exit 4; }
  fi
  python="$venv/bin/python"
fi
if [[ $install -eq 1 ]]; then
  if [[ -n "$packages" ]]; then
    bash "$root/scripts/carry_packages.sh" unpack "$packages" "$prefix" || exit 4
    # shellcheck disable=SC1091  # written by carry_packages.sh
    . "$prefix/env.sh"
  fi
  started=$SECONDS
  if ! (cd "$root" && "$python" -m pip install --no-build-isolation --no-deps --no-index \
      --disable-pip-version-check --force-reinstall .); then
    echo "gpu_check: pip install --no-build-isolation . failed (the reason is above)" >&2
    exit 4
  fi
  echo "gpu_check: installed in $((SECONDS - started)) s"
fi

# The caller's folder stays the working one (the report lands there); no
# folder of the checkout holds a package named knapformer at its top.
gpus="$("$python" -c 'import torch
print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)"
if [[ "$gpus" -ge 2 ]]; then
  exec "$python" -m torch.distributed.run --nproc_per_node "$gpus" --redirects 1 --tee 1 \
    -m knapformer.gpu_check "$@"
fi
exec "$python" -m knapformer.gpu_check "$@"
