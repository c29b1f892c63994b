"""What both builds of the Python package (Bazel's //:wheel and
`pip install --no-build-isolation .`) must write the same way: the version,
the torch requirement, knapformer/_build_info.py, which the package
checks on import before it loads its extension, and where the command line
and its console script go.

    python3 package_facts.py build-info --out FILE --torch 2.6.0 --cuda 12.4 \
        --cxx11-abi 1 --python 3.13 --nccl-transport 0 --built-by bazel
"""
import argparse
import os
import re

NAME = "knapformer"
# The command line, in the package, and the console script that runs it.
COMMAND = f"{NAME}/bin/{NAME}"
CONSOLE_SCRIPT = f"{NAME} = {NAME}.cli:main"
_HERE = os.path.dirname(os.path.abspath(__file__))
_VERSION_FILE = os.path.join(_HERE, NAME, "_version.py")


def version():
    """The package's version, from knapformer/_version.py (its one home)."""
    with open(_VERSION_FILE, encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"{_VERSION_FILE}: no line __version__ = \"...\"")
    return match.group(1)


def torch_major_minor(torch_version):
    match = re.match(r"(\d+)\.(\d+)(?:[.+a-z]|$)", torch_version)
    if match is None:
        raise ValueError(f"cannot read MAJOR.MINOR from the torch version {torch_version!r}")
    return int(match.group(1)), int(match.group(2))


def torch_specifier(torch_version):
    """The versions of torch the extension works with: the major.minor it was
    built against, as knapformer/__init__.py checks it on import (a local
    label such as +cu121 or +gitunknown is ignored there and here). The
    lower bound is X.Y.dev0 so that pre-releases and dev builds of X.Y match
    too: Debian's python3-torch registers as 1.13.0a0+gitunknown, which
    ">=1.13" would refuse. "<X.(Y+1)" excludes X.(Y+1)'s pre-releases."""
    major, minor = torch_major_minor(torch_version)
    return f">={major}.{minor}.dev0,<{major}.{minor + 1}"


def build_info_source(torch, cuda, cxx11_abi, python, nccl_transport, built_by):
    """The text of knapformer/_build_info.py."""
    info = {
        "version": version(),
        "torch": torch,
        "torch_cuda": cuda or None,
        "cxx11_abi": bool(cxx11_abi),
        "python": python,
        "nccl_transport": bool(nccl_transport),
        "built_by": built_by,
    }
    lines = [f"    {key!r}: {value!r}," for key, value in info.items()]
    return ('"""What this copy of knapformer was built against (written by the build;\n'
            'knapformer/__init__.py compares it with the running torch)."""\n'
            "BUILD_INFO = {\n" + "\n".join(lines) + "\n}\n")


def _flag(text):
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"needs 0 or 1, got {text!r}")
    return text == "1"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("build-info", help="write knapformer/_build_info.py")
    info.add_argument("--out", required=True)
    info.add_argument("--torch", required=True, help="torch.__version__ built against")
    info.add_argument("--cuda", default="", help="torch.version.cuda; empty for a CPU torch")
    info.add_argument("--cxx11-abi", type=_flag, required=True)
    info.add_argument("--python", required=True, help="MAJOR.MINOR")
    info.add_argument("--nccl-transport", type=_flag, required=True)
    info.add_argument("--built-by", required=True, choices=["bazel", "pip"])
    args = parser.parse_args()
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(build_info_source(args.torch, args.cuda if args.cuda != "None" else None,
                                  args.cxx11_abi, args.python, args.nccl_transport,
                                  args.built_by))


if __name__ == "__main__":
    main()
