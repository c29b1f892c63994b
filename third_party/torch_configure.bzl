"""@local_torch: the torch, CPython and pybind11 of one interpreter, found, not hard-coded.

The interpreter is --repo_env=KNAPFORMER_PYTHON (default /usr/bin/python3).
third_party/torch_probe.py asks it for torch's include and library folders
(torch.utils.cpp_extension, right for Debian's and pip's layouts alike), the
C++ string ABI, the pybind11 headers and registry names torch was built
with, CPython's headers and the wheel's tag. What cannot work is refused
here, when the build is configured, with the cause and the way out: never
as an import-time crash. Only torch-facing targets reach this repository,
so the planner, the server and the CLI build without torch.

The repository holds:
  :torch         LibTorch with c10d and Gloo (headers, defines, link flags)
  :torch_python  plus torch's Python bindings, CPython and pybind11
  defs.bzl       PYTHON, PYTHON_VERSION, WHEEL_TAG, TORCH_VERSION, TORCH_CUDA
  probe.json     what the probe answered (for docs and debugging)
"""

_DEFAULT_PYTHON = "/usr/bin/python3"
_ENV_PYTHON = "KNAPFORMER_PYTHON"

# The oldest torch this code is written for (Debian bookworm's).
_MIN_TORCH = (1, 13)

# Folders the compiler searches without being told; a header folder that is
# only a set of links into one of them needs no flag (Debian's torch/include).
SYSTEM_INCLUDE = "/usr/include"

def _fail(python, message):
    fail("\n[knapformer torch_configure] interpreter %s (set it with " % python +
         "--repo_env=%s=/path/to/python3):\n  %s\n" % (_ENV_PYTHON, message))

def _version_tuple(text):
    parts = []
    for piece in text.split(".")[:2]:
        digits = ""
        for c in piece.elems():
            if not c.isdigit():
                break
            digits += c
        parts.append(int(digits) if digits else 0)
    return tuple(parts)

def probe_interpreter(repository_ctx):
    """Runs torch_probe.py under the configured interpreter; returns (python, facts)."""
    python = repository_ctx.os.environ.get(_ENV_PYTHON, _DEFAULT_PYTHON)
    if not python.startswith("/"):
        found = repository_ctx.which(python)
        if found == None:
            _fail(python, "not found on PATH; give an absolute path")
        python = str(found)
    if not repository_ctx.path(python).exists:
        _fail(python, "no such file")
    probe = repository_ctx.path(Label("//third_party:torch_probe.py"))
    result = repository_ctx.execute([python, str(probe)], timeout = 120, quiet = True)
    marker = "KNAPFORMER_PROBE "
    lines = [line for line in result.stdout.splitlines() if line.startswith(marker)]
    if result.return_code != 0 or not lines:
        _fail(python, "could not run %s (exit %d): %s" %
                      (probe, result.return_code, (result.stderr or result.stdout).strip()))
    return python, json.decode(lines[-1][len(marker):])

def _links_into_system(repository_ctx, folder):
    # True when every entry of `folder` is a link to the same name in
    # /usr/include: Debian's .../torch/include, which would otherwise make
    # Bazel declare (and sandbox) 8000 headers it already finds.
    entries = repository_ctx.path(folder).readdir()
    if not entries:
        return False
    for entry in entries:
        target = repository_ctx.execute(["readlink", "-f", str(entry)]).stdout.strip()
        if target != SYSTEM_INCLUDE + "/" + entry.basename:
            return False
    return True

def header_folders(repository_ctx, folders, prefix):
    """Links each folder into the repository, but for the system's; returns
    (globs, includes) for a cc_library of their headers."""
    globs, includes = [], []
    for i, folder in enumerate(folders):
        if folder == SYSTEM_INCLUDE or _links_into_system(repository_ctx, folder):
            continue
        name = "%s_%d" % (prefix, i)
        repository_ctx.symlink(folder, name)
        globs.append(name + "/**")
        includes.append(name)
    return globs, includes

