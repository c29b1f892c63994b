"""@cuda: the CUDA runtime and NCCL the raw NCCL transport builds against, found.

Only targets under --config=cuda reach this repository, so a machine without
CUDA never evaluates it. Where they come from, first match:
  1. --repo_env=KNAPFORMER_CUDA_HOME or CUDA_HOME (a toolkit folder);
  2. when the build's interpreter (--repo_env=KNAPFORMER_PYTHON) has a CUDA
     torch, a toolkit of that torch's CUDA major version among the ones below;
  3. Debian's layout (/usr/include/cuda_runtime_api.h, nvidia-cuda-dev),
     /usr/local/cuda-13.0, /usr/local/cuda.
NCCL: with a CUDA torch, the NCCL that torch loads (a pip wheel's
nvidia-nccl, else the system's libnccl2), because two libnccl.so.2 of
different versions cannot share a process; else the toolkit's, then the
system's. KNAPFORMER_NCCL_HOME overrides. A CUDA torch whose CUDA major
differs from the toolkit's is refused here, naming both.

The repository holds :headers, :cudart and :nccl, and defs.bzl with
CUDA_VERSION and NCCL_HOME.
"""

load("//third_party:torch_configure.bzl", "SYSTEM_INCLUDE", "header_folders", "probe_interpreter")

_TOOLKITS = ["/usr", "/usr/local/cuda-13.0", "/usr/local/cuda"]
_SYSTEM_LIB = "/usr/lib/x86_64-linux-gnu"

def _fail(message):
    fail("\n[knapformer cuda_configure] %s\n" % message)

def _define(repository_ctx, header, name):
    # The value of `#define NAME value` in header, or None.
    if not repository_ctx.path(header).exists:
        return None
    for line in repository_ctx.read(header).splitlines():
        words = [w for w in line.replace("\t", " ").split(" ") if w]
        if len(words) >= 3 and words[0] == "#define" and words[1] == name:
            return words[2]
    return None

def _include_dir(home):
    return SYSTEM_INCLUDE if home == "/usr" else home + "/include"

def _lib_dirs(repository_ctx, home):
    if home == "/usr":
        return [_SYSTEM_LIB]
    found, real = [], []
    for sub in ["lib64", "lib", "targets/x86_64-linux/lib"]:
        folder = home + "/" + sub
        if not repository_ctx.path(folder).exists:
            continue
        target = repository_ctx.execute(["readlink", "-f", folder]).stdout.strip()
        if target not in real:  # lib64 is often a link to lib
            real.append(target)
            found.append(folder)
    return found

