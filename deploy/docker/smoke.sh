# The planner image's checks, sourced by deploy/docker/build.sh (which
# defines pm, pass, fail, work and container_prefix). Each check prints what it saw
# and returns non-zero naming what went wrong; every wait is bounded.

readonly SMOKE_JOB="image-smoke"
readonly IMAGE_BINARY="/usr/local/bin/knapformer"
readonly IMAGE_USER="65532:65532"

# The libraries the binary loads that the image lacks, one line, or nothing.
missing_libraries() {
  pm run --rm --user 0 --entrypoint /bin/sh "$1" -c "ldd $IMAGE_BINARY" 2>&1 |
    awk '/not found/ { printf "%s%s", sep, $1; sep = ", " }'
}

# Starts `knapformer serve` from the image as deploy/k8s runs it and checks
# it from the host, then stops it with SIGTERM.
smoke_test() {
  local image="$1" probe="$2" name="$container_prefix-$RANDOM"
  local user
  user="$(pm image inspect --format '{{.Config.User}}' "$image")"
  if [[ "$user" != "$IMAGE_USER" ]]; then
    echo "the image runs as '$user', not $IMAGE_USER (deploy/k8s runAsUser/runAsGroup)"
    return 1
  fi
  # The image's own user; the root file system read-only without the tmpfs
  # podman would otherwise add on /tmp and /run (Kubernetes adds none); no
  # capabilities, no privilege escalation. Host network: the server listens
  # on 127.0.0.1 ports of its choosing, which its log names.
  if ! pm run -d --name "$name" --network host --read-only --read-only-tmpfs=false \
      --cap-drop=ALL --security-opt=no-new-privileges "$image" \
      serve --listen=127.0.0.1:0 --metrics=127.0.0.1:0 --log-level=info >/dev/null; then
    echo "podman run of $image failed"
    return 1
  fi

  local line="" deadline=$((SECONDS + 60))
  while ((SECONDS < deadline)); do
    line="$(pm logs "$name" 2>&1 | grep -m1 'planner serving on')" && break
    if [[ "$(pm inspect --format '{{.State.Running}}' "$name")" != true ]]; then
      echo "the server exited with status $(pm inspect --format '{{.State.ExitCode}}' "$name")" \
        "before serving. Its output:"
      pm logs "$name" 2>&1 | sed 's/^/  | /'
      local missing
      missing="$(missing_libraries "$image")"
      [[ -n "$missing" ]] &&
        echo "The image lacks shared libraries $IMAGE_BINARY loads: $missing (ldd in the image)"
      return 1
    fi
    sleep 0.5
  done
  if [[ -z "$line" ]]; then
    echo "no 'planner serving on' line within 60 s. Its output:"
    pm logs "$name" 2>&1 | sed 's/^/  | /'
    return 1
  fi
  local grpc_port metrics_port
  grpc_port="$(sed -nE 's/.*planner serving on [^ ]*:([0-9]+) .*/\1/p' <<<"$line")"
  metrics_port="$(sed -nE 's/.*metrics on [^ ]*:([0-9]+)\/metrics.*/\1/p' <<<"$line")"
  if [[ -z "$grpc_port" || -z "$metrics_port" ]]; then
    echo "cannot read the ports from the server's line: $line"
    return 1
  fi
  echo "serving: $line"

  local uids
  uids="$(pm exec "$name" cat /proc/1/status | awk '/^Uid:/ { print $2, $3, $4, $5 }')"
  if [[ "$uids" != "65532 65532 65532 65532" ]]; then
    echo "the server runs with UIDs '$uids' (real, effective, saved, fs), not 65532"
    return 1
  fi
  echo "the server runs as UID 65532"
  # As root in the container, so that only a read-only mount can refuse it.
  local written
  if written="$(pm exec --user 0 "$name" /bin/sh -c ': > /smoke-write && echo /; : > /tmp/smoke-write && echo /tmp' 2>/dev/null)" ||
     [[ -n "$written" ]]; then
    echo "the root file system is writable: wrote to ${written//$'\n'/ and }"
    return 1
  fi
  echo "the root file system is read-only (/ and /tmp refuse writes)"

  if ! timeout 120 "$probe" "$grpc_port" "$metrics_port" "$SMOKE_JOB" 2>&1; then
    echo "the host's checks of the server failed (tests/deploy/image_probe). Server output:"
    pm logs "$name" 2>&1 | tail -20 | sed 's/^/  | /'
    return 1
  fi

  pm kill --signal TERM "$name" >/dev/null
  local status
  status="$(timeout 30 podman --root "$work/storage" --runroot "$work/run" \
    --storage-driver overlay wait "$name")"
  if [[ "$status" != 0 ]]; then
    echo "after SIGTERM the server exited with '${status:-no status within 30 s}', not 0. Its output:"
    pm logs "$name" 2>&1 | tail -20 | sed 's/^/  | /'
    return 1
  fi
  if ! pm logs "$name" 2>&1 | grep -q 'planner stopped'; then
    echo "the server exited 0 on SIGTERM without logging 'planner stopped'"
    return 1
  fi
  echo "SIGTERM: 'planner stopped', exit 0"
  pm rm "$name" >/dev/null
}

