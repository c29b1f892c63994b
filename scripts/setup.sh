#!/bin/bash
# Installs the Debian packages the project needs (Debian bookworm or trixie,
# as root). Idempotent: does nothing when all are present; `apt-get update`
# runs once, only when something is missing.
#   bash scripts/setup.sh                  # everything .ci/run needs (--profile all)
#   bash scripts/setup.sh --profile torch  # the build and the Python package, without
#       the tools of the fuzzers, TSan, promtool, the image and the Debian roots
#   bash scripts/setup.sh --profile cuda
#       torch, but Debian's CUDA torch, NCCL and CUDA headers (trixie's contrib
#       and non-free) on a machine without a GPU or network: everything builds
#       (the CUDA paths too) and runs on the CPU. cuDNN, which Debian's
#       nvidia-cudnn would download, is declined and replaced by a stand-in
#       that only links (scripts/cudnn_stub.sh). Not for GPU machines.
#   bash scripts/setup.sh --profile cli    # only what builds and runs the command
#       line (//tools:knapformer): Bazel, g++ and the libraries it links
#   bash scripts/setup.sh --profile train-sim  # cli, and LibTorch for //tools:train_sim
#   bash scripts/setup.sh --profile trainer    # a trainer's machine without the build's
#       libraries: torch, a compiler and pip's build tools only (the offline
#       recipe's proof in .ci/run brings the rest as carried packages)
#   bash scripts/setup.sh --profile P --print  # list P's packages; install nothing
# .ci/run's torch 2.x lane uses cuda inside a Debian trixie root
# (scripts/debian_root.sh), its offline recipe trainer in a bookworm one;
# scripts/knapformer uses cli and train-sim.
set -euo pipefail

profiles="all, torch, cuda, cli, train-sim or trainer"
profile=all
print=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --profile)
      [[ $# -ge 2 && -n "$2" ]] || { echo "setup: --profile needs one of $profiles" >&2; exit 2; }
      profile="$2"
      shift 2 ;;
    --print) print=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$1' (usage: setup.sh [--profile P] [--print]; P is" \
         "$profiles)" >&2
       exit 2 ;;
  esac
done
case "$profile" in
  all|torch|cuda|cli|train-sim|trainer) ;;
  *) echo "setup: unknown profile '$profile' ($profiles)" >&2; exit 2 ;;
esac

# The release decides a few names: clang's sanitizer runtime follows the
# release's default clang.
codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
case "$codename" in
  bookworm) clang_rt=libclang-rt-14-dev ;;
  *) clang_rt=libclang-rt-dev ;;  # trixie and later: the default clang's
esac

# The command line: what //tools:knapformer links (tools/BUILD.bazel's deps
# through third_party/BUILD.bazel) and Bazel to build it. The cli profile is
# only this, so that `bash scripts/knapformer simulate` pulls no test tools.
cli_packages=(
  bazel-bootstrap          # Bazel 4.2.3, offline build
  g++ default-jdk-headless # compiler; Bazel's JDK
  libabsl-dev              # absl::Status, strings
  nlohmann-json3-dev       # JSON for the CLI
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler  # serve
  prometheus-cpp-dev       # the planner service's /metrics
)
# LibTorch (CPU) with c10d + Gloo, as the torch of /usr/bin/python3 describes
# it: third_party/torch_configure.bzl asks that interpreter for torch's folders
# and refuses to configure without pybind11's and CPython's headers.
torch_packages=(
  libtorch-dev           # LibTorch (CPU) with c10d + Gloo: the client and its multi-process tests
  libgloo-dev            # gloo/ headers c10d's ProcessGroupGloo.hpp includes (not pulled in)
  python3-torch          # torch for /usr/bin/python3: the Python package and its tests
)

