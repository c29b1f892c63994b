"""The files knapformer._C (the Python package's extension) is built from: the
one list both builds take their sources from.

Bazel loads it: //python:knapformer/_C.so compiles exactly these files, and
its sandbox refuses a header they include that the list lacks. pip reads it:
python/pip_configure.py evaluates this file's assignments (ast.literal_eval),
so keep them literal lists and dicts of strings, each sorted.
"""

# C++ sources and headers, by room.
SOURCES = [
    "client/environment.cc",
    "client/exchange_agreement.cc",
    "client/fallback_policy.cc",
    "client/host_tensor_cache.cc",
    "client/planner_client.cc",
    "client/planner_credentials.cc",
    "client/planner_link.cc",
    "client/planner_target.cc",
    "client/rank_report.cc",
    "client/rank_speed_source.cc",
    "client/route_layout.cc",
    "client/row_exchange.cc",
    "client/row_move.cc",
    "client/row_packing.cc",
    "client/sequence_balancer.cc",
    "client/settings_agreement.cc",
    "client/step_plan.cc",
    "client/step_requests.cc",
    "common/args.cc",
    "common/grpc_log.cc",
    "common/log.cc",
    "common/loopback.cc",
    "common/pem_file.cc",
    "common/rank_ranges.cc",
    "planner/advice.cc",
    "planner/attention_mask.cc",
    "planner/auto_layout.cc",
    "planner/balance_stats.cc",
    "planner/balancer.cc",
    "planner/balancer_input.cc",
    "planner/balancer_options.cc",
    "planner/calibration.cc",
    "planner/chunk_table_cache.cc",
    "planner/cost_model.cc",
    "planner/data_stream.cc",
    "planner/least_squares.cc",
    "planner/lengths_file.cc",
    "planner/locality.cc",
    "planner/machine.cc",
    "planner/mask_json.cc",
    "planner/masked_stream.cc",
    "planner/measured_cost.cc",
    "planner/measured_fit.cc",
    "planner/multifit.cc",
    "planner/packing_bound.cc",
    "planner/parallel_for.cc",
    "planner/placement_bound.cc",
    "planner/plan.cc",
    "planner/plan_fingerprint.cc",
    "planner/plan_from_chunks.cc",
    "planner/plan_json.cc",
    "planner/rank_speeds.cc",
    "planner/refine.cc",
    "planner/replica_packer.cc",
    "planner/replica_solve.cc",
    "planner/speed_learner.cc",
    "planner/step_solve.cc",
    "planner/step_time.cc",
    "planner/topology.cc",
    "planner/validate.cc",
    "proto/mask_proto.cc",
    "proto/plan_proto.cc",
    "proto/step_problem.cc",
    "python/balancer_binding.cc",
    "python/machine_arg.cc",
    "python/module.cc",
    "python/nccl_binding.cc",
    "python/planner_binding.cc",
    "python/server_binding.cc",
    "python/status_exception.cc",
    "server/cost_fits.cc",
    "server/cpu_quota.cc",
    "server/embedded_planner.cc",
    "server/fair_queue.cc",
    "server/job_auth.cc",
    "server/job_token.cc",
    "server/planner_server.cc",
    "server/planner_service.cc",
    "server/rendezvous.cc",
    "server/request_bounds.cc",
    "server/request_check.cc",
    "server/request_scan.cc",
    "server/serve_flags.cc",
    "server/service_metrics.cc",
    "server/tenant_quota.cc",
    "server/thread_pool.cc",
    "transport/agreement.cc",
    "transport/backend_checks.cc",
    "transport/c10d_transport.cc",
    "transport/local_transport.cc",
    "transport/tensor_hub_transport.cc",
    "transport/transport.cc",
]

