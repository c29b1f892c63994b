"""python/pip_configure.py and setup.py refuse, before anything compiles,
what the pip build cannot work with, naming the package to install or the
torch to use; and find what it needs on this machine."""
import os
import subprocess
import sys

import pytest

import pip_configure
from pip_configure import ConfigureError

GOOD = {"version": "2.6.0", "full_version": "2.6.0+cu124", "file": "/site/torch",
        "cxx11_abi": True, "distributed": True, "pybind11_include": "/site/torch/include",
        "cuda": None, "pip_nccl": None, "includes": []}


def facts(**changes):
    return dict(GOOD, **changes)


def test_a_usable_torch_passes():
    pip_configure.check_torch(facts())


@pytest.mark.parametrize("changes, words", [
    ({"version": "1.12.1", "full_version": "1.12.1"}, ["older than 1.13"]),
    ({"cxx11_abi": False, "full_version": "2.5.1+cu124"},
     ["2.5.1+cu124", "old C++ string ABI", "pip torch >= 2.7"]),
    ({"distributed": False}, ["without torch.distributed"]),
    ({"pybind11_include": None}, ["no pybind11 headers", "pybind11-dev"]),
])
def test_an_unusable_torch_is_refused_with_its_cause(changes, words):
    with pytest.raises(ConfigureError) as refused:
        pip_configure.check_torch(facts(**changes))
    for word in words:
        assert word in str(refused.value)


def test_this_interpreters_torch_is_found_and_usable():
    found = pip_configure.torch_facts()
    import torch
    assert found["full_version"] == torch.__version__
    pip_configure.check_torch(found)


def test_system_libraries_come_from_pkg_config():
    flags = pip_configure.system_libraries()
    for library in ("-lgrpc++", "-lprotobuf", "-labsl_status", "-lprometheus-cpp-pull",
                    "-lgrpc++_reflection"):
        assert library in flags.link_args
    assert ("NOMINMAX", None) in flags.define_macros  # grpc++.pc's cflags


def test_a_missing_library_names_its_debian_package(tmp_path, monkeypatch):
    monkeypatch.setenv("PKG_CONFIG_LIBDIR", str(tmp_path))
    monkeypatch.delenv("PKG_CONFIG_PATH", raising=False)
    with pytest.raises(ConfigureError) as refused:
        pip_configure.system_libraries()
    message = str(refused.value)
    for word in ("grpc++", "libgrpc++-dev", "libprotobuf-dev", "libabsl-dev",
                 "prometheus-cpp-dev", "nlohmann-json3-dev", str(tmp_path)):
        assert word in message


def test_unpacked_packages_get_an_rpath(tmp_path):
    flags = pip_configure.Flags()
    flags.add_libs(f"-L{tmp_path}/usr/lib/x86_64-linux-gnu -lgrpc++ -L/usr/lib/x86_64-linux-gnu")
    assert flags.rpaths() == ["-Wl,--disable-new-dtags",
                              f"-Wl,-rpath,{tmp_path}/usr/lib/x86_64-linux-gnu"]
    assert flags.link_args[1] == "-lgrpc++"  # order kept


def test_an_unpacked_prefix_gets_its_multiarch_include_folder(tmp_path):
    prefix = tmp_path / "deps" / "usr" / "include"
    (prefix / "x86_64-linux-gnu" / "openssl").mkdir(parents=True)
    bare = tmp_path / "bare" / "usr" / "include"
    bare.mkdir(parents=True)
    flags = pip_configure.Flags()
    flags.add_cflags(f"-I{prefix} -I{bare} -I/usr/include")
    flags.add_multiarch_includes("x86_64-linux-gnu")
    assert flags.include_dirs == [str(prefix), str(bare), "/usr/include",
                                  str(prefix / "x86_64-linux-gnu")]


def test_a_missing_tool_names_its_package(monkeypatch):
    monkeypatch.setenv("KNAPFORMER_PROTOC", "/nonexistent/protoc")
    with pytest.raises(ConfigureError) as refused:
        pip_configure.find_tools(pip_configure.Flags())
    assert "protoc" in str(refused.value) and "protobuf-compiler" in str(refused.value)


def test_tools_are_found_and_run():
    tools, _, version = pip_configure.find_tools(pip_configure.system_libraries())
    assert os.path.basename(tools["protoc"]) == "protoc" and version.startswith("libprotoc")
    assert os.path.basename(tools["grpc_cpp_plugin"]) == "grpc_cpp_plugin"


def test_cuda_parts_only_with_a_cuda_torch(monkeypatch):
    assert pip_configure.cuda_libraries(facts()) is None
    monkeypatch.setenv("KNAPFORMER_NCCL", "0")
    assert pip_configure.cuda_libraries(facts(cuda="12.4")) is None


def test_a_cuda_torch_without_its_toolkit_is_refused(monkeypatch, tmp_path):
    for name in ("CUDA_HOME", "CUDA_PATH", "KNAPFORMER_CUDA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KNAPFORMER_NCCL", "1")
    with pytest.raises(ConfigureError) as refused:
        pip_configure.cuda_libraries(facts(cuda="99.1", file=str(tmp_path / "torch")))
    message = str(refused.value)
    assert "CUDA 99.1" in message and "CUDA_HOME" in message and "KNAPFORMER_NCCL=0" in message