# The build, the C++ tests and the Python package: the profiles of CI.
packages=(
  bazel-bootstrap          # Bazel 4.2.3, offline build
  g++ python3 default-jdk-headless  # compiler; python3 checks CLI output in tests
  libabsl-dev              # absl::Status, strings
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev       # JSON for the CLI
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev       # the planner service's /metrics
  openssl                  # tests make throwaway TLS certificates
  python3-dev pybind11-dev # the knapformer Python extension (python/)
  python3-pytest           # the Python package's tests
  python3-venv             # the wheel's install test (a venv with --system-site-packages)
  python3-setuptools python3-wheel ninja-build  # pip install --no-build-isolation . (setup.py)
  python3-yaml             # the deploy checks read YAML (tests/deploy)
  python3-matplotlib       # knapformer.plot_plan and its test (an optional dependency of the package)
)
if [[ "$profile" == cuda ]]; then
  packages+=(
    libtorch-cuda-dev python3-torch-cuda  # Debian's CUDA build of torch (contrib)
    libgloo-cuda-dev       # gloo/ headers for c10d's ProcessGroupGloo.hpp, CUDA build
    libnccl-dev            # NCCL for the raw NCCL transport (non-free)
    nvidia-cuda-dev        # the CUDA runtime's headers and libcudart (non-free)
    prometheus             # promtool: metrics_test runs in the trixie lane (ASan)
  )
else
  packages+=("${torch_packages[@]}")
fi
if [[ "$profile" == all ]]; then
  packages+=(
    prometheus             # promtool checks the metrics page in tests
    clang "$clang_rt"      # libFuzzer with ASan + UBSan (tests/fuzz, --config=fuzz)
    cmake curl             # Debian's Abseil rebuilt for TSan (scripts/tsan_absl.sh)
    podman buildah runc mmdebstrap  # the planner image (deploy/docker/build.sh) and the
                                    # torch 2.x lanes' Debian roots (scripts/debian_root.sh)
    iproute2               # loopback in the offline root (scripts/debian_root.sh --offline)
  )
fi

# scripts/knapformer's profiles: the command line alone, none of the tests' tools.
case "$profile" in
  cli) packages=("${cli_packages[@]}") ;;
  train-sim) packages=("${cli_packages[@]}" "${torch_packages[@]}" pybind11-dev python3-dev) ;;
  # Debian's torch stands for the trainer's (its headers package pulls in
  # libprotobuf-dev; nothing else of the build's libraries is here).
  trainer) packages=(g++ python3-dev python3-venv python3-setuptools python3-wheel python3-pytest
                     python3-torch libtorch-dev pybind11-dev ninja-build) ;;
esac

# pkg-config names Abseil's libraries for the build (third_party/pkg_config.bzl);
# pkgconf where no pkg-config is installed (bookworm's pkg-config clashes with it).
# A trainer's machine brings its own with the carried packages.
if [[ "$profile" != trainer ]] && ! command -v pkg-config >/dev/null; then
  packages+=(pkgconf)
fi

# Node.js for the deploy type checks: the image's own if it has one (Debian's
# nodejs would clash with it), else Debian's.
if [[ "$profile" == all ]] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
  packages+=(nodejs npm)
fi
if [[ "$profile" == cuda && "$codename" == bookworm ]]; then
  echo "setup: --profile cuda needs Debian trixie or later (bookworm has no CUDA torch)" >&2
  exit 2
fi
if [[ $print -eq 1 ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  if [[ "$profile" == cuda ]]; then
    # Decline nvidia-cudnn's download (NVIDIA's license, and no network).
    echo "nvidia-cudnn nvidia-cudnn/question select I Decline" | debconf-set-selections
  fi
  apt-get update -qq
  log="$(mktemp)"
  if ! apt-get install -y -qq "${missing[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "setup: apt-get install failed (its last lines are above)" >&2
    exit 1
  fi
  rm -f "$log"
fi
if [[ "$profile" == cuda ]]; then
  bash "$(dirname "${BASH_SOURCE[0]}")/cudnn_stub.sh"
fi

[[ "$profile" == all ]] || exit 0

# kubectl (for `kubectl kustomize`) is not a Debian package; the CI
# machine's image provides it. Without it only tests/deploy's manifest
# checks fail (naming it), so this is a warning, not a stop.
if ! command -v kubectl >/dev/null; then
  echo "setup: warning: kubectl is missing; tests/deploy renders the manifests with" \
    "kubectl kustomize and fails without it" >&2
fi

# The pinned npm packages of the deploy type checks (package-lock.json),
# installed again only when the lock file changes.
checks="$(cd "$(dirname "${BASH_SOURCE[0]}")/../deploy/checks" && pwd)"
stamp="$checks/node_modules/.package-lock.sha256"
want="$(sha256sum "$checks/package-lock.json" | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
  echo "setup: npm ci in deploy/checks" >&2
  (cd "$checks" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  echo "$want" >"$stamp"
fi
