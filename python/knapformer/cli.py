"""The `knapformer` command a pip install puts on the PATH: `serve`, `plan`,
`simulate`, `calibrate` and `token` run the command line built with the
package (knapformer/bin/knapformer, the same sources as Bazel's
//tools:knapformer), `replay` runs knapformer.replay; `python -m knapformer`
is the same."""
import os
import sys


def command_path():
    """The command line installed with the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "knapformer")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["replay"]:  # Python: what it times is torch
        from knapformer.replay import main as replay_main
        replay_main(argv[1:])
        return
    path = command_path()
    if not os.access(path, os.X_OK):
        sys.exit(f"knapformer: the command line is not installed with this package ({path} is "
                 f"missing or not executable): reinstall it with `pip install "
                 f"--no-build-isolation .`, or run `bash scripts/knapformer` from a checkout")
    sys.stdout.flush()
    os.execv(path, [path] + argv)


if __name__ == "__main__":
    main()
