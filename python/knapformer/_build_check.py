"""Whether this copy of knapformer can load under the running torch.

Its extension is C++ compiled against one torch: another torch's C++ types
and symbols differ, and loading it anyway ends in an undefined symbol (or,
worse, a crash later). So the build writes what it was built against into
knapformer/_build_info.py, and the package compares that with the running
torch before it loads the extension: major.minor, the C++ string ABI, and,
where the extension carries the raw NCCL transport, a CUDA torch of the same
CUDA major. A mismatch raises ImportError naming both and how to rebuild.
"""
import importlib
import re
import sys


def _major_minor(version):
    match = re.match(r"(\d+)\.(\d+)", str(version))
    return (int(match.group(1)), int(match.group(2))) if match else None


def _describe(torch_version, cuda, cxx11_abi):
    cuda_text = f"CUDA {cuda}" if cuda else "CPU"
    abi_text = "new" if cxx11_abi else "old"
    return f"torch {torch_version} ({cuda_text}, {abi_text} C++ string ABI)"


def how_to_rebuild(info):
    if info.get("built_by") == "bazel":
        return f"bash scripts/build_wheel.sh --python {sys.executable}"
    return (f"{sys.executable} -m pip install --no-build-isolation --no-deps "
            "--force-reinstall <your knapformer checkout>")


def mismatches(info, torch_version, torch_cuda, torch_cxx11_abi):
    """The reasons the build described by `info` cannot load under a torch
    with these facts (empty when it can)."""
    reasons = []
    if _major_minor(info["torch"]) != _major_minor(torch_version):
        reasons.append("torch releases differ")
    if bool(info["cxx11_abi"]) != bool(torch_cxx11_abi):
        reasons.append("C++ string ABIs differ")
    if info.get("nccl_transport"):
        built_cuda = _major_minor(info.get("torch_cuda") or "")
        running_cuda = _major_minor(torch_cuda or "")
        if running_cuda is None:
            reasons.append("it carries the raw NCCL transport, which needs a CUDA torch")
        elif built_cuda is not None and built_cuda[0] != running_cuda[0]:
            reasons.append("CUDA major versions differ")
    return reasons


def check_build(torch):
    """Returns the build info (a dict) when this build can load under
    `torch` (the imported module); raises ImportError otherwise."""
    try:
        info = dict(importlib.import_module("knapformer._build_info").BUILD_INFO)
    except ImportError as error:
        raise ImportError(
            "knapformer: knapformer/_build_info.py is missing, so this is a source tree, not "
            f"a built package ({error}). Install it: {sys.executable} -m pip install "
            "--no-build-isolation <your knapformer checkout> (docs/python.md)") from None
    cxx11_abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    reasons = mismatches(info, torch.__version__, torch.version.cuda, cxx11_abi)
    if reasons:
        built = _describe(info["torch"], info.get("torch_cuda"), info["cxx11_abi"])
        running = _describe(torch.__version__, torch.version.cuda, cxx11_abi)
        raise ImportError(
            f"knapformer {info['version']} was built against {built}, but this interpreter "
            f"has {running}: {'; '.join(reasons)}, and its C++ extension cannot load with "
            f"another torch's. Rebuild it for this torch: {how_to_rebuild(info)}")
    return info


def load_extension(info):
    """knapformer._C, or an ImportError that says what a failed load most
    likely lacks once the torch matches: the system libraries it links."""
    try:
        return importlib.import_module("knapformer._C")
    except ImportError as error:
        raise ImportError(
            f"knapformer: its C++ extension does not load ({error}). It was built by "
            f"{info.get('built_by', '?')} and links the system's gRPC, protobuf, Abseil and "
            "prometheus-cpp: install their runtime packages (docs/python.md, Install), or, "
            "for a build from carried packages, keep their folder where it was when it was "
            f"built (docs/development.md). Rebuilding: {how_to_rebuild(info)}") from error