def _check(python, facts):
    torch = facts["torch"]
    if torch == None:
        _fail(python, "cannot import torch (%s). Install it (bash scripts/setup.sh installs " %
                      facts["torch_error"] +
                      "Debian's python3-torch for /usr/bin/python3) or build for an " +
                      "interpreter that has it")
    if _version_tuple(torch["version"]) < _MIN_TORCH:
        _fail(python, "torch %s is older than %d.%d, the oldest this code is written for" %
                      (torch["full_version"], _MIN_TORCH[0], _MIN_TORCH[1]))
    if not torch["cxx11_abi"]:
        _fail(python, ("torch %s (%s) was built with the old C++ string ABI " +
                       "(torch._C._GLIBCXX_USE_CXX11_ABI is False: pip wheels of torch " +
                       "2.4-2.6 other than the cu126 builds). knapformer links the system's " +
                       "gRPC, protobuf and Abseil, built with the new ABI, and the two cannot " +
                       "share C++ types. Use a torch built with the new ABI: pip torch >= 2.7, " +
                       "Debian's python3-torch, or an NGC container's torch.") %
                      (torch["full_version"], torch["file"]))
    if not torch["distributed"] or not torch["gloo"]:
        _fail(python, "torch %s was built without torch.distributed or without Gloo; " %
                      torch["full_version"] +
                      "the client's exchanges need c10d with Gloo (NCCL on GPUs)")
    if torch["pybind11_include"] == None:
        _fail(python, "no pybind11 headers: torch %s ships none and neither the pybind11 " %
                      torch["full_version"] +
                      "module nor /usr/include/pybind11 exists (apt-get install pybind11-dev)")

def _torch_configure_impl(repository_ctx):
    python, facts = probe_interpreter(repository_ctx)
    _check(python, facts)
    torch = facts["torch"]
    py = facts["python"]

    torch_globs, torch_includes = header_folders(
        repository_ctx,
        torch["includes"],
        "torch_include",
    )
    extra = [py["include"]]
    if torch["pybind11_include"] not in torch["includes"]:
        extra.append(torch["pybind11_include"])
    python_globs, python_includes = header_folders(repository_ctx, extra, "python_include")

    link_dirs = []
    for folder in torch["library_dirs"]:
        link_dirs += ["-L" + folder, "-Wl,-rpath," + folder]

    # Registry names as torch._C has them, so that the extension's pybind11
    # shares torch's type registry (ProcessGroup objects convert).
    pybind_defines = []
    for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = torch["pybind11"][name]
        if value:
            # Quoted for the shell-like tokenizing Bazel gives defines.
            pybind_defines.append('PYBIND11_%s=\\"%s\\"' % (name, value))

    repository_ctx.file("BUILD.bazel", """# Made by //third_party:torch_configure.bzl
# for {python}: torch {torch}.
package(default_visibility = ["//visibility:public"])

exports_files(["probe.json"])

cc_library(
    name = "torch",
    hdrs = glob({torch_globs}, allow_empty = True),
    includes = {torch_includes},
    defines = ["USE_C10D_GLOO", "USE_DISTRIBUTED"],
    linkopts = {link_dirs} + ["-ltorch", "-ltorch_cpu", "-lc10", "-lpthread"],
)

cc_library(
    name = "torch_python",
    hdrs = glob({python_globs}, allow_empty = True),
    includes = {python_includes},
    defines = {pybind_defines},
    linkopts = ["-ltorch_python"],
    deps = [":torch"],
)
""".format(
        python = python,
        torch = torch["full_version"],
        torch_globs = repr(torch_globs),
        torch_includes = repr(torch_includes),
        link_dirs = repr(link_dirs),
        python_globs = repr(python_globs),
        python_includes = repr(python_includes),
        pybind_defines = repr(pybind_defines),
    ))

    tag = "%s-%s-%s" % (py["abi_tag"], py["abi_tag"], py["platform_tag"])
    repository_ctx.file("defs.bzl", """# Made by //third_party:torch_configure.bzl.
PYTHON = "{python}"
PYTHON_VERSION = "{python_version}"
WHEEL_TAG = "{tag}"
TORCH_VERSION = "{torch}"
TORCH_CUDA = {cuda}
""".format(
        python = python,
        python_version = py["version"],
        tag = tag,
        torch = torch["full_version"],
        cuda = repr(torch["cuda"]),
    ))
    repository_ctx.file("probe.json", json.encode_indent(facts) + "\n")

torch_configure = repository_rule(
    implementation = _torch_configure_impl,
    environ = [_ENV_PYTHON],
    local = True,
    configure = True,
)
