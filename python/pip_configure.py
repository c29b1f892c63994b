"""How `pip install --no-build-isolation .` finds what the extension needs.

setup.py (the repository's root) builds knapformer._C with setuptools and
torch.utils.cpp_extension against the torch of the interpreter that runs
pip. This module decides everything before anything compiles, and refuses,
naming the package to install or the torch to use, what cannot work:
  - torch: importable, >= 1.13, built with torch.distributed, and with the
    new C++ string ABI (the system's gRPC, protobuf and Abseil use it), as
    third_party/torch_configure.bzl refuses for the Bazel build;
  - gRPC, protobuf, Abseil, prometheus-cpp and nlohmann-json: from their own
    pkg-config files (PKG_CONFIG_PATH / PKG_CONFIG_LIBDIR and
    PKG_CONFIG_SYSROOT_DIR point at unpacked packages, docs/development.md);
    protoc and grpc_cpp_plugin from PATH, or KNAPFORMER_PROTOC and
    KNAPFORMER_GRPC_CPP_PLUGIN;
  - with a CUDA torch, the raw NCCL transport: the CUDA runtime's headers
    (CUDA_HOME, torch's CUDA_HOME, pip's nvidia-* packages, /usr) of the
    torch's CUDA major, and the NCCL that torch loads (pip's nvidia-nccl, else
    the system's; KNAPFORMER_NCCL_HOME). KNAPFORMER_NCCL=0 builds without it.

SOURCES and the lists beside it are python/extension_sources.bzl's, the files
Bazel's //python:knapformer/_C.so is built from too, so the two builds cannot
drift apart.
"""
import ast
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))



def _extension_sources():
    """python/extension_sources.bzl's lists: the files Bazel builds the
    extension from too (its assignments are literal lists and dicts)."""
    path = os.path.join(ROOT, "python", "extension_sources.bzl")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    lists = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            lists[node.targets[0].id] = ast.literal_eval(node.value)
    return lists


_LISTS = _extension_sources()
# The extension's C++ sources and headers; the raw NCCL transport's, with a
# CUDA torch (Bazel: --config=cuda).
SOURCES = _LISTS["SOURCES"]
HEADERS = _LISTS["HEADERS"]
CUDA_SOURCES = _LISTS["CUDA_SOURCES"]
CUDA_HEADERS = _LISTS["CUDA_HEADERS"]
# The `knapformer` command: these, linked with the extension's objects of
# the rooms COMMAND_LINE_ROOMS (setup.py).
COMMAND_LINE_SOURCES = _LISTS["COMMAND_LINE_SOURCES"]
COMMAND_LINE_HEADERS = _LISTS["COMMAND_LINE_HEADERS"]
COMMAND_LINE_ROOMS = _LISTS["COMMAND_LINE_ROOMS"]
# Compiled with protoc, and grpc_cpp_plugin for GRPC_PROTOS.
PROTOS = sorted(_LISTS["PROTOS"])
GRPC_PROTOS = _LISTS["GRPC_PROTOS"]
# protoc's import folders, as Bazel's (proto/proto_cc.bzl): the service's
# API relative to proto/, every other .proto relative to the repository root.
PROTO_PATHS = ["proto", "."]


def proto_import_path(proto):
    """The path protoc imports `proto` (a repository path) by, and its
    generated files are named after."""
    return proto[len("proto/"):] if proto.startswith("proto/") else proto


