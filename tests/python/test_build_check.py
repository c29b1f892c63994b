"""The package knows what it was built against, and under another torch
its import raises an ImportError that names both and how to rebuild,
before the extension is loaded (no undefined symbol)."""
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import knapformer
from knapformer import _build_check

PACKAGE_PARENT = os.path.dirname(os.path.dirname(
    importlib.util.find_spec("knapformer").origin))


def test_build_info_describes_this_build_and_this_torch():
    info = knapformer.build_info
    assert set(info) == {"version", "torch", "torch_cuda", "cxx11_abi", "python",
                         "nccl_transport", "built_by"}
    assert info["version"] == knapformer.__version__
    assert info["torch"] == knapformer._C.__torch_version__
    assert info["torch"].split(".")[:2] == torch.__version__.split(".")[:2]
    assert info["torch_cuda"] == torch.version.cuda
    assert info["cxx11_abi"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert info["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert info["nccl_transport"] == bool(getattr(knapformer._C, "nccl_transport_available",
                                                  False))
    assert info["built_by"] in ("bazel", "pip")


BUILT = {"version": "0.1.0", "torch": "2.6.0", "torch_cuda": "12.4", "cxx11_abi": True,
         "python": "3.13", "nccl_transport": True, "built_by": "pip"}


@pytest.mark.parametrize("torch_version, cuda, abi, reasons", [
    ("2.6.0+cu124", "12.4", True, []),
    ("2.6.1", "12.6", True, []),               # same release and CUDA major
    ("2.7.0+cu126", "12.6", True, ["torch releases differ"]),
    ("2.6.0", "12.4", False, ["C++ string ABIs differ"]),
    ("2.6.0+cpu", None, True, ["needs a CUDA torch"]),
    ("2.6.0+cu130", "13.0", True, ["CUDA major versions differ"]),
])
def test_mismatches(torch_version, cuda, abi, reasons):
    found = _build_check.mismatches(BUILT, torch_version, cuda, abi)
    assert len(found) == len(reasons)
    for reason, text in zip(reasons, found):
        assert reason in text


def test_a_cpu_build_loads_under_a_cuda_torch_of_its_release():
    cpu_build = dict(BUILT, torch_cuda=None, nccl_transport=False)
    assert _build_check.mismatches(cpu_build, "2.6.0+cu124", "12.4", True) == []


def fake_torch(folder, version, abi=True, cuda=None):
    """A module named torch with another release's facts, and nothing else:
    the check must decide before anything of the extension loads."""
    package = folder / "torch"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        import types
        __version__ = {version!r}
        version = types.SimpleNamespace(cuda={cuda!r})
        _C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI={abi!r})
    """))


def import_under(folder, package_parent=PACKAGE_PARENT):
    code = textwrap.dedent("""
        import sys
        try:
            import knapformer
        except ImportError as error:
            print("ImportError:", error)
        print("extension loaded:", "knapformer._C" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=f"{folder}{os.pathsep}{package_parent}")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=60, cwd=folder)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_another_torch_release_is_refused_before_the_extension_loads(tmp_path):
    fake_torch(tmp_path, "9.9.0")
    out = import_under(tmp_path)
    built = knapformer.build_info["torch"]
    assert f"was built against torch {built}" in out
    assert "this interpreter has torch 9.9.0" in out
    assert "torch releases differ" in out
    assert "Rebuild it for this torch:" in out
    assert ("scripts/build_wheel.sh" if knapformer.build_info["built_by"] == "bazel"
            else "--no-build-isolation") in out
    assert "extension loaded: False" in out


def test_another_abi_of_the_same_release_is_refused(tmp_path):
    fake_torch(tmp_path, torch.__version__, abi=not torch._C._GLIBCXX_USE_CXX11_ABI)
    out = import_under(tmp_path)
    assert "C++ string ABIs differ" in out and "extension loaded: False" in out


def test_a_source_tree_without_a_build_says_how_to_install(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(os.path.join(PACKAGE_PARENT, "knapformer"), source / "knapformer",
                    ignore=shutil.ignore_patterns("_build_info.py", "_C*.so", "__pycache__"))
    out = import_under(tmp_path, package_parent=source)
    assert "this is a source tree, not a built package" in out
    assert "pip install --no-build-isolation" in out
    assert "extension loaded: False" in out
