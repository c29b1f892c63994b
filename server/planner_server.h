#ifndef KNAPFORMER_SERVER_PLANNER_SERVER_H_
#define KNAPFORMER_SERVER_PLANNER_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job_auth.h"
#include "server/planner_service.h"

namespace grpc {
class CallbackGenericService;
class Server;
}  // namespace grpc
namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace knapformer {

// PEM files for TLS. All empty: plaintext. cert_file and key_file: TLS.
// client_ca_file as well: mutual TLS (clients must present a certificate
// signed by that CA). The files are read again every refresh_interval
// (whole seconds, at least 1), so that a renewed certificate or CA is used
// without a restart; a file that has become unreadable keeps the last read.
struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  absl::Duration refresh_interval = absl::Seconds(60);
};

struct PlannerServerOptions {
  // host:port for gRPC; port 0 picks a free port (see PlannerServer::port()).
  std::string listen_address = "127.0.0.1:50051";
  // host:port for the Prometheus /metrics page; empty = no metrics endpoint.
  std::string metrics_address;
  // host:port of a plaintext listener that serves only the health service
  // (the same statuses as the main one), for probes that cannot speak TLS
  // (the kubelet's gRPC probes) when the main listener does; empty = none.
  std::string health_address;
  TlsFiles tls;
  // Who may act as which job (job_auth.h): mtls needs tls.client_ca_file,
  // token a key file. Replaces service.authorizer. A mode other than none
  // needs TLS (tls.cert_file) unless listen_address stays on this machine
  // (loopback, a unix socket), or mesh_tls: tokens never cross a network in
  // clear. Reflection is served only under none (its requests are parsed
  // whole before any credential is looked at).
  AuthOptions auth;
  // A service mesh (a sidecar proxy) encrypts every connection to this
  // planner: --auth over plaintext on a non-loopback address is allowed.
  bool mesh_tls = false;
  ServiceOptions service;
  // A connection older than this is asked to close (GOAWAY; its calls
  // finish first) so that clients resolve the planner's name again: a
  // client of replicas behind a headless Service finds a replica that
  // joined (a rolling update's last replacement, a scale-up) within this
  // long, since gRPC's DNS resolver asks only after a disconnect. Zero:
  // never.
  absl::Duration max_connection_age = absl::Seconds(30);
};

// The planner service in a gRPC server, with the standard health service
// (grpc.health.v1, "" and "knapformer.v1.Planner" are SERVING while up),
// server reflection (under --auth none) and, optionally, Prometheus metrics
// on their own port. gRPC's memory for requests in transit is held to a
// resource quota, and a connection's concurrent calls to a limit, both sized
// from the service's limits (planner_server.cc, ServerQuotasFor), so that
// callers refused before their request is read (no credential) are bounded
// too.
// Embeddable: a trainer's rank 0 can host it in-process. Thread-safe.
class PlannerServer {
 public:
  // Errors: InvalidArgument (unreadable or incomplete TLS files, an auth
  // mode without what it needs or without TLS off loopback, a bad key file),
  // Unavailable (an address cannot be bound, e.g. the port is in use: the
  // server never shares a port with another process).
  static absl::StatusOr<std::unique_ptr<PlannerServer>> Start(
      const PlannerServerOptions& options);

  ~PlannerServer();  // Shutdown() if not done yet
  PlannerServer(const PlannerServer&) = delete;
  PlannerServer& operator=(const PlannerServer&) = delete;

  // The bound ports (metrics_port() is 0 without a metrics endpoint).
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }
  // "host:port" of the gRPC listener, with the bound port.
  std::string address() const;

  // Marks health NOT_SERVING, fails waiting ranks with UNAVAILABLE and
  // refuses new steps with UNAVAILABLE, waits up to `grace` for the calls
  // in flight to be answered and their answers sent, then cancels what is
  // left: open channels and health Watch streams do not hold it, so with
  // nothing in flight it returns within milliseconds. A solve under way
  // past the grace is not interrupted: the stop waits for it to answer its
  // cancelled call. Idempotent; returns when the server has stopped. Not
  // from a gRPC callback thread (it waits for every callback to end).
  void Shutdown(absl::Duration grace = absl::Seconds(5));

  PlannerService& service() { return *service_; }

 private:
  PlannerServer() = default;
  void StopMetrics();

  std::string host_;
  int port_ = 0;
  int metrics_port_ = 0;
  int health_port_ = 0;
  std::string metrics_wake_host_;  // where StopMetrics connects to wake civetweb
  std::unique_ptr<PlannerService> service_;  // outlives server_
  std::unique_ptr<grpc::Server> server_;
  // Answers the health-only listener's other methods UNIMPLEMENTED;
  // outlives health_server_.
  std::unique_ptr<grpc::CallbackGenericService> health_unimplemented_;
  std::unique_ptr<grpc::Server> health_server_;  // health_address's
  std::unique_ptr<prometheus::Exposer> exposer_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_PLANNER_SERVER_H_
