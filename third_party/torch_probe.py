"""Describes the interpreter it runs under, and its torch, as one JSON object.

Run by third_party/torch_configure.bzl with the interpreter the build is for
(--repo_env=KNAPFORMER_PYTHON, default /usr/bin/python3). It only reports;
the rule decides what is usable. Without torch it still answers (torch:
null, with the import error), so that a CUDA-only build can ask too.
"""
import json
import os
import sys
import sysconfig


def python_facts():
    return {
        "executable": sys.executable,
        "version": f"{sys.version_info.major}.{sys.version_info.minor}",
        "include": sysconfig.get_paths()["include"],
        "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
        # The wheel tag: CPython's own, for this interpreter's platform.
        "abi_tag": "cp" + sysconfig.get_config_var("py_version_nodot"),
        "platform_tag": sysconfig.get_platform().replace("-", "_").replace(".", "_"),
    }


def pybind11_include(torch_includes):
    # The pybind11 torch was built with: pip wheels ship it in torch's own
    # include folder; Debian's torch uses the system's (pybind11-dev).
    for folder in torch_includes:
        if os.path.isfile(os.path.join(folder, "pybind11", "pybind11.h")):
            return folder
    try:
        import pybind11
        return pybind11.get_include()
    except ImportError:
        pass
    if os.path.isfile("/usr/include/pybind11/pybind11.h"):
        return "/usr/include"
    return None


def torch_folders(torch):
    """torch's header and library folders, as torch.utils.cpp_extension gives
    them (right for Debian's and pip's layouts alike). That module needs
    setuptools, which a Python 3.12+ venv lacks: then the same folders, made
    the way it makes them."""
    try:
        import torch.utils.cpp_extension as cpp_extension
        return cpp_extension.include_paths(), cpp_extension.library_paths()
    except ImportError:
        root = os.path.dirname(os.path.abspath(torch.__file__))
        include = os.path.join(root, "include")
        return ([include, os.path.join(include, "torch", "csrc", "api", "include")],
                [os.path.join(root, "lib")])


def torch_facts():
    import torch

    include_paths, library_paths = torch_folders(torch)
    includes = [os.path.realpath(p) for p in include_paths]
    libraries = [os.path.realpath(p) for p in library_paths]
    distributed = torch.distributed.is_available()
    facts = {
        "version": torch.__version__.split("+")[0],
        "full_version": torch.__version__,
        "file": os.path.dirname(os.path.realpath(torch.__file__)),
        "includes": [p for p in includes if os.path.isdir(p)],
        "library_dirs": [p for p in libraries if os.path.isdir(p)],
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "pybind11": {name: getattr(torch._C, f"_PYBIND11_{name}", None)
                     for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")},
        "cuda": torch.version.cuda,  # None for a CPU build
        "distributed": distributed,
        "gloo": distributed and torch.distributed.is_gloo_available(),
        "nccl": distributed and torch.distributed.is_nccl_available(),
    }
    facts["pybind11_include"] = pybind11_include(facts["includes"])
    # NCCL as torch loads it: a pip wheel's nvidia-nccl package, else none
    # here (Debian's torch-cuda links the system's libnccl2).
    nccl = None
    try:
        import nvidia.nccl
        nccl = os.path.realpath(list(nvidia.nccl.__path__)[0])
    except ImportError:
        pass
    facts["pip_nccl"] = nccl
    return facts


def main():
    facts = {"python": python_facts(), "torch": None, "torch_error": None}
    try:
        facts["torch"] = torch_facts()
    except Exception as error:  # any failure to import torch is reported, not raised
        facts["torch_error"] = f"{type(error).__name__}: {error}"
    # One marked line: importing torch may print warnings of its own.
    print("KNAPFORMER_PROBE " + json.dumps(facts))


if __name__ == "__main__":
    main()
