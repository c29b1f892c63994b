#!/bin/bash
# Builds the planner image (deploy/docker/Dockerfile) with podman, offline if
# need be, and smoke-tests it the way deploy/k8s runs it:
#   - starts `knapformer serve` from the image as UID 65532 with a read-only
#     root filesystem and no capabilities, on 127.0.0.1 (host network);
#   - from the host: gRPC health SERVING, one PlanGroup, GET /metrics
#     (tests/deploy/image_probe);
#   - SIGTERM: the server must exit 0;
#   - the image holds no compiler, no Bazel and no package lists;
#   - a deliberately broken copy (a shared library the binary loads removed)
#     must fail the smoke test, naming that library;
# and prints the image's size and package list.
#
# usage: deploy/docker/build.sh [--base IMAGE] [--tag NAME] [--save FILE]
#            [--keep DIR] [--probe PATH] [--junit FILE]
#   --base IMAGE  base of both stages, pulled from a registry (e.g.
#                 docker.io/library/debian:bookworm). Default: a Debian
#                 bookworm base made here from Debian's packages (mmdebstrap,
#                 no registry needed), its root file system cached in
#                 $KNAPFORMER_IMAGE_CACHE (default ~/.cache/knapformer).
#   --tag NAME    the image's name (default: the one deploy/k8s runs).
#   --save FILE   also write the image as a docker-archive (docker load,
#                 kind load image-archive, ctr import).
#   --keep DIR    keep podman's storage in DIR (else a temporary folder,
#                 removed at the end); use the image afterwards with
#                 podman --root DIR/storage --runroot DIR/run ...
#   --probe PATH  tests/deploy/image_probe, already built (default: built here
#                 with Bazel).
#   --junit FILE  write each check as a JUnit test case (CI counts them).
# Needs root, podman, buildah's chroot isolation, runc and mmdebstrap
# (scripts/setup.sh installs them). Exits non-zero if any check fails.
set -uo pipefail

readonly IMAGE_DEFAULT="knapformer/planner:0.1.0"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
base="" image="$IMAGE_DEFAULT" save="" keep="" probe="" junit=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base|--tag|--save|--keep|--probe|--junit)
      [[ $# -ge 2 && -n "$2" ]] || { echo "build.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --base) base="$2" ;; --tag) image="$2" ;; --save) save="$2" ;;
        --keep) keep="$2" ;; --probe) probe="$2" ;; --junit) junit="$2" ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ $(id -u) -ne 0 ]]; then
  echo "build.sh: run as root (podman's rootful storage and runc; see --help)" >&2
  exit 2
fi
tools=(podman runc python3)
[[ -z "$base" ]] && tools+=(mmdebstrap)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || {
    echo "build.sh: '$tool' is missing (apt-get install podman buildah runc mmdebstrap)" >&2
    exit 2
  }
done

# --- podman, confined to this run's own storage ------------------------------
if [[ -n "$keep" ]]; then
  work="$(mkdir -p "$keep" && cd "$keep" && pwd)"
else
  work="$(mktemp -d "${TMPDIR:-/tmp}/knapformer-image.XXXXXX")"
fi
# runc, not crun (crun fails on this kind of host's hybrid cgroups); ulimits
# within the caller's hard limit (podman's default asks for more).
capped_limit() { [[ "$1" == unlimited || "$1" -gt "$2" ]] && echo "$2" || echo "$1"; }
nofile="$(capped_limit "$(ulimit -Hn)" 65536)"
nproc="$(capped_limit "$(ulimit -Hu)" 32768)"
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$work/containers.conf" BUILDAH_ISOLATION=chroot
pm() {
  podman --root "$work/storage" --runroot "$work/run" --storage-driver overlay "$@"
}

# Containers this run starts are named "$container_prefix-N": the only ones
# it stops (the storage is its own, but a kept one may be reused).
container_prefix="knapformer-smoke-$$"
cleanup() {
  pm ps -a --quiet --filter "name=^$container_prefix-" 2>/dev/null |
    xargs -r podman --root "$work/storage" --runroot "$work/run" --storage-driver overlay \
      rm -f -t 0 >/dev/null 2>&1
  if [[ -z "$keep" ]]; then
    # Not `podman system reset`: as root it also deletes the host's podman
    # networks. Removing the images unmounts their layers.
    pm rm -a -f -t 0 >/dev/null 2>&1
    pm rmi -a -f >/dev/null 2>&1
    rm -rf "$work" 2>/dev/null || echo "build.sh: could not remove $work" >&2
  fi
}
trap cleanup EXIT

