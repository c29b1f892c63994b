"""proto_cc_library: C++ messages, and with grpc = True gRPC stubs, from one
.proto, with the system protoc and grpc_cpp_plugin (no com_google_protobuf
repository needed).

One import layout for the whole repository, the one the pip build uses too
(python/extension_sources.bzl): the service's API under proto/ is imported
(and its headers included) relative to proto/, e.g. "knapformer/v1/planner.proto"
-> #include "knapformer/v1/planner.pb.h"; every other .proto relative to the
repository root, e.g. "transport/agreement.proto" -> "transport/agreement.pb.h".
"""

def proto_cc_library(name, proto, imports = [], deps = [], grpc = False, testonly = False,
                     visibility = None):
    """Generates <base>.pb.{h,cc} (and <base>.grpc.pb.{h,cc}) from `proto`.

    Args:
      proto: a .proto file of this package.
      imports: the .proto files it imports (labels), so that protoc sees them.
      deps: the proto_cc_library targets of those imports.
      grpc: also generate the gRPC stubs (and link gRPC).
    """
    base = proto[:-len(".proto")]
    exts = [".pb.h", ".pb.cc"] + ([".grpc.pb.h", ".grpc.pb.cc"] if grpc else [])
    outs = [base + ext for ext in exts]
    package = native.package_name()
    out_dir = "$(GENDIR)/proto" if package == "proto" else "$(GENDIR)"
    grpc_flags = ("--grpc_out={out} --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin ".format(
        out = out_dir,
    ) if grpc else "")
    # proto/ is searched first, and only where its files are (protoc warns of
    # a missing folder).
    uses_api = package == "proto" or [i for i in imports if i.startswith("//proto:")]
    native.genrule(
        name = name + "_gen",
        srcs = [proto] + imports,
        outs = outs,
        cmd = ("/usr/bin/protoc {api}-I. --cpp_out={out} {grpc}$(location {proto})").format(
            api = "-Iproto " if uses_api else "",
            out = out_dir,
            grpc = grpc_flags,
            proto = proto,
        ),
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        # Generated headers of proto/ are included relative to it.
        includes = ["."] if package == "proto" else [],
        deps = deps + (["//third_party:grpc"] if grpc else ["//third_party:protobuf"]),
        testonly = testonly,
        visibility = visibility,
    )
