"""The knapformer Python package, built against the installing interpreter's torch:

    python3 -m pip install --no-build-isolation .

(--no-build-isolation: the extension is C++ compiled against the torch your
trainer runs, which only the environment pip runs in has.) What it needs and
how it is found: python/pip_configure.py and docs/python.md; the Bazel build
stays the development build and compiles the same files (both take them from
python/extension_sources.bzl).
"""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "python"))

import package_facts  # noqa: E402 (python/, put on the path above)
import pip_configure  # noqa: E402


def fail(error):
    sys.exit(f"\nknapformer: cannot build the extension: {error}\n")


try:
    FACTS = pip_configure.torch_facts()
    pip_configure.check_torch(FACTS)
    SYSTEM = pip_configure.system_libraries()
    CUDA = pip_configure.cuda_libraries(FACTS)
except pip_configure.ConfigureError as error:
    fail(error)

from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402


class BuildInfo(build_py):
    """Writes knapformer/_build_info.py (what it was built against) beside
    the package's sources."""

    def run(self):
        super().run()
        path = os.path.join(self.build_lib, "knapformer", "_build_info.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(package_facts.build_info_source(
                FACTS["full_version"], FACTS["cuda"], FACTS["cxx11_abi"],
                f"{sys.version_info.major}.{sys.version_info.minor}", CUDA is not None, "pip"))


class BuildWithProtos(BuildExtension):
    """Compiles the .proto files (protoc + grpc_cpp_plugin) into the build
    folder first; their C++ joins the extension's sources."""

    def build_extensions(self):
        try:
            tools, env, protoc_version = pip_configure.find_tools(SYSTEM)
        except pip_configure.ConfigureError as error:
            fail(error)
        generated = os.path.join(os.path.abspath(self.build_temp), "knapformer_protos")
        os.makedirs(generated, exist_ok=True)
        includes = [f"-I{os.path.join(ROOT, d)}" for d in pip_configure.PROTO_PATHS] + \
            [f"-I{d}" for d in SYSTEM.include_dirs]
        grpc = [f"--grpc_out={generated}",
                f"--plugin=protoc-gen-grpc={tools['grpc_cpp_plugin']}"]
        sources = []
        for proto in pip_configure.PROTOS:
            wants_grpc = proto in pip_configure.GRPC_PROTOS
            command = [tools["protoc"], *includes, f"--cpp_out={generated}",
                       *(grpc if wants_grpc else []), os.path.join(ROOT, proto)]
            print(f"knapformer: {protoc_version}: {' '.join(command)}", flush=True)
            status = subprocess.run(command, env=env).returncode
            if status != 0:
                fail(f"protoc exited {status} on {' '.join(command)}")
            base = pip_configure.proto_import_path(proto)[:-len(".proto")]
            sources += [os.path.join(generated, base + ext)
                        for ext in (".pb.cc", ".grpc.pb.cc")[:2 if wants_grpc else 1]]
        for extension in self.extensions:
            extension.sources += sources
            extension.include_dirs.append(generated)
        super().build_extensions()
        self.build_command_line(self.extensions[0])

    def build_command_line(self, ext):
        """The `knapformer` command (serve, plan, simulate, calibrate, token)
        beside the extension, as knapformer/bin/knapformer: its own files
        compiled as the extension's are, linked with the extension's objects
        of the rooms it needs (python/extension_sources.bzl); the console
        script `knapformer` (knapformer/cli.py) runs it."""
        rooms = tuple(f"{room}/" for room in pip_configure.COMMAND_LINE_ROOMS)
        generated = os.path.join(os.path.abspath(self.build_temp), "knapformer_protos")
        reused = [source for source in ext.sources
                  if source.startswith(rooms) or source.startswith(generated)]
        objects = self.compiler.object_filenames(reused, output_dir=self.build_temp)
        objects += self.compiler.compile(
            pip_configure.COMMAND_LINE_SOURCES, output_dir=self.build_temp,
            macros=ext.define_macros, include_dirs=ext.include_dirs,
            extra_postargs=ext.extra_compile_args,
            depends=pip_configure.COMMAND_LINE_HEADERS + pip_configure.HEADERS)
        folder = os.path.join(os.path.dirname(self.get_ext_fullpath(ext.name)), "bin")
        os.makedirs(folder, exist_ok=True)
        # The system libraries only: the command needs neither torch nor CUDA.
        self.compiler.link_executable(
            objects, "knapformer", output_dir=folder,
            extra_postargs=SYSTEM.link_args + SYSTEM.rpaths(), target_lang="c++")


def extension():
    flags = [SYSTEM] + ([CUDA] if CUDA else [])
    sources = pip_configure.SOURCES + (pip_configure.CUDA_SOURCES if CUDA else [])
    headers = pip_configure.HEADERS + (pip_configure.CUDA_HEADERS if CUDA else [])
    include_dirs = [ROOT] + [d for f in flags for d in f.include_dirs]
    pybind11 = FACTS["pybind11_include"]
    if pybind11 not in FACTS["includes"] and pybind11 != "/usr/include":
        include_dirs.append(pybind11)
    macros = [m for f in flags for m in f.define_macros] + [
        ("USE_DISTRIBUTED", None),
        ("KNAPFORMER_BUILT_TORCH_VERSION", f'"{FACTS["full_version"]}"'),
    ]
    # -g0: debug information would make the objects ten times larger and the
    # build slower; -O2 as Bazel's -c opt wheel.
    compile_args = pip_configure.cxx_standard(FACTS) + ["-O2", "-g0"] + \
        [a for f in flags for a in f.compile_args]
    link_args = [a for f in flags for a in f.link_args] + \
        [r for f in flags for r in f.rpaths()] + pip_configure.EXTENSION_LINK_ARGS
    return CppExtension(
        "knapformer._C",
        sources=sources,
        depends=headers + pip_configure.PROTOS,
        include_dirs=include_dirs,
        define_macros=macros,
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )


with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as readme:
    LONG_DESCRIPTION = readme.read()

setup(
    name=package_facts.NAME,
    version=package_facts.version(),
    description="Online load balancing of sequences for distributed transformer training "
                "(KnapFormer), with a gRPC planner service",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    python_requires=f"=={sys.version_info.major}.{sys.version_info.minor}.*",
    packages=["knapformer", "knapformer.gpu_check"],
    package_dir={"": "python"},
    ext_modules=[extension()],
    install_requires=[f"torch{package_facts.torch_specifier(FACTS['full_version'])}"],
    extras_require={"plot": ["matplotlib"]},
    cmdclass={"build_ext": BuildWithProtos, "build_py": BuildInfo},
    entry_points={"console_scripts": [package_facts.CONSOLE_SCRIPT]},
    zip_safe=False,
)
