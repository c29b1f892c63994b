#!/bin/bash
# Runs a command inside a root file system of another Debian release, over a
# copy of this checkout at /src; .ci/run's trixie lane and offline recipe use it.
#   bash scripts/debian_root.sh --release trixie --profile cuda [--out DIR] [--offline] \
#     -- COMMAND...
#   bash scripts/debian_root.sh --release trixie --profile cuda --prepare
#     (makes the root if it is not cached, runs nothing: CI makes its roots
#     in the background while the host compiles)
#
# The root is made offline from the Debian mirror (mmdebstrap, minbase, as
# deploy/docker/build.sh makes its base, keeping man pages: OpenJDK's
# postinst needs their folders), then `bash scripts/setup.sh
# --profile PROFILE` installs that profile's packages in it. dpkg does not
# fsync (force-unsafe-io: a root is remade, never repaired) and Python
# modules are not byte-compiled at install (a stand-in py3compile while
# setup.sh runs; Python compiles what it imports): about a third of the
# time to make one. It is cached in
# $KNAPFORMER_ROOT_CACHE (default ~/.cache/knapformer/roots) under a name
# that hashes the mmdebstrap arguments, scripts/setup.sh, the script it runs
# (cudnn_stub.sh) and the stand-ins this script puts in the root: a change of
# any (a package list) makes a new root and
# removes the release and profile's older ones; a root older than 7 days is
# made again (Debian's updates). Bazel's cache lives in the root (/root/.cache/bazel), so a
# second run rebuilds only what changed.
#
# COMMAND runs as root in /src with a clean environment, in a private mount
# namespace (unshare) with /proc, /sys, /dev and a tmpfs /dev/shm mounted,
# on the host's network, or, with --offline, in a network namespace of its
# own with only loopback up (nothing outside the machine answers: the
# offline recipe's proof). --out DIR is bind-mounted at /out (results for the
# host). Needs root, mmdebstrap and unshare/chroot (util-linux, coreutils).
# Exits with COMMAND's status, or 2 for a usage error, 3 if the root cannot
# be made.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
release="" profile="" out="" offline=0 prepare=0
usage() { sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --release|--profile|--out)
      [[ $# -ge 2 && -n "$2" ]] || { echo "debian_root: $1 needs a value" >&2; exit 2; }
      case "$1" in --release) release="$2" ;; --profile) profile="$2" ;; --out) out="$2" ;; esac
      shift 2 ;;
    --offline) offline=1; shift ;;
    --prepare) prepare=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "debian_root: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$release" ]] || { echo "debian_root: --release is required (e.g. trixie)" >&2; exit 2; }
[[ -n "$profile" ]] ||
  { echo "debian_root: --profile is required (see scripts/setup.sh)" >&2; exit 2; }
[[ $# -gt 0 || $prepare -eq 1 ]] || { echo "debian_root: no command after --" >&2; exit 2; }
if [[ $(id -u) -ne 0 ]]; then
  echo "debian_root: run as root (mmdebstrap, chroot and mounts need it)" >&2
  exit 2
fi
tools=(mmdebstrap unshare chroot git)
[[ $offline -eq 0 ]] || tools+=(ip)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null ||
    { echo "debian_root: '$tool' is missing (bash scripts/setup.sh installs it)" >&2; exit 2; }
done
if [[ -n "$out" ]]; then
  mkdir -p "$out" && out="$(cd "$out" && pwd)" ||
    { echo "debian_root: cannot make --out $out" >&2; exit 2; }
fi

cache="${KNAPFORMER_ROOT_CACHE:-$HOME/.cache/knapformer/roots}"
mmdebstrap_args=(--quiet --variant=minbase
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --components=main,contrib,non-free
  --aptopt='Acquire::Languages "none"'
  --aptopt='APT::Install-Recommends "false"'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='force-unsafe-io'
  --include=ca-certificates
  "$release")
# Stand-ins put in the root while it is made: Debian's py3compile (removed
# after setup.sh) and a policy-rc.d that keeps every service a package
# installs (prometheus) from starting, in the root for good.
py3compile_stub=$'#!/bin/sh\n# debian_root.sh: no byte-compiling while the root is made\nexit 0\n'
policy_rc_stub=$'#!/bin/sh\n# debian_root.sh: a root never starts services\nexit 101\n'
key="$( { printf '%s\n' "${mmdebstrap_args[@]}" "$profile" "$py3compile_stub" "$policy_rc_stub"
  cat "$repo/scripts/setup.sh" "$repo/scripts/cudnn_stub.sh"; } | sha256sum | cut -c1-12)"
