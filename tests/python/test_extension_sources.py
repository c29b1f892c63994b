"""python/extension_sources.bzl, the one list of the files knapformer._C is
built from: Bazel's //python:knapformer/_C.so compiles exactly these (its
sandbox refuses an include the list lacks) and so does the pip build
(python/pip_configure.py reads the same file). These tests check the list
itself, including what Bazel's sandbox cannot see: the CUDA files' includes,
which only a --config=cuda build or a pip build against a CUDA torch
compiles."""
import os
import re

import package_facts
import pip_configure

INCLUDE = re.compile(r'^#include "([^"]+)"', re.MULTILINE)
IMPORT = re.compile(r'^import "([^"]+)";', re.MULTILINE)


def listed():
    return (pip_configure.SOURCES + pip_configure.HEADERS + pip_configure.CUDA_SOURCES +
            pip_configure.CUDA_HEADERS)


def test_the_lists_are_sorted_unique_and_exist():
    for name in ("SOURCES", "HEADERS", "CUDA_SOURCES", "CUDA_HEADERS"):
        files = getattr(pip_configure, name)
        assert files == sorted(files), f"extension_sources.bzl: {name} is not sorted"
        suffix = ".cc" if "SOURCES" in name else ".h"
        assert all(f.endswith(suffix) for f in files), f"{name} holds a file not ending {suffix}"
    files = listed() + pip_configure.PROTOS
    assert len(files) == len(set(files)), "extension_sources.bzl lists a file twice"
    missing = [f for f in files if not os.path.isfile(f)]
    assert not missing, f"extension_sources.bzl lists files that do not exist: {missing}"
    assert set(pip_configure.GRPC_PROTOS) <= set(pip_configure.PROTOS)


def test_every_include_and_import_is_listed():
    headers = set(pip_configure.HEADERS + pip_configure.CUDA_HEADERS)
    generated = {pip_configure.proto_import_path(p)[:-len(".proto")] + ext
                 for p in pip_configure.PROTOS for ext in (".pb.h", ".grpc.pb.h")}
    unlisted = []
    for path in listed():
        with open(path, encoding="utf-8") as f:
            for include in INCLUDE.findall(f.read()):
                # Repository headers only (not absl/, grpcpp/, torch/...).
                if include.split("/")[0] in ("client", "common", "planner", "proto", "python",
                                             "server", "transport") or include in generated:
                    if include not in headers and include not in generated:
                        unlisted.append(f"{path} includes {include}")
    for proto in pip_configure.PROTOS:
        with open(proto, encoding="utf-8") as f:
            for imported in IMPORT.findall(f.read()):
                if not any(pip_configure.proto_import_path(p) == imported
                           for p in pip_configure.PROTOS):
                    unlisted.append(f"{proto} imports {imported}")
    assert not unlisted, "extension_sources.bzl lacks: " + "; ".join(unlisted)


def test_the_command_lines_files_are_listed_and_need_only_its_rooms():
    """The pip build's `knapformer` command (setup.py) compiles
    COMMAND_LINE_SOURCES and links the extension's objects of
    COMMAND_LINE_ROOMS: every repository header its files include is listed,
    and every listed source it needs beyond them is in those rooms."""
    for name in ("COMMAND_LINE_SOURCES", "COMMAND_LINE_HEADERS"):
        files = getattr(pip_configure, name)
        assert files == sorted(files), f"extension_sources.bzl: {name} is not sorted"
        missing = [f for f in files if not os.path.isfile(f)]
        assert not missing, f"{name} lists files that do not exist: {missing}"
    sources = pip_configure.COMMAND_LINE_SOURCES
    assert not set(sources) & set(pip_configure.SOURCES), "compiled twice"
    headers = set(pip_configure.HEADERS + pip_configure.COMMAND_LINE_HEADERS)
    generated = {pip_configure.proto_import_path(p)[:-len(".proto")] + ext
                 for p in pip_configure.PROTOS for ext in (".pb.h", ".grpc.pb.h")}
    rooms = set(pip_configure.COMMAND_LINE_ROOMS)
    seen, todo, unlisted = set(), list(sources), []
    while todo:  # every file the command's sources reach through includes
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        with open(path, encoding="utf-8") as f:
            for include in INCLUDE.findall(f.read()):
                room = include.split("/")[0]
                if include in generated:
                    continue
                if room not in ("client", "common", "planner", "proto", "python", "server",
                                "tools", "transport"):
                    continue
                if include not in headers:
                    unlisted.append(f"{path} includes {include}")
                    continue
                if room not in rooms and room != "tools":
                    unlisted.append(f"{path} reaches {include}, outside {sorted(rooms)}")
                todo.append(include)
                source = include[:-len(".h")] + ".cc"
                if os.path.isfile(source):
                    todo.append(source)
    assert not unlisted, "the command line's lists: " + "; ".join(unlisted)


def test_the_cuda_files_are_apart():
    # Without a CUDA torch the extension must not need CUDA headers: a file
    # of the CPU lists includes a CUDA-only one only under KNAPFORMER_HAVE_NCCL.
    cuda = set(pip_configure.CUDA_HEADERS)
    for path in pip_configure.SOURCES + pip_configure.HEADERS:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for match in INCLUDE.finditer(text):
            if match.group(1) in cuda:
                assert "#ifdef KNAPFORMER_HAVE_NCCL" in text[:match.start()], \
                    f"{path} includes {match.group(1)} outside #ifdef KNAPFORMER_HAVE_NCCL"


def test_the_versions_agree():
    with open("python/version.bzl", encoding="utf-8") as f:
        bzl = re.search(r'^VERSION = "([^"]+)"$', f.read(), re.MULTILINE).group(1)
    assert bzl == package_facts.version()