def _cuda_version(repository_ctx, home):
    # CUDART_VERSION, e.g. 12040, as (12, 4); None when home holds no toolkit.
    value = _define(repository_ctx, _include_dir(home) + "/cuda_runtime_api.h", "CUDART_VERSION")
    if value == None or not value.isdigit():
        return None
    number = int(value)
    return (number // 1000, (number % 1000) // 10)

def _has_lib(repository_ctx, folders, name):
    for folder in folders:
        if repository_ctx.path(folder + "/lib%s.so" % name).exists:
            return True
    return False

def _link_flags(folders, name):
    flags = []
    for folder in folders:
        if folder != _SYSTEM_LIB:
            flags += ["-L" + folder, "-Wl,-rpath," + folder]
    return flags + ["-l" + name]

def _pick_toolkit(repository_ctx, torch_cuda):
    env = repository_ctx.os.environ
    home = env.get("KNAPFORMER_CUDA_HOME") or env.get("CUDA_HOME")
    if home:
        if _cuda_version(repository_ctx, home) == None:
            _fail("CUDA_HOME=%s holds no include/cuda_runtime_api.h" % home)
        return home
    present = [h for h in _TOOLKITS if _cuda_version(repository_ctx, h) != None]
    if not present:
        _fail("no CUDA toolkit: none of %s holds cuda_runtime_api.h (Debian: " % _TOOLKITS +
              "apt-get install nvidia-cuda-dev; elsewhere --repo_env=CUDA_HOME=/path)")
    if torch_cuda:
        want = int(torch_cuda.split(".")[0])
        for home in present:
            if _cuda_version(repository_ctx, home)[0] == want:
                return home
    return present[0]

def _pick_nccl(repository_ctx, home, torch):
    env = repository_ctx.os.environ
    candidates = []
    if env.get("KNAPFORMER_NCCL_HOME"):
        candidates.append(env["KNAPFORMER_NCCL_HOME"])
    elif torch and torch["cuda"]:
        if torch["pip_nccl"]:
            candidates.append(torch["pip_nccl"])
        candidates += ["/usr", home]
    else:
        candidates += [home, "/usr"]
    for candidate in candidates:
        include = _include_dir(candidate)
        if not repository_ctx.path(include + "/nccl.h").exists:
            continue
        libs = _lib_dirs(repository_ctx, candidate)
        for folder in libs:
            # A pip wheel's nvidia-nccl has libnccl.so.2 only.
            for name in ["libnccl.so", "libnccl.so.2"]:
                if repository_ctx.path(folder + "/" + name).exists:
                    return candidate, include, libs
    _fail("no NCCL (nccl.h and libnccl.so) in %s (Debian: apt-get install libnccl-dev; " %
          candidates + "elsewhere --repo_env=KNAPFORMER_NCCL_HOME=/path)")

def _cuda_configure_impl(repository_ctx):
    _, facts = probe_interpreter(repository_ctx)
    torch = facts["torch"]
    torch_cuda = torch["cuda"] if torch else None
    home = _pick_toolkit(repository_ctx, torch_cuda)
    version = _cuda_version(repository_ctx, home)
    if torch_cuda and int(torch_cuda.split(".")[0]) != version[0]:
        _fail(("torch %s is built for CUDA %s, but the CUDA toolkit found (%s) is %d.%d: " +
               "one process cannot load both runtimes. Point --repo_env=CUDA_HOME at a " +
               "CUDA %s toolkit.") % (torch["full_version"], torch_cuda, home, version[0],
                                      version[1], torch_cuda.split(".")[0]))
    cuda_libs = _lib_dirs(repository_ctx, home)
    if not _has_lib(repository_ctx, cuda_libs, "cudart"):
        _fail("no libcudart.so in %s" % cuda_libs)
    nccl_home, nccl_include, nccl_libs = _pick_nccl(repository_ctx, home, torch)

    folders = [_include_dir(home)]
    if nccl_include not in folders:
        folders.append(nccl_include)
    globs, includes = header_folders(repository_ctx, folders, "include")
    nccl_link = _link_flags(nccl_libs, "nccl")
    if not _has_lib(repository_ctx, nccl_libs, "nccl"):
        nccl_link = nccl_link[:-1] + ["-l:libnccl.so.2"]

    repository_ctx.file("BUILD.bazel", """# Made by //third_party:cuda_configure.bzl:
# CUDA {version} at {home}, NCCL at {nccl}.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    hdrs = glob({globs}, allow_empty = True),
    includes = {includes},
)

cc_library(
    name = "cudart",
    linkopts = {cudart},
    deps = [":headers"],
)

cc_library(
    name = "nccl",
    linkopts = {nccl_link},
    deps = [":cudart"],
)
""".format(
        version = "%d.%d" % version,
        home = home,
        nccl = nccl_home,
        globs = repr(globs),
        includes = repr(includes),
        cudart = repr(_link_flags(cuda_libs, "cudart")),
        nccl_link = repr(nccl_link),
    ))
    repository_ctx.file("defs.bzl", 'CUDA_VERSION = "%d.%d"\nCUDA_HOME = "%s"\nNCCL_HOME = "%s"\n' %
                                    (version[0], version[1], home, nccl_home))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["KNAPFORMER_PYTHON", "KNAPFORMER_CUDA_HOME", "CUDA_HOME", "KNAPFORMER_NCCL_HOME"],
    local = True,
    configure = True,
)
