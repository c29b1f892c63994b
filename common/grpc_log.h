#ifndef KNAPFORMER_COMMON_GRPC_LOG_H_
#define KNAPFORMER_COMMON_GRPC_LOG_H_

namespace knapformer {

// Sends gRPC's own log lines (a failed TLS handshake, a closed connection)
// through Log, in the project's one-line format, so that a trainer's stderr
// does not get them raw on every probe and --log-level (log_level in
// Python) governs them: a gRPC error is a warning (the client and the
// service report what it costs them in their own lines), its info and debug
// lines debug. For the process: the first call installs it, the others do
// nothing. The planner client and the service call it when they start.
void RouteGrpcLogsToLog();

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_GRPC_LOG_H_
