#!/bin/bash
# Builds Debian's Abseil (the same source release as the installed
# libabsl-dev, with its installed headers) as static libraries instrumented
# for ThreadSanitizer, and prints the directory holding them. Debian's
# shared libraries are built without TSan, so TSan cannot see an
# absl::Mutex synchronise and reports every access behind one as a race;
# linking these instead (`--config=tsan --linkopt=-L<dir>`) makes the
# server's tests checkable. Cached under $XDG_CACHE_HOME (or ~/.cache).
# The source comes from Debian's archive, checked against its published
# SHA-256.
set -euo pipefail
# The upstream releases Debian ships, with the SHA-256 of their source
# tarballs from Debian's archive (its .dsc files list them).
declare -A sha256s=(
  [20220623.1]=abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe  # bookworm
  [20240722.0]=df6d1f5ef540725f3851201176a60486aab332410788465c9877910bb471c34a  # trixie
)
installed="$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null || true)"
version="${installed%-*}"
sha256="${sha256s[$version]:-}"
if [[ -z "$sha256" ]]; then
  echo "tsan_absl: libabsl-dev is '$installed'; this script knows ${!sha256s[*]}" >&2
  exit 1
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/knapformer/tsan-absl-$installed"
if [[ -f "$cache/done" ]]; then
  echo "$cache/lib"
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tarball="abseil_${version}.orig.tar.gz"
curl -fsS --retry 3 -o "$work/$tarball" "http://deb.debian.org/debian/pool/main/a/abseil/$tarball" >&2
echo "$sha256  $work/$tarball" | sha256sum -c --quiet - >&2
tar -C "$work" -xzf "$work/$tarball"
src="$work/abseil-$version"
# Debian's patches change only headers (its inline namespace, std types
# off, hardening): build with exactly the installed ones.
cp -r /usr/include/absl/. "$src/absl/"
# -O1 -g1 (line tables), as --config=tsan builds our code: cheaper than
# RelWithDebInfo's -O2 -g, and enough for TSan's stacks.
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_C_FLAGS="-fsanitize=thread" \
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF >&2
# Only the libraries the build links (WORKSPACE's system_absl modules and
# what they require): about half of Abseil.
modules=(absl_status absl_statusor absl_strings absl_str_format absl_synchronization absl_time)
cmake --build "$work/build" -j "$(nproc)" \
  --target status statusor strings str_format_internal synchronization time >&2
mkdir -p "$cache/lib"
find "$work/build" -name 'libabsl_*.a' -exec cp {} "$cache/lib/" \;
# Every library the link names must be here, or the link would quietly take
# Debian's uninstrumented one.
for library in $(pkg-config --libs-only-l "${modules[@]}" | grep -o -- "-labsl_[a-z0-9_]*"); do
  [[ -f "$cache/lib/lib${library#-l}.a" ]] || {
    echo "tsan_absl: lib${library#-l}.a was not built" >&2; exit 1; }
done
touch "$cache/done"
echo "$cache/lib"
