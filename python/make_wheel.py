#!/usr/bin/python3
"""Writes the knapformer wheel from the package's files (Bazel's //:wheel).

A wheel is a zip archive with the package and a .dist-info folder (METADATA,
WHEEL, RECORD with a sha256 per file); writing it directly needs nothing but
the standard library, which suits this offline build.
"""
import argparse
import base64
import hashlib
import os
import re
import stat
import zipfile

import package_facts

NAME = package_facts.NAME
COMMAND = package_facts.COMMAND


def torch_requirement(torch_version):
    """The Requires-Dist value for the torch release the extension was built
    against (package_facts.torch_specifier says which)."""
    try:
        return f"torch ({package_facts.torch_specifier(torch_version)})"
    except ValueError as error:
        raise SystemExit(f"make_wheel: --torch-version: {error}")


def archive_name(path):
    """The file's name in the wheel: its path from the package's folder on, so that
    subpackages (knapformer/gpu_check/) keep theirs. The last knapformer/ folder in the
    path is the package's: the checkout's own folder may be called knapformer too."""
    parts = os.path.normpath(path).split(os.sep)
    folders = parts[:-1]
    if NAME not in folders:
        raise SystemExit(f"make_wheel: {path} is not in a {NAME}/ folder")
    root = len(folders) - 1 - folders[::-1].index(NAME)
    return "/".join(parts[root:])


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--readme", required=True)
    parser.add_argument("--version", required=True, help="the version in the wheel's name")
    parser.add_argument("--tag", required=True, help="e.g. cp313-cp313-linux_x86_64")
    parser.add_argument("--python-version", required=True, help="MAJOR.MINOR, e.g. 3.13")
    parser.add_argument("--torch-version", required=True,
                        help="the torch the extension was built against, e.g. 1.13.0a0")
    parser.add_argument("--command", required=True,
                        help="the command line (//tools:knapformer), installed as " + COMMAND)
    parser.add_argument("files", nargs="+",
                        help="knapformer/*.py (_build_info.py among them), "
                             "knapformer/gpu_check/*.py and knapformer/_C.so")
    args = parser.parse_args()
    version = package_facts.version()
    if args.version != version:
        raise SystemExit(f"make_wheel: --version {args.version} (python/version.bzl) differs "
                         f"from knapformer/_version.py's {version}: change both together")

    entries = []
    for path in sorted(args.files):
        with open(path, "rb") as f:
            entries.append((archive_name(path), f.read()))
    if not any(name.endswith("/_C.so") for name, _ in entries):
        raise SystemExit("make_wheel: the extension knapformer/_C.so is missing")
    with open(args.command, "rb") as f:
        entries.append((COMMAND, f.read()))
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()

    info = f"{NAME}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
                "Summary: Online load balancing of sequences for distributed transformer "
                "training (KnapFormer), with a gRPC planner service\n"
                f"Requires-Python: =={args.python_version}.*\n"
                f"Requires-Dist: {torch_requirement(args.torch_version)}\n"
                "Provides-Extra: plot\n"
                'Requires-Dist: matplotlib; extra == "plot"\n'
                "Description-Content-Type: text/markdown\n\n" + readme)
    wheel = (f"Wheel-Version: 1.0\nGenerator: knapformer make_wheel.py\n"
             f"Root-Is-Purelib: false\nTag: {args.tag}\n")
    entries += [(f"{info}/METADATA", metadata.encode()), (f"{info}/WHEEL", wheel.encode()),
                (f"{info}/entry_points.txt",
                 f"[console_scripts]\n{package_facts.CONSOLE_SCRIPT}\n".encode()),
                (f"{info}/top_level.txt", f"{NAME}\n".encode())]
    record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in entries)
    record += f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))

    with zipfile.ZipFile(args.out, "w", compression=zipfile.ZIP_DEFLATED) as wheel_zip:
        for name, data in entries:
            # Fixed timestamps and modes: the same inputs give the same wheel.
            item = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            # A regular file's type bits too: pip makes a file executable
            # only when they say it is one.
            executable = name.endswith(".so") or name == COMMAND
            item.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            wheel_zip.writestr(item, data)


if __name__ == "__main__":
    main()
