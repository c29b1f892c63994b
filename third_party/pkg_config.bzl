"""A system library's link flags from pkg-config, read when the build is configured.

The Abseil Debian ships changes its set of libraries between releases
(bookworm's 20220623, trixie's 20240722 adds kernel_timeout_internal, ...):
pkg-config names them, in an order that also suits static archives (the
TSan build links Abseil rebuilt as static libraries: scripts/tsan_absl.sh).
Headers are in /usr/include, already on the compiler's path.
"""

def _pkg_config_library_impl(repository_ctx):
    pkg_config = repository_ctx.which("pkg-config")
    if pkg_config == None:
        fail("\n[knapformer pkg_config] pkg-config is missing (apt-get install pkgconf; " +
             "bash scripts/setup.sh installs it)\n")
    result = repository_ctx.execute([pkg_config, "--libs"] + repository_ctx.attr.modules)
    if result.return_code != 0:
        fail("\n[knapformer pkg_config] pkg-config --libs %s failed: %s\n" %
             (" ".join(repository_ctx.attr.modules), result.stderr.strip()))
    flags = [f for f in result.stdout.strip().replace("\t", " ").split(" ") if f]
    repository_ctx.file("BUILD.bazel", """# Made by //third_party:pkg_config.bzl:
# pkg-config --libs {modules}
cc_library(
    name = "lib",
    linkopts = {flags},
    visibility = ["//visibility:public"],
)
""".format(
        modules = " ".join(repository_ctx.attr.modules),
        flags = repr(flags + repository_ctx.attr.extra_linkopts),
    ))

pkg_config_library = repository_rule(
    implementation = _pkg_config_library_impl,
    attrs = {
        "modules": attr.string_list(mandatory = True),
        "extra_linkopts": attr.string_list(),
    },
    environ = ["PKG_CONFIG_PATH"],
    local = True,
)
