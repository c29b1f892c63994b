#!/bin/bash
# Installs a stand-in libcudnn.so.9 for Debian's CUDA torch on a machine that
# compiles but never runs CUDA (the trixie lane's root; setup.sh
# --profile cuda calls it). Debian's nvidia-cudnn package is an
# installer that downloads cuDNN from NVIDIA, which an offline machine
# cannot do, yet libtorch_cuda needs libcudnn.so.9 to link and to load.
# The stand-in exports exactly the versioned cuDNN symbols the installed
# torch libraries import; every one of them fails (CUDNN_STATUS_NOT_SUPPORTED,
# a version of 0), so nothing can mistake it for cuDNN. Never install it on
# a machine with a GPU: install the real cuDNN there.
#   bash scripts/cudnn_stub.sh [LIBDIR]   # default /usr/lib/x86_64-linux-gnu
set -euo pipefail
libdir="${1:-/usr/lib/x86_64-linux-gnu}"
target="$libdir/libcudnn.so.9"
if [[ -e "$target" ]]; then
  if grep -q knapformer_cudnn_stub "$target" 2>/dev/null; then
    exit 0  # already the stand-in
  fi
  echo "cudnn_stub: $target exists and is not the stand-in; leaving it" >&2
  exit 0
fi
importers=("$libdir"/libtorch_cuda.so.* "$libdir"/libtorch_python.so.*)
symbols="$(for lib in "${importers[@]}"; do
  if [[ -f "$lib" && ! -L "$lib" ]]; then nm -D --undefined-only "$lib"; fi
done | awk '{print $2}' | sed -n 's/^\(cudnn[A-Za-z0-9_]*\)@libcudnn\.so\.9$/\1/p' | sort -u)"
if [[ -z "$symbols" ]]; then
  echo "cudnn_stub: no library in $libdir imports cuDNN 9 symbols; nothing to do" >&2
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
{
  echo '/* knapformer_cudnn_stub: every call fails; see scripts/cudnn_stub.sh. */'
  echo '#include <stddef.h>'
  echo 'const char knapformer_cudnn_stub[] = "knapformer_cudnn_stub";'
  for symbol in $symbols; do
    case "$symbol" in
      cudnnGetVersion|cudnnGetCudartVersion) echo "size_t $symbol(void) { return 0; }" ;;
      cudnnGetErrorString)
        echo "const char* $symbol(int s) { (void)s; return \"cuDNN stand-in: not cuDNN\"; }" ;;
      cudnnGetLastErrorString) echo "void $symbol(char* m, size_t n) { if (n) m[0] = 0; }" ;;
      *) echo "int $symbol(void) { return 3000; /* CUDNN_STATUS_NOT_SUPPORTED */ }" ;;
    esac
  done
} >"$work/stub.c"
{
  echo 'libcudnn.so.9 {'
  echo '  global:'
  for symbol in $symbols knapformer_cudnn_stub; do echo "    $symbol;"; done
  echo '  local: *;'
  echo '};'
} >"$work/stub.map"
gcc -shared -fPIC -O1 -Wl,-soname,libcudnn.so.9 -Wl,--version-script="$work/stub.map" \
  -o "$work/libcudnn.so.9" "$work/stub.c"
install -m 0644 "$work/libcudnn.so.9" "$target"
ldconfig
echo "cudnn_stub: installed $target ($(wc -l <<<"$symbols") symbols, all failing)" >&2