def test_a_toolkit_of_the_torchs_cuda_major_is_used(monkeypatch, tmp_path):
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    (home / "lib64").mkdir()
    (home / "include" / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 12040\n")
    (home / "lib64" / "libcudart.so").write_text("")
    nccl = tmp_path / "nccl"
    (nccl / "include").mkdir(parents=True)
    (nccl / "lib").mkdir()
    (nccl / "include" / "nccl.h").write_text("")
    (nccl / "lib" / "libnccl.so.2").write_text("")  # as pip's nvidia-nccl ships it
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("KNAPFORMER_NCCL", "1")
    flags = pip_configure.cuda_libraries(facts(cuda="12.4", pip_nccl=str(nccl)))
    assert str(home / "include") in flags.include_dirs
    assert flags.link_args == [f"-L{home}/lib64", "-lcudart", f"-L{nccl}/lib", "-l:libnccl.so.2"]
    assert ("KNAPFORMER_HAVE_NCCL", None) in flags.define_macros
    # A toolkit of another CUDA major is not that torch's: refused (no CUDA
    # 11 anywhere here; /usr/local/cuda may well be a 13).
    with pytest.raises(ConfigureError, match="CUDA 11.8"):
        pip_configure.cuda_libraries(facts(cuda="11.8", pip_nccl=str(nccl),
                                           file=str(tmp_path / "torch")))


def test_old_torch_gets_cxx17():
    assert pip_configure.cxx_standard(facts(version="1.13.0a0")) == ["-std=c++17"]
    assert pip_configure.cxx_standard(facts()) == []


def _exported_ostream_double(tmp_path, link_args):
    """Whether a shared object linked with libstdc++ statically exports
    std::ostream's double output (_ZNSo9_M_insertIdEERSoT_)."""
    source = tmp_path / "uses_ostream.cc"
    source.write_text("#include <sstream>\n#include <string>\n"
                      "std::string show(double x) { std::ostringstream o; o << x; "
                      "return o.str(); }\n")
    library = tmp_path / f"uses_ostream{len(link_args)}.so"
    compiler = os.environ.get("CXX", "g++")
    built = subprocess.run([compiler, "-shared", "-fPIC", "-static-libstdc++", str(source),
                            "-o", str(library)] + link_args,
                           capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        pytest.skip(f"{compiler} cannot link libstdc++ statically here: {built.stderr[-300:]}")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    return "_ZNSo9_M_insertIdEERSoT_" in symbols


def test_a_static_libstdcxx_stays_inside_the_extension(tmp_path):
    # A toolchain that links libstdc++ statically exports its symbols from
    # the extension, where they shadow the libstdc++.so of the libraries the
    # extension loads (prometheus-cpp crashed in them on a GPU machine).
    if not _exported_ostream_double(tmp_path, []):
        pytest.skip("this toolchain's static libstdc++ exports nothing to hide")
    assert not _exported_ostream_double(tmp_path, pip_configure.EXTENSION_LINK_ARGS)
    setup_py = open("setup.py", encoding="utf-8").read()
    assert "pip_configure.EXTENSION_LINK_ARGS" in setup_py


def run_setup(*args, env=None, prelude=""):
    """setup.py as pip runs it (metadata query), in a fresh interpreter."""
    code = (prelude + "import runpy, sys; sys.argv = ['setup.py', '--name']; "
            "runpy.run_path('setup.py', run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, cwd=os.getcwd())


def test_setup_refuses_at_configure_time_naming_the_package(tmp_path):
    env = dict(os.environ, PKG_CONFIG_LIBDIR=str(tmp_path))
    env.pop("PKG_CONFIG_PATH", None)
    result = run_setup(env=env)
    assert result.returncode != 0
    assert "knapformer: cannot build the extension: pkg-config finds no grpc++" in result.stderr
    assert "apt-get install" in result.stderr


def test_setup_without_torch_says_no_build_isolation():
    # An isolated build environment (pip's pip-build-env-* on the path) has
    # no torch: the import fails, and the same interpreter will do.
    result = run_setup(prelude="import sys; sys.modules['torch'] = None; "
                               "sys.path.append('/tmp/pip-build-env-x1/overlay'); ")
    assert result.returncode != 0
    assert "cannot import torch" in result.stderr and "isolated environment" in result.stderr
    assert f"{sys.executable} -m pip install --no-build-isolation ." in result.stderr


def test_setup_on_an_interpreter_without_torch_names_the_rule_not_itself():
    # A pyenv shim's python3 without torch: running pip with it again would
    # fail again, so the suggestion is another interpreter (here none other
    # of the usual ones has torch, or it is this one).
    result = run_setup(prelude="import sys; sys.modules['torch'] = None; ")
    assert result.returncode != 0
    assert "pip builds knapformer against the interpreter that runs it, and this one has no " \
        "torch" in result.stderr, result.stderr
    assert f"{sys.executable} -m pip" not in result.stderr, result.stderr
    assert "-m pip install --no-build-isolation ." in result.stderr


def test_setup_answers_metadata_on_this_machine():
    result = run_setup()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "knapformer"