root="$cache/$release-$profile-$key"

# Runs "$@" inside the root at $1 with the mounts it needs; the namespace
# (and so every mount) ends with the command. With offline=1 (only for the
# command, never while the root is made), no network but loopback.
in_root() {
  local dir="$1" net=() lo=""
  shift
  if [[ "${in_root_offline:-0}" -eq 1 ]]; then
    net=(--net)
    lo="ip link set lo up;"
  fi
  cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null
  local command
  command="$(printf '%q ' "$@")"
  local binds=""
  if [[ -n "$out" ]]; then
    mkdir -p "$dir/out"
    binds="mount --bind $(printf '%q' "$out") $(printf '%q' "$dir/out");"
  fi
  unshare --mount "${net[@]}" --propagation private -- bash -c "
    set -e
    $lo
    mount -t proc proc $(printf '%q' "$dir/proc")
    mount --rbind /sys $(printf '%q' "$dir/sys")
    mount --rbind /dev $(printf '%q' "$dir/dev")
    mount -t tmpfs -o size=4g tmpfs $(printf '%q' "$dir/dev/shm")
    $binds
    exec chroot $(printf '%q' "$dir") /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
      NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      bash -c 'cd /src && exec \"\$@\"' bash $command"
}

# This checkout's files (tracked and untracked, not ignored, as they are in
# the working tree) replace /src's; Bazel's convenience links stay.
copy_checkout() {
  local dir="$1"
  mkdir -p "$dir/src"
  find "$dir/src" -mindepth 1 -maxdepth 1 ! -name 'bazel-*' -exec rm -rf {} +
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    xargs -0 -r sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
    tar --null -T - -cf -) | tar -xf - -C "$dir/src"
}

if [[ -d "$root" && -n "$(find "$root" -maxdepth 0 -mtime +7)" ]]; then
  echo "debian_root: $root is older than a week; making it again" >&2
  rm -rf "$root"
fi
if [[ -d "$root" ]]; then
  copy_checkout "$root"
else
  partial="$cache/incomplete-$release-$profile-$key"
  rm -rf "$partial"
  mkdir -p "$cache"
  started=$SECONDS
  echo "debian_root: making the Debian $release root for '$profile' (mmdebstrap + setup.sh)" >&2
  if ! timeout 900 mmdebstrap "${mmdebstrap_args[@]}" "$partial" >&2; then
    rm -rf "$partial"
    echo "debian_root: mmdebstrap could not make the $release root" >&2
    exit 3
  fi
  copy_checkout "$partial"
  # The root trusts what the host trusts beyond Debian's CAs (a proxy's CA
  # in /usr/local/share/ca-certificates), for setup's downloads (npm).
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$partial/usr/local/share/ca-certificates/"
    in_root "$partial" update-ca-certificates >/dev/null 2>&1
  fi
  # Maintainer scripts find py3compile on PATH; /usr/local/bin comes first.
  printf '%s' "$py3compile_stub" >"$partial/usr/local/bin/py3compile"
  printf '%s' "$policy_rc_stub" >"$partial/usr/sbin/policy-rc.d"
  chmod 755 "$partial/usr/local/bin/py3compile" "$partial/usr/sbin/policy-rc.d"
  if ! in_root "$partial" bash scripts/setup.sh --profile "$profile" >&2 ||
     ! in_root "$partial" apt-get clean >&2; then
    echo "debian_root: scripts/setup.sh --profile $profile failed in the $release root" \
      "(left in $partial for a look; the next run removes it)" >&2
    exit 3
  fi
  rm -f "$partial/usr/local/bin/py3compile"
  # Older roots of this release and profile (other package lists).
  find "$cache" -mindepth 1 -maxdepth 1 -name "$release-$profile-*" ! -name "$(basename "$root")" \
    -exec rm -rf {} +
  mv "$partial" "$root"
  echo "debian_root: made $root in $((SECONDS - started)) s" \
    "($(du -sh "$root" 2>/dev/null | cut -f1))" >&2
fi
[[ $prepare -eq 0 ]] || exit 0
in_root_offline=$offline in_root "$root" "$@"
