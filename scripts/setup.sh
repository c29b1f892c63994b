#!/bin/bash
# Installs every Debian package the project needs (Debian bookworm, as root).
# Idempotent: does nothing when all are present; `apt-get update` runs once,
# only when something is missing.
set -euo pipefail

packages=(
  bazel-bootstrap          # Bazel 4.2.3, offline build
  g++ python3 default-jdk-headless  # compiler; python3 checks CLI output in tests
  libabsl-dev              # absl::Status, strings
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev       # JSON for the CLI
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev       # the planner service's /metrics
  prometheus               # promtool checks the metrics page in tests
  openssl                  # tests make throwaway TLS certificates
  libtorch-dev             # LibTorch (CPU) with c10d + Gloo: the client and its multi-process tests
  libgloo-dev              # gloo/ headers that c10d's ProcessGroupGloo.hpp includes (libtorch-dev does not pull them in)
  python3-yaml             # the deploy checks read YAML (tests/deploy)
  python3-dev pybind11-dev # the knapformer Python extension (python/)
  python3-torch            # torch for /usr/bin/python3: the Python package and its tests
  python3-pytest           # the Python package's tests
  python3-venv             # the wheel's install test (a venv with --system-site-packages)
  clang libclang-rt-14-dev # libFuzzer with ASan + UBSan (tests/fuzz, --config=fuzz)
  cmake curl               # Debian's Abseil rebuilt for TSan (scripts/tsan_absl.sh)
  podman buildah runc mmdebstrap  # the planner image, built offline and smoke-tested (deploy/docker/build.sh)
)

# Node.js for the deploy type checks: the image's own if it has one (Debian's
# nodejs would clash with it), else Debian's.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
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
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# kubectl (for `kubectl kustomize`) is not a Debian package; the machine
# image provides it.
if ! command -v kubectl >/dev/null; then
  echo "setup: kubectl is missing (tests/deploy renders the manifests with kubectl kustomize)" >&2
  exit 1
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
