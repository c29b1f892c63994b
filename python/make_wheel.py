#!/usr/bin/python3
"""Writes the knapformer wheel from the package's files (Bazel's //python:wheel).

A wheel is a zip archive with the package and a .dist-info folder (METADATA,
WHEEL, RECORD with a sha256 per file); writing it directly needs nothing but
the standard library, which suits this offline build.
"""
import argparse
import base64
import hashlib
import os
import re
import zipfile

NAME, VERSION = "knapformer", "0.1.0"


def torch_requirement(torch_version):
    """The Requires-Dist value for the torch release the extension was built
    against: its major.minor, as knapformer/__init__.py checks it on import
    (a local label such as +cu121 or +gitunknown is ignored there and here).
    The lower bound is X.Y.dev0 so that pre-releases and dev builds of X.Y
    match too: Debian's python3-torch registers as 1.13.0a0+gitunknown,
    which ">=1.13" would refuse. "<X.(Y+1)" excludes X.(Y+1)'s pre-releases."""
    match = re.match(r"(\d+)\.(\d+)(?:[.+a-z]|$)", torch_version)
    if match is None:
        raise SystemExit(f"make_wheel: --torch-version: cannot read MAJOR.MINOR from "
                         f"{torch_version!r}")
    major, minor = int(match.group(1)), int(match.group(2))
    return f"torch (>={major}.{minor}.dev0,<{major}.{minor + 1})"


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--readme", required=True)
    parser.add_argument("--tag", required=True, help="e.g. cp313-cp313-linux_x86_64")
    parser.add_argument("--python-version", required=True, help="MAJOR.MINOR, e.g. 3.13")
    parser.add_argument("--torch-version", required=True,
                        help="the torch the extension was built against, e.g. 1.13.0a0")
    parser.add_argument("files", nargs="+", help="knapformer/*.py and knapformer/_C.so")
    args = parser.parse_args()

    entries = []
    for path in sorted(args.files):
        if os.path.basename(os.path.dirname(path)) != NAME:
            raise SystemExit(f"make_wheel: {path} is not in a {NAME}/ folder")
        with open(path, "rb") as f:
            entries.append((f"{NAME}/{os.path.basename(path)}", f.read()))
    if not any(name.endswith("/_C.so") for name, _ in entries):
        raise SystemExit("make_wheel: the extension knapformer/_C.so is missing")
    with open(args.readme, encoding="utf-8") as f:
        readme = f.read()

    info = f"{NAME}-{VERSION}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
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
                (f"{info}/top_level.txt", f"{NAME}\n".encode())]
    record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data in entries)
    record += f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))

    with zipfile.ZipFile(args.out, "w", compression=zipfile.ZIP_DEFLATED) as wheel_zip:
        for name, data in entries:
            # Fixed timestamps and modes: the same inputs give the same wheel.
            item = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            item.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            wheel_zip.writestr(item, data)


if __name__ == "__main__":
    main()