# pkg-config modules, and the Debian package that ships each (Bazel's
# //third_party targets link the same).
PKG_CONFIG_MODULES = [
    ("grpc++", "libgrpc++-dev"),
    ("protobuf", "libprotobuf-dev"),
    ("absl_status", "libabsl-dev"),
    ("absl_statusor", "libabsl-dev"),
    ("absl_strings", "libabsl-dev"),
    ("absl_str_format", "libabsl-dev"),
    ("absl_synchronization", "libabsl-dev"),
    ("absl_time", "libabsl-dev"),
    ("prometheus-cpp-pull", "prometheus-cpp-dev"),
    ("prometheus-cpp-core", "prometheus-cpp-dev"),
    ("nlohmann_json", "nlohmann-json3-dev"),
    ("libcrypto", "libssl-dev"),
]
# Libraries without a pkg-config file, found beside the ones above.
PLAIN_LIBRARIES = [("grpc++_reflection", "libgrpc++-dev")]
TOOLS = [
    ("protoc", "KNAPFORMER_PROTOC", "protobuf-compiler"),
    ("grpc_cpp_plugin", "KNAPFORMER_GRPC_CPP_PLUGIN", "protobuf-compiler-grpc"),
]
MIN_TORCH = (1, 13)
# Folders the dynamic linker searches anyway (no rpath for them), in the order
# the build looks for a library without a pkg-config file there.
_SYSTEM_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib", "/lib/x86_64-linux-gnu", "/lib",
                        "/usr/lib64", "/lib64")


class ConfigureError(Exception):
    """What cannot work, and what to do about it."""