HEADERS = [
    "client/environment.h",
    "client/exchange_agreement.h",
    "client/fallback_policy.h",
    "client/host_tensor_cache.h",
    "client/planner_client.h",
    "client/planner_client_options.h",
    "client/planner_credentials.h",
    "client/planner_link.h",
    "client/planner_target.h",
    "client/rank_report.h",
    "client/rank_speed_source.h",
    "client/route_layout.h",
    "client/row_exchange.h",
    "client/row_move.h",
    "client/row_packing.h",
    "client/sequence_balancer.h",
    "client/sequence_balancer_options.h",
    "client/settings_agreement.h",
    "client/step_plan.h",
    "client/step_requests.h",
    "common/args.h",
    "common/embedded_service.h",
    "common/grpc_log.h",
    "common/log.h",
    "common/loopback.h",
    "common/pem_file.h",
    "common/rank_ranges.h",
    "common/status_macros.h",
    "common/tsan_handoff.h",
    "planner/advice.h",
    "planner/attention_mask.h",
    "planner/auto_layout.h",
    "planner/bag_members.h",
    "planner/bag_split.h",
    "planner/balance_stats.h",
    "planner/balancer.h",
    "planner/balancer_input.h",
    "planner/balancer_options.h",
    "planner/calibration.h",
    "planner/chunk_table_cache.h",
    "planner/cost_model.h",
    "planner/data_stream.h",
    "planner/least_squares.h",
    "planner/lengths_file.h",
    "planner/locality.h",
    "planner/machine.h",
    "planner/mask_json.h",
    "planner/masked_stream.h",
    "planner/measured_cost.h",
    "planner/measured_fit.h",
    "planner/min_tree.h",
    "planner/multifit.h",
    "planner/packing_bound.h",
    "planner/parallel_for.h",
    "planner/placement_bound.h",
    "planner/plan.h",
    "planner/plan_fingerprint.h",
    "planner/plan_from_chunks.h",
    "planner/plan_json.h",
    "planner/rank_speeds.h",
    "planner/refine.h",
    "planner/replica_bags.h",
    "planner/replica_packer.h",
    "planner/replica_solve.h",
    "planner/sequence_table.h",
    "planner/speed_learner.h",
    "planner/splitmix64.h",
    "planner/step_solve.h",
    "planner/step_time.h",
    "planner/token_cap.h",
    "planner/topology.h",
    "planner/validate.h",
    "proto/mask_proto.h",
    "proto/plan_proto.h",
    "proto/step_problem.h",
    "python/bindings.h",
    "python/machine_arg.h",
    "python/status_exception.h",
    "server/arena_messages.h",
    "server/cost_fits.h",
    "server/cpu_quota.h",
    "server/embedded_planner.h",
    "server/fair_queue.h",
    "server/job_auth.h",
    "server/job_token.h",
    "server/planner_server.h",
    "server/planner_service.h",
    "server/rendezvous.h",
    "server/request_bounds.h",
    "server/request_check.h",
    "server/request_scan.h",
    "server/serve_flags.h",
    "server/service_limits.h",
    "server/service_metrics.h",
    "server/tenant_quota.h",
    "server/thread_pool.h",
    "server/watched_file.h",
    "transport/agreement.h",
    "transport/backend_checks.h",
    "transport/c10d_transport.h",
    "transport/local_transport.h",
    "transport/segments.h",
    "transport/tensor_hub_transport.h",
    "transport/transport.h",
]

# Compiled with protoc (and grpc_cpp_plugin for GRPC_PROTOS): each .proto and
# the Bazel target of its C++. The service's API under proto/ is imported
# relative to proto/, the others relative to the repository root
# (proto/proto_cc.bzl).
PROTOS = {
    "client/rank_report.proto": "//client:rank_report_cc_proto",
    "client/row_exchange.proto": "//client:row_exchange_cc_proto",
    "client/settings_agreement.proto": "//client:settings_agreement_cc_proto",
    "proto/knapformer/v1/planner.proto": "//proto:planner_cc_grpc",
    "transport/agreement.proto": "//transport:agreement_cc_proto",
}

GRPC_PROTOS = ["proto/knapformer/v1/planner.proto"]

# The raw NCCL transport, with a CUDA torch (Bazel: --config=cuda).
CUDA_SOURCES = [
    "transport/deadline_watchdog.cc",
    "transport/exchange_plan.cc",
    "transport/nccl_transport.cc",
]

CUDA_HEADERS = [
    "transport/deadline_watchdog.h",
    "transport/exchange_plan.h",
    "transport/nccl_transport.h",
    "transport/resource_pool.h",
]

# The `knapformer` command a pip install adds (setup.py): these files, linked
# with the extension's objects of COMMAND_LINE_ROOMS (and its protos); the
# same command Bazel builds as //tools:knapformer.
COMMAND_LINE_SOURCES = [
    "common/malloc_policy.cc",
    "planner/exchange_fit.cc",
    "tools/calibrate.cc",
    "tools/knapformer_main.cc",
    "tools/machine_flags.cc",
    "tools/serve.cc",
    "tools/simulate.cc",
    "tools/token.cc",
]

COMMAND_LINE_HEADERS = [
    "common/malloc_policy.h",
    "planner/exchange_fit.h",
    "tools/calibrate.h",
    "tools/machine_flags.h",
    "tools/serve.h",
    "tools/simulate.h",
    "tools/token.h",
]

COMMAND_LINE_ROOMS = ["common", "planner", "proto", "server"]

def labels(paths):
    """Bazel labels of repository paths, each in its room's package:
    "client/x.cc" -> "//client:x.cc", "proto/knapformer/v1/planner.proto" ->
    "//proto:knapformer/v1/planner.proto"."""
    return ["//%s:%s" % (p.partition("/")[0], p.partition("/")[2]) for p in paths]

def extension_files(room, suffixes = (".cc", ".h", ".proto")):
    """The files of `room` (a top-level folder) in the lists, relative to it:
    what that room's BUILD file exports to the two builds (exports_files)."""
    paths = (SOURCES + HEADERS + CUDA_SOURCES + CUDA_HEADERS + PROTOS.keys() +
             COMMAND_LINE_SOURCES + COMMAND_LINE_HEADERS)
    return [
        p.partition("/")[2]
        for p in paths
        if p.partition("/")[0] == room and p.endswith(suffixes)
    ]

# Who reads the listed files besides their own rooms: the two builds' Bazel
# users (the extension, and the test that checks the list).
EXTENSION_READERS = ["//python:__pkg__", "//tests/python:__pkg__"]