# --- checks, recorded for the summary and JUnit -------------------------------
results="$work/results.tsv"
: >"$results"
failures=0
pass() { printf '%s\tpass\t\n' "$1" >>"$results"; echo "PASS $1${2:+: $2}"; }
fail() {
  printf '%s\tfail\t%s\n' "$1" "$(printf '%s' "$2" | tr '\t\n' '  ')" >>"$results"
  echo "FAIL $1: $2" >&2
  failures=$((failures + 1))
}
write_junit() {
  [[ -n "$junit" ]] || return 0
  mkdir -p "$(dirname "$junit")"
  python3 "$repo/tests/testing/checks_to_junit.py" "$results" "$junit" planner_image \
    deploy.docker.build_sh
}
finish() {
  write_junit
  echo "image checks: $(grep -c $'\tpass\t' "$results") passed, $failures failed"
  exit $((failures > 0))
}

# --- the probe (host side of the smoke test) ---------------------------------
if [[ -z "$probe" ]]; then
  (cd "$repo" && bazel build --noshow_progress //tests/deploy:image_probe) ||
    { fail "probe builds" "bazel build //tests/deploy:image_probe failed"; finish; }
  probe="$repo/bazel-bin/tests/deploy/image_probe"
fi
[[ -x "$probe" ]] || { fail "probe builds" "'$probe' is not an executable"; finish; }

# --- base ---------------------------------------------------------------------
if [[ -z "$base" ]]; then
  base="localhost/knapformer-base:bookworm"
  cache="${KNAPFORMER_IMAGE_CACHE:-$HOME/.cache/knapformer}"
  # minbase; merged /usr as Debian's own images have it, without usrmerge
  # (which would pull in Perl); no documentation, man pages or translations,
  # in the base or in anything installed on it later (as bookworm-slim),
  # copyrights kept.
  mmdebstrap_args=(--quiet --variant=minbase
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
    --aptopt='Acquire::Languages "none"'
    --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/doc/*'
    --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/locale/*'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    bookworm)
  # The cached file is named for the arguments that made it.
  key="$(printf '%s\n' "${mmdebstrap_args[@]}" | sha256sum | cut -c1-12)"
  rootfs="$cache/debian-bookworm-minbase-$key.tar"
  partial="$cache/incomplete-debian-bookworm-minbase-$key.tar"  # mmdebstrap reads .tar
  mkdir -p "$cache"
  # Made again after a week, so that the base carries Debian's updates.
  if [[ ! -s "$rootfs" || -n "$(find "$rootfs" -mtime +7)" ]]; then
    echo "making the Debian bookworm base (mmdebstrap, about a minute)"
    if ! timeout 900 mmdebstrap "${mmdebstrap_args[@]}" "$partial"; then
      rm -f "$partial"
      fail "base image" "mmdebstrap could not make the Debian bookworm base"
      finish
    fi
    mv "$partial" "$rootfs"
  fi
  if pm import --quiet "$rootfs" "$base" >/dev/null; then
    pass "base image" "$base from $rootfs"
  else
    fail "base image" "podman import of $rootfs failed"
    finish
  fi
  pull=never
else
  pull=missing
fi

# --- build --------------------------------------------------------------------
build_started=$SECONDS
if (cd "$repo" && timeout 3600 podman --root "$work/storage" --runroot "$work/run" \
      --storage-driver overlay build --pull="$pull" \
      --build-arg BUILD_BASE="$base" --build-arg RUNTIME_BASE="$base" \
      -f deploy/docker/Dockerfile -t "$image" .); then
  pass "image builds" "$image in $((SECONDS - build_started)) s"
else
  fail "image builds" "podman build of deploy/docker/Dockerfile failed (its output is above)"
  finish
fi

# shellcheck source=deploy/docker/smoke.sh
source "$repo/deploy/docker/smoke.sh"

# The smoke test proper; any failure is recorded with what went wrong.
if message="$(smoke_test "$image" "$probe" 2>&1)"; then
  pass "smoke test" "served health, PlanGroup and /metrics as UID 65532, read-only; SIGTERM -> exit 0"
  printf '%s\n' "$message" | sed 's/^/  /'
else
  fail "smoke test" "$message"
fi
if message="$(image_contents_check "$image" 2>&1)"; then
  pass "no compiler, Bazel or package lists in the image"
else
  fail "no compiler, Bazel or package lists in the image" "$message"
fi

size="$(pm image inspect --format '{{.Size}}' "$image" 2>/dev/null)"
size="${size:-0}"
echo "image $image: $((size / 1000000)) MB ($size bytes)"
echo "packages in the image:"
pm run --rm --entrypoint dpkg-query "$image" -W -f '  ${Package} ${Version}\n'

# Each check must be able to fail: a broken copy must fail the smoke test,
# naming the library it lacks, and the build stage (which has a compiler and
# Bazel) must fail the contents check, naming them.
broken_image_check "$image" "$probe"
build_stage_check "$repo" "$base" "$pull"

if [[ -n "$save" ]]; then
  if pm save --quiet --format docker-archive -o "$save" "$image"; then
    pass "image saved" "$save ($(du -h "$save" | cut -f1))"
  else
    fail "image saved" "podman save to '$save' failed"
  fi
fi
finish