def _probe_module():
    import importlib.util
    path = os.path.join(ROOT, "third_party", "torch_probe.py")
    spec = importlib.util.spec_from_file_location("knapformer_torch_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_facts():
    """third_party/torch_probe.py's facts about this interpreter's torch
    (the same the Bazel build reads)."""
    try:
        return _probe_module().torch_facts()
    except ImportError as error:
        if any("pip-build-env-" in path for path in sys.path):
            raise ConfigureError(
                f"cannot import torch in {sys.executable} ({error}): pip built in an isolated "
                "environment, which has no torch (or another one). Build against the "
                "interpreter's own torch with pip's --no-build-isolation:\n"
                f"  {sys.executable} -m pip install --no-build-isolation .") from None
        # The rule: pip builds against the interpreter that runs it. Suggest
        # one that has torch, never this one again.
        found = _interpreter_with_torch()
        venv = sys.prefix != sys.base_prefix
        raise ConfigureError(
            f"cannot import torch in {sys.executable} ({error}): pip builds knapformer against "
            "the interpreter that runs it, and this one has no torch (a shell's python3 can be "
            "another interpreter than the trainer's: a pyenv shim, a conda base"
            + ("; and a venv sees its base interpreter's torch only when made with "
               "--system-site-packages" if venv else "")
            + "). Run pip with the interpreter of your trainer's torch"
            + (f" ({found} has torch)" if found else
               " (in the trainer's environment, python3 -c 'import sys, torch; "
               "print(sys.executable)' prints it)")
            + f":\n  {found or '<the trainer python3>'} -m pip install --no-build-isolation ."
        ) from None


def _interpreter_with_torch():
    """The first of the usual interpreters (a venv's base, the system's),
    other than this one, that imports torch; None when none does. A venv's
    python links to its base interpreter, which is another one here: it
    sees other packages."""
    here = os.path.realpath(sys.executable) if sys.prefix == sys.base_prefix else None
    base = os.path.join(sys.base_prefix, "bin", "python3")
    for candidate in dict.fromkeys((base, "/usr/bin/python3", "/usr/local/bin/python3")):
        if not os.path.exists(candidate) or os.path.realpath(candidate) == here:
            continue
        try:
            probe = subprocess.run([candidate, "-c", "import torch"], capture_output=True,
                                   timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return candidate
    return None


def _version_tuple(text):
    parts = re.findall(r"\d+", text)[:2]
    return tuple(int(p) for p in parts) + (0,) * (2 - len(parts))


def check_torch(facts):
    """Refuses a torch the extension cannot be built against (the checks of
    third_party/torch_configure.bzl)."""
    name = f"torch {facts['full_version']} ({facts['file']})"
    if _version_tuple(facts["version"]) < MIN_TORCH:
        raise ConfigureError(f"{name} is older than {MIN_TORCH[0]}.{MIN_TORCH[1]}, the oldest "
                             "this code is written for")
    if not facts["cxx11_abi"]:
        raise ConfigureError(
            f"{name} was built with the old C++ string ABI (torch._C._GLIBCXX_USE_CXX11_ABI is "
            "False: pip wheels of torch 2.4-2.6 other than the cu126 builds). knapformer links "
            "the system's gRPC, protobuf and Abseil, built with the new ABI, and the two "
            "cannot share C++ types. Use a torch built with the new ABI: pip torch >= 2.7, "
            "Debian's python3-torch, or an NGC container's torch.")
    if not facts["distributed"]:
        raise ConfigureError(f"{name} was built without torch.distributed; the client's "
                             "exchanges need c10d (Gloo on CPU, NCCL on GPUs)")
    if facts["pybind11_include"] is None:
        raise ConfigureError(f"no pybind11 headers: {name} ships none and neither the pybind11 "
                             "module nor /usr/include/pybind11 exists (Debian: apt-get install "
                             "pybind11-dev; pip: pip install pybind11)")


def _pkg_config_program():
    for name in (os.environ.get("PKG_CONFIG"), "pkg-config", "pkgconf"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise ConfigureError("pkg-config is missing (Debian: apt-get install pkgconf; or carry it "
                         "with the other packages: docs/development.md)")


def _run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    return result.returncode, result.stdout.strip(), result.stderr.strip()


class Flags:
    """Compiler and linker flags gathered from pkg-config and the probes."""

    def __init__(self):
        self.include_dirs = []
        self.define_macros = []
        self.compile_args = []
        self.link_args = []
        self.library_dirs = []

    def add_cflags(self, text):
        for flag in text.split():
            if flag.startswith("-I"):
                if flag[2:] not in self.include_dirs:
                    self.include_dirs.append(flag[2:])
            elif flag.startswith("-D"):
                name, _, value = flag[2:].partition("=")
                macro = (name, value or None)
                if macro not in self.define_macros:
                    self.define_macros.append(macro)
            elif flag not in self.compile_args:
                self.compile_args.append(flag)

    def add_multiarch_includes(self, triplet):
        """Beside each include folder of an unpacked prefix (<prefix>/usr/include),
        its <triplet> subfolder where there is one: the compiler searches
        /usr/include/<triplet> by itself (libssl-dev's opensslconf.h lies
        there), but not that folder under an unpacked prefix."""
        if not triplet:
            return
        for folder in list(self.include_dirs):
            beside = os.path.join(folder, triplet)
            if (os.path.realpath(folder) != "/usr/include" and folder.endswith("/usr/include")
                    and os.path.isdir(beside) and beside not in self.include_dirs):
                self.include_dirs.append(beside)

    def add_libs(self, text):
        # Kept in order (--push-state ... --pop-state pairs, static orders).
        for flag in text.split():
            if flag.startswith("-L") and flag[2:] not in self.library_dirs:
                self.library_dirs.append(flag[2:])
            self.link_args.append(flag)

    def private_library_dirs(self):
        """The library folders the dynamic linker does not search by itself
        (an unpacked prefix)."""
        return [d for d in self.library_dirs if os.path.realpath(d) not in _SYSTEM_LIBRARY_DIRS]

    def rpaths(self):
        """The private library folders, so that the installed extension finds
        the libraries it was linked with there without LD_LIBRARY_PATH. As
        DT_RPATH, not DT_RUNPATH: RUNPATH serves only the extension's own
        dependencies, RPATH theirs too (libgrpc++ needs libgrpc, Abseil,
        c-ares, ... from the same folder)."""
        folders = self.private_library_dirs()
        if not folders:
            return []
        return ["-Wl,--disable-new-dtags"] + [f"-Wl,-rpath,{d}" for d in folders]


def system_libraries():
    """Flags for gRPC, protobuf, Abseil, prometheus-cpp and nlohmann-json."""
    program = _pkg_config_program()
    missing = [(module, package) for module, package in PKG_CONFIG_MODULES
               if _run([program, "--exists", module])[0] != 0]
    if missing:
        packages = sorted({package for _, package in missing})
        where = os.environ.get("PKG_CONFIG_LIBDIR") or os.environ.get("PKG_CONFIG_PATH") or \
            "pkg-config's default folders"
        raise ConfigureError(
            f"pkg-config finds no {', '.join(m for m, _ in missing)} (searched: {where}). "
            f"Install {' '.join(packages)} (Debian/Ubuntu: apt-get install {' '.join(packages)}), "
            "or point PKG_CONFIG_PATH and PKG_CONFIG_SYSROOT_DIR at unpacked packages "
            "(docs/development.md)")
    modules = [module for module, _ in PKG_CONFIG_MODULES]
    flags = Flags()
    for option, add in (("--cflags", flags.add_cflags), ("--libs", flags.add_libs)):
        code, out, err = _run([program, option] + modules)
        if code != 0:
            raise ConfigureError(f"pkg-config {option} {' '.join(modules)} failed: {err}")
        add(out)
    triplet = sysconfig.get_config_var("MULTIARCH") or \
        (f"{platform.machine()}-linux-gnu" if sys.platform.startswith("linux") else "")
    flags.add_multiarch_includes(triplet)
    for library, package in PLAIN_LIBRARIES:
        if not _find_library(library, flags.library_dirs + list(_SYSTEM_LIBRARY_DIRS)):
            raise ConfigureError(f"lib{library}.so is missing (install {package})")
        flags.link_args.append(f"-l{library}")
    return flags


def _find_library(name, folders):
    for folder in folders:
        if glob.glob(os.path.join(folder, f"lib{name}.so*")):
            return folder
    return None


def find_tools(flags):
    """protoc and grpc_cpp_plugin, and the environment that runs them (the
    library folders found above on LD_LIBRARY_PATH: tools unpacked from
    packages link libprotoc there)."""
    found = {}
    for name, variable, package in TOOLS:
        path = os.environ.get(variable) or shutil.which(name)
        if not path or not os.access(path, os.X_OK):
            raise ConfigureError(f"{name} is missing (install {package}; or set {variable} to "
                                 "its path)")
        found[name] = path
    env = dict(os.environ)
    extra = flags.private_library_dirs()
    if extra:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            extra + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    code, out, err = _run([found["protoc"], "--version"], env=env)
    if code != 0:
        raise ConfigureError(f"{found['protoc']} does not run: {err or out}")
    return found, env, out


def _cuda_homes(facts):
    homes = [os.environ.get("KNAPFORMER_CUDA_HOME"), os.environ.get("CUDA_HOME"),
             os.environ.get("CUDA_PATH")]
    try:
        from torch.utils import cpp_extension
        homes.append(cpp_extension.CUDA_HOME)
    except Exception:  # an old setuptools, no toolkit: the other places remain
        pass
    site = os.path.dirname(facts["file"])
    # pip's CUDA wheels: nvidia/cuda_runtime (CUDA 12) or nvidia/cu13 (13).
    homes += sorted(glob.glob(os.path.join(site, "nvidia", "cu*"))) + \
        [os.path.join(site, "nvidia", "cuda_runtime"), "/usr/local/cuda", "/usr"]
    seen = []
    for home in homes:
        if home and home not in seen:
            seen.append(home)
    return seen


def _cuda_version(include):
    try:
        with open(os.path.join(include, "cuda_runtime_api.h"), encoding="utf-8") as f:
            match = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    except OSError:
        return None
    if match is None:
        return None
    number = int(match.group(1))
    return number // 1000, (number % 1000) // 10


def cuda_libraries(facts):
    """Flags for the raw NCCL transport, or None without a CUDA torch (or
    with KNAPFORMER_NCCL=0)."""
    if not facts["cuda"] or os.environ.get("KNAPFORMER_NCCL", "1") == "0":
        return None
    wanted = _version_tuple(facts["cuda"])
    flags = Flags()
    tried = []
    for home in _cuda_homes(facts):
        include = "/usr/include" if home == "/usr" else os.path.join(home, "include")
        version = _cuda_version(include)
        tried.append(f"{home} ({'CUDA %d.%d' % version if version else 'no cuda_runtime_api.h'})")
        if version is None or version[0] != wanted[0]:
            continue
        folders = _SYSTEM_LIBRARY_DIRS if home == "/usr" else \
            [os.path.join(home, sub) for sub in ("lib64", "lib", "targets/x86_64-linux/lib")]
        library = _find_library("cudart", folders)
        if library is None:
            tried[-1] += ", no libcudart.so"
            continue
        flags.include_dirs.append(include)
        flags.library_dirs.append(library)
        cudart = "-lcudart" if glob.glob(os.path.join(library, "libcudart.so")) else \
            f"-l:{os.path.basename(sorted(glob.glob(os.path.join(library, 'libcudart.so.*')))[0])}"
        flags.link_args += [f"-L{library}", cudart]
        break
    else:
        raise ConfigureError(
            f"torch {facts['full_version']} is built for CUDA {facts['cuda']}, but no CUDA "
            f"{wanted[0]}.x runtime headers and libcudart were found (tried: {'; '.join(tried)}). "
            "Set CUDA_HOME to the toolkit of that CUDA major (Debian: apt-get install "
            "nvidia-cuda-dev), or build without the raw NCCL transport: KNAPFORMER_NCCL=0")
    nccl_homes = [os.environ.get("KNAPFORMER_NCCL_HOME"), facts.get("pip_nccl"), "/usr"]
    for home in [h for h in nccl_homes if h]:
        include = "/usr/include" if home == "/usr" else os.path.join(home, "include")
        folders = _SYSTEM_LIBRARY_DIRS if home == "/usr" else [os.path.join(home, "lib")]
        library = _find_library("nccl", folders)
        if os.path.isfile(os.path.join(include, "nccl.h")) and library:
            if include not in flags.include_dirs:
                flags.include_dirs.append(include)
            # pip's nvidia-nccl has libnccl.so.2 only; torch has loaded it.
            nccl = "-lnccl" if os.path.exists(os.path.join(library, "libnccl.so")) else \
                "-l:libnccl.so.2"
            flags.library_dirs.append(library)
            flags.link_args += [f"-L{library}", nccl]
            flags.define_macros.append(("KNAPFORMER_HAVE_NCCL", None))
            return flags
    raise ConfigureError(
        f"torch {facts['full_version']} is a CUDA build, but no NCCL (nccl.h and libnccl.so) "
        "was found where it loads NCCL from (pip: the nvidia-nccl package beside torch; Debian: "
        "apt-get install libnccl-dev; or set KNAPFORMER_NCCL_HOME), or build without the raw "
        "NCCL transport: KNAPFORMER_NCCL=0")


# The extension exports none of the symbols of the static archives it was
# linked with. Some toolchains link libstdc++ statically into every shared
# object (the GPU machine's /opt/gcc g++ did): its std:: symbols, exported
# from _C.so, then served prometheus-cpp's calls in place of the
# libstdc++.so those libraries were built against, and the first scrape of
# /metrics crashed in std::ostream's double output (seen on torch 2.11 with
# bookworm's prometheus-cpp; docs/development.md).
EXTENSION_LINK_ARGS = ["-Wl,--exclude-libs,ALL"]


def cxx_standard(facts):
    """-std for torch releases whose cpp_extension default is older than
    the C++17 this code needs (1.x defaults to C++14); later ones choose
    their own (C++17, C++20 for the releases after 2.11)."""
    return ["-std=c++17"] if _version_tuple(facts["version"]) < (2, 0) else []
