"""The pip build (setup.py, python/pip_configure.py) and the Bazel build of
knapformer._C compile the same files: CI fails when they drift apart.
Bazel's set comes from //python:extension_sources (python/source_set.bzl);
under --config=cuda the raw NCCL transport's files belong to both."""
import ast
import os
import re

import pip_configure
import package_facts

BAZEL_SET = "python/extension_sources.txt"
BUILD_INFO = "python/knapformer/_build_info.py"


def bazel_sources():
    with open(BAZEL_SET, encoding="utf-8") as f:
        return {line.strip() for line in f if line.strip()}


def bazel_has_nccl():
    with open(BUILD_INFO, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    info = ast.literal_eval(tree.body[-1].value)
    return info["nccl_transport"]


def pip_sources(cuda):
    files = pip_configure.SOURCES + pip_configure.HEADERS + pip_configure.PROTOS
    if cuda:
        files += pip_configure.CUDA_SOURCES + pip_configure.CUDA_HEADERS
    return files


def test_pip_and_bazel_compile_the_same_files():
    cuda = bazel_has_nccl()
    listed = pip_sources(cuda)
    assert len(listed) == len(set(listed)), "python/pip_configure.py lists a file twice"
    bazel, pip = bazel_sources(), set(listed)
    only_bazel, only_pip = sorted(bazel - pip), sorted(pip - bazel)
    assert not only_bazel and not only_pip, (
        f"the builds differ{' (--config=cuda)' if cuda else ''}: "
        f"only in Bazel's //python:knapformer/_C.so: {only_bazel}; "
        f"only in python/pip_configure.py: {only_pip}")


def test_the_lists_are_sorted_and_in_their_places():
    for name in ("SOURCES", "HEADERS", "CUDA_SOURCES", "CUDA_HEADERS"):
        files = getattr(pip_configure, name)
        assert files == sorted(files), f"pip_configure.{name} is not sorted"
        suffixes = (".cc",) if "SOURCES" in name else (".h",)
        assert all(f.endswith(suffixes) for f in files), name
    assert all(p.startswith(pip_configure.PROTO_ROOT + "/") for p in pip_configure.PROTOS)


def test_the_cuda_files_are_bazels_under_config_cuda():
    # Without --config=cuda they must be outside Bazel's set (select()), so
    # that a CPU build never needs CUDA headers; with it, inside.
    bazel = bazel_sources()
    inside = [f for f in pip_configure.CUDA_SOURCES if f in bazel]
    assert inside == (pip_configure.CUDA_SOURCES if bazel_has_nccl() else [])


def test_the_versions_agree():
    with open("python/version.bzl", encoding="utf-8") as f:
        bzl = re.search(r'^VERSION = "([^"]+)"$', f.read(), re.MULTILINE).group(1)
    assert bzl == package_facts.version()
