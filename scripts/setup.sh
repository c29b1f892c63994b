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
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "setup: missing packages (${missing[*]}); run as root or install them" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
