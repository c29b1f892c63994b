"""source_set: the files of this repository that a target is built from.

Follows `deps` and `srcs` (through generated files to the rules that make
them, e.g. a .proto behind its .pb.cc) and writes the repository-relative
paths of every source file of this workspace, one per line, sorted: what
tests/python:pip_sources_test compares with setup.py's lists, so that the
pip build and the Bazel build compile the same files.
"""

_SourceFiles = provider(fields = ["files"])

def _files_of(attribute):
    return [f for target in attribute for f in target.files.to_list()]

def _collect_impl(target, ctx):
    own = []
    for name in ["srcs", "hdrs"]:
        for f in _files_of(getattr(ctx.rule.attr, name, [])):
            if f.is_source and f.owner.workspace_name == "":
                own.append(f)
    transitive = []
    for name in ["deps", "srcs"]:
        for dep in getattr(ctx.rule.attr, name, []):
            if _SourceFiles in dep:
                transitive.append(dep[_SourceFiles].files)
    return [_SourceFiles(files = depset(own, transitive = transitive))]

_collect = aspect(
    implementation = _collect_impl,
    attr_aspects = ["deps", "srcs"],
    apply_to_generating_rules = True,
)

def _source_set_impl(ctx):
    files = depset(transitive = [t[_SourceFiles].files for t in ctx.attr.targets])
    paths = sorted({f.short_path: None for f in files.to_list()}.keys())
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    ctx.actions.write(out, "\n".join(paths) + "\n")
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

source_set = rule(
    implementation = _source_set_impl,
    attrs = {"targets": attr.label_list(aspects = [_collect])},
)
