#!/bin/bash
# The Debian packages `pip install --no-build-isolation .` needs besides
# torch and a compiler (gRPC, protobuf, Abseil, prometheus-cpp, nlohmann-json,
# protoc, grpc_cpp_plugin, pkgconf and what they depend on), carried to a
# machine without network (a GPU machine) and unpacked there into a folder
# with dpkg -x, as root or not (docs/development.md):
#   bash scripts/carry_packages.sh download DIR [--release R]
#       where a Debian mirror is reachable: the .debs into DIR, with
#       DIR/packages.txt naming them. R: bookworm (default: glibc >= 2.36 on the
#       target) or trixie (glibc >= 2.41).
#   bash scripts/carry_packages.sh unpack DIR PREFIX
#       on the target: every .deb of DIR unpacked into PREFIX, and
#       PREFIX/env.sh, which points pkg-config (PKG_CONFIG_LIBDIR,
#       PKG_CONFIG_SYSROOT_DIR) and PATH (protoc, grpc_cpp_plugin) at it.
# Then: . PREFIX/env.sh && python3 -m pip install --no-build-isolation .
# The extension finds the libraries in PREFIX at run time by its rpath: keep
# PREFIX where it was when it was built. scripts/gpu_check.sh does all of it.
# The C library, the C++ runtime and the compiler's own packages are not
# carried: the target has them (it compiles C++ against its torch).
set -euo pipefail

packages=(libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev nlohmann-json3-dev pkgconf)
# What a machine with a C++ compiler already has; carrying its own copies
# would put a second C library beside the system's.
not_carried='^(libc6|libc6-dev|libc-bin|libc-dev-bin|linux-libc-dev|libcrypt1|libcrypt-dev|'
not_carried+='libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|rpcsvc-proto|libtirpc.*|libnsl.*)$'
mirror="${KNAPFORMER_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "carry_packages: $*" >&2; exit 2; }

download() {
  local dir="$1" release="$2"
  command -v apt-get >/dev/null || die "download needs apt-get (a Debian or Ubuntu machine)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  # A private apt state: the release's lists, and an empty dpkg status, so
  # that the resolver names every dependency, not only what this machine lacks.
  local apt
  apt="$(mktemp -d)"
  trap 'rm -rf "$apt"' RETURN
  mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
  : >"$apt/status"
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  {
    echo "deb [signed-by=$keyring] $mirror $release main"
    echo "deb [signed-by=$keyring] $mirror $release-updates main"
    echo "deb [signed-by=$keyring] ${mirror%/debian}/debian-security $release-security main"
  } >"$apt/sources.list"
  local options=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::lists=$apt/lists" -o "Dir::State::status=$apt/status"
    -o "Dir::Cache=$apt/cache" -o "APT::Architecture=amd64" -o "Acquire::Languages=none"
    -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
  apt-get "${options[@]}" -qq update || die "apt-get update for $release failed (mirror $mirror)"
  local resolved
  resolved="$(apt-get "${options[@]}" -s install --no-install-recommends "${packages[@]}" |
    awk '/^Inst /{print $2 "=" substr($3, 2)}')" || die "apt cannot resolve ${packages[*]}"
  local carried=()
  while read -r item; do
    [[ -z "$item" ]] && continue
    [[ "${item%%=*}" =~ $not_carried ]] || carried+=("$item")
  done <<<"$resolved"
  (cd "$dir" && apt-get "${options[@]}" -qq download "${carried[@]}") ||
    die "apt-get download failed"
  printf '%s\n' "${carried[@]}" >"$dir/packages.txt"
  echo "carry_packages: ${#carried[@]} packages of $release in $dir" \
    "($(du -sh "$dir" | cut -f1)); carry the folder and this checkout to the target"
}

unpack() {
  local dir="$1" prefix="$2"
  compgen -G "$dir/*.deb" >/dev/null || die "no .deb files in $dir (run download first)"
  command -v dpkg >/dev/null || die "unpack needs dpkg (dpkg -x)"
  mkdir -p "$prefix"
  prefix="$(cd "$prefix" && pwd)"
  local deb
  for deb in "$dir"/*.deb; do
    dpkg -x "$deb" "$prefix"
  done
  # pkgconf links libpkgconf from the prefix: a wrapper finds it there.
  mkdir -p "$prefix/bin"
  cat >"$prefix/bin/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" \\
  exec "$prefix/usr/bin/pkgconf" "\$@"
EOF
  chmod +x "$prefix/bin/pkg-config"
  cat >"$prefix/env.sh" <<EOF
# Source this before \`pip install --no-build-isolation .\`: the packages
# unpacked in $prefix (scripts/carry_packages.sh).
export PATH="$prefix/bin:$prefix/usr/bin:\$PATH"
export PKG_CONFIG="$prefix/bin/pkg-config"
export PKG_CONFIG_LIBDIR="$prefix/usr/lib/x86_64-linux-gnu/pkgconfig:$prefix/usr/share/pkgconfig"
export PKG_CONFIG_SYSROOT_DIR="$prefix"
unset PKG_CONFIG_PATH
EOF
  echo "carry_packages: unpacked $(ls "$dir"/*.deb | wc -l) packages into $prefix;" \
    ". $prefix/env.sh before pip install --no-build-isolation ."
}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
command="$1"
shift
case "$command" in
  -h|--help) usage; exit 0 ;;
  download)
    [[ $# -ge 1 ]] || die "download needs DIR"
    dir="$1" release=bookworm
    shift
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --release) [[ -n "${2:-}" ]] || die "--release needs a value"; release="$2"; shift 2 ;;
        *) die "unknown argument '$1'" ;;
      esac
    done
    download "$dir" "$release" ;;
  unpack)
    [[ $# -eq 2 ]] || die "unpack needs DIR and PREFIX"
    unpack "$1" "$2" ;;
  *) die "unknown command '$command' (download or unpack; --help)" ;;
esac
