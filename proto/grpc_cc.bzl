"""grpc_cc_library: C++ messages and gRPC stubs from one .proto, with the system
protoc and grpc_cpp_plugin (no com_google_protobuf repository needed)."""

def grpc_cc_library(name, proto, deps = [], testonly = False, visibility = None):
    """Generates <base>.pb.{h,cc} and <base>.grpc.pb.{h,cc} from `proto`.

    `proto` is a path under this package; it is imported (and its headers are
    included) relative to the package, e.g. "knapformer/v1/planner.proto" ->
    #include "knapformer/v1/planner.grpc.pb.h".
    """
    base = proto[:-len(".proto")]
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_gen",
        srcs = [proto],
        outs = outs,
        cmd = ("/usr/bin/protoc -I$$(dirname $(location {proto}) | sed 's#/{dir}$$##') " +
               "--cpp_out=$(GENDIR)/{pkg} --grpc_out=$(GENDIR)/{pkg} " +
               "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin $(location {proto})").format(
            proto = proto,
            dir = proto.rpartition("/")[0],
            pkg = native.package_name(),
        ),
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        includes = ["."],
        deps = deps + ["//third_party:grpc"],
        testonly = testonly,
        visibility = visibility,
    )