# What a runtime image must not hold: a compiler, Bazel, Java, package lists,
# the source tree or Bazel's output.
image_contents_check() {
  pm run --rm --user 0 --entrypoint /bin/sh "$1" -c '
    found=0
    for tool in gcc g++ cc c++ cpp clang clang++ ld as bazel java javac make; do
      if path="$(command -v "$tool")"; then echo "a build tool: $path"; found=1; fi
    done
    for file in /usr/lib/gcc/*/*/cc1 /usr/lib/gcc/*/*/cc1plus; do
      [ -e "$file" ] && { echo "a compiler: $file"; found=1; }
    done
    lists="$(find /var/lib/apt/lists -type f ! -name lock 2>/dev/null | wc -l)"
    [ "$lists" -gt 0 ] && { echo "package lists: $lists files in /var/lib/apt/lists"; found=1; }
    for dir in /src /root/.cache/bazel /out; do
      [ -e "$dir" ] && { echo "build leftovers: $dir"; found=1; }
    done
    exit "$found"'
}

# A copy of the image without one library the binary loads must fail the
# smoke test, and the failure must name that library.
broken_image_check() {
  local image="$1" probe="$2" check="a broken image fails the smoke test, naming the problem"
  local library
  library="$(pm run --rm --entrypoint /bin/sh "$image" -c "ldd $IMAGE_BINARY" |
    awk '$1 ~ /^libprometheus-cpp-pull/ { print $1, $3; exit }')"
  if [[ -z "$library" ]]; then
    fail "$check" "the binary loads no libprometheus-cpp-pull to remove"
    return
  fi
  local soname="${library% *}" path="${library#* }"
  mkdir -p "$work/broken"
  cat >"$work/broken/Containerfile" <<EOF
FROM $image
USER 0
RUN rm -f "\$(readlink -f $path)" $path
USER $IMAGE_USER
EOF
  local broken="${image%:*}:broken"
  if ! pm build --quiet --pull=never -t "$broken" "$work/broken" >/dev/null; then
    fail "$check" "could not build $broken"
    return
  fi
  local message
  if message="$(smoke_test "$broken" "$probe" 2>&1)"; then
    fail "$check" "the smoke test passed on an image without $soname"
  elif [[ "$message" != *"$soname"* ]]; then
    fail "$check" "the smoke test failed without naming $soname: $message"
  else
    pass "$check" "$soname removed"
    printf '%s\n' "$message" | sed 's/^/  /'
  fi
  pm rmi -f "$broken" >/dev/null 2>&1
}

# The build stage holds g++ and Bazel: the contents check must name them.
build_stage_check() {
  local repo="$1" base="$2" pull="$3" check="the contents check fails on the build stage"
  local stage="${image%:*}-build-stage:check"
  if ! (cd "$repo" && pm build --quiet --pull="$pull" --target build \
        --build-arg BUILD_BASE="$base" --build-arg RUNTIME_BASE="$base" \
        -f deploy/docker/Dockerfile -t "$stage" . >/dev/null); then
    fail "$check" "could not build the build stage"
    return
  fi
  local message
  if message="$(image_contents_check "$stage" 2>&1)"; then
    fail "$check" "the build stage passed the contents check"
  elif [[ "$message" != *"g++"* || "$message" != *bazel* ]]; then
    fail "$check" "the check did not name g++ and bazel: $message"
  else
    pass "$check"
    printf '%s\n' "$message" | sed 's/^/  /'
  fi
  pm rmi -f "$stage" >/dev/null 2>&1
}
