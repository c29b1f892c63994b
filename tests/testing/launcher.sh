# Sourced by tests that start a torchrun-style job on this machine:
#   choose_launcher PYTHON NPROC   # sets the array `launcher` and prints which
# torchrun where it can start; python3 -m knapformer.launch (the package's
# one-node launcher, same environment for the script) on a torch whose
# TCPStore has no libuv (Debian's 2.6), where torchrun's own rendezvous
# stores refuse to start. The package must be importable (PYTHONPATH).
choose_launcher() {
  local python="$1" nproc="$2"
  if "$python" -c 'import sys; from knapformer._torch_compat import default_tcp_store_works as ok
sys.exit(0 if ok() else 1)'; then
    echo "launcher: torchrun"
    launcher=(-m torch.distributed.run --nproc_per_node "$nproc" --redirects 1 --tee 1
      --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:0)
  else
    echo "launcher: knapformer.launch (this torch's TCPStore has no libuv: torchrun cannot start)"
    launcher=(-m knapformer.launch --nproc_per_node "$nproc")
  fi
}
