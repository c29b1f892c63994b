#include "server/planner_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/resource_quota.h"
#include "prometheus/exposer.h"
#include "common/grpc_log.h"
#include "common/log.h"
#include "common/loopback.h"
#include "common/pem_file.h"
#include "server/request_scan.h"

namespace knapformer {
namespace {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const TlsFiles& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty() && tls.client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: TLS needs both (and --tls-client-ca only with them)");
  }
  // Read once here for a clear error at start; the provider reads them again
  // every refresh interval, so a renewed certificate (a Secret's new
  // version) is served without a restart.
  if (absl::Status readable = CheckPemFiles({{"--tls-key", tls.key_file},
                                              {"--tls-cert", tls.cert_file},
                                              {"--tls-client-ca", tls.client_ca_file}});
      !readable.ok()) {
    return readable;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file, PemRefreshSeconds(tls.refresh_interval));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!tls.client_ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

// "host" of "host:port" ("[::1]:0" -> "[::1]").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// The numeric address to connect to for reaching a listener bound to
// `address` ("host:port", or a bare port: every interface), resolved once
// here; empty if it does not resolve (the stop then waits out civetweb's
// poll).
std::string WakeHost(const std::string& address) {
  std::string host = address.find(':') == std::string::npos ? "" : HostOf(address);
  if (host.empty() || host == "0.0.0.0" || host == "*") return "127.0.0.1";
  if (host == "[::]" || host == "::") return "::1";
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return "";
  char numeric[NI_MAXHOST];
  const bool named = getnameinfo(found->ai_addr, found->ai_addrlen, numeric, sizeof(numeric),
                                 nullptr, 0, NI_NUMERICHOST) == 0;
  freeaddrinfo(found);
  return named ? numeric : "";
}

// Opens a TCP connection to a numeric host:port and closes it; errors are
// ignored (the listener may be gone already).
void WakeListener(const std::string& host, int port) {
  if (host.empty() || port <= 0) return;
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    close(fd);
    if (connected) break;
  }
  freeaddrinfo(found);
}

// Sets which plugins a server builder runs: reflection or none. Reflection
// is not registered process-wide (InitProtoReflectionServerBuilderPlugin),
// where it reached the health-only listener too.
class PluginsOption final : public grpc::ServerBuilderOption {
 public:
  explicit PluginsOption(bool reflection) : reflection_(reflection) {}
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->clear();
    if (reflection_) {
      plugins->push_back(std::make_unique<grpc::reflection::ProtoServerReflectionPlugin>());
    }
  }

 private:
  const bool reflection_;
};

// What gRPC itself is held to, from the service's limits: the memory of
// requests in transit and held as bytes (half the request memory the
// service admits, whose parsed part lives outside gRPC, and room for two
// requests at the receive limit), past which gRPC sheds new calls
// (RESOURCE_EXHAUSTED); and the calls one connection may have open at once
// (a whole group's ranks in one process, and its PlanGroup calls).
struct ServerQuotas {
  int64_t memory_bytes = 0;
  int32_t streams_per_connection = 0;
};

ServerQuotas ServerQuotasFor(const ServiceLimits& limits, int receive_limit_bytes) {
  ServerQuotas quotas;
  quotas.memory_bytes = limits.max_request_memory / 2 + 2 * int64_t{receive_limit_bytes};
  quotas.streams_per_connection = limits.max_world_size + limits.max_plan_group_calls_per_tenant;
  return quotas;
}

// Tokens never cross a network in clear: an auth mode needs TLS, a listener
// that stays on this machine, or a mesh that encrypts for it.
absl::Status CheckAuthTransport(const PlannerServerOptions& options) {
  if (options.auth.mode == AuthMode::kNone || !options.tls.cert_file.empty() ||
      options.mesh_tls || IsLocalAddress(options.listen_address)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--auth=", AuthModeName(options.auth.mode), " without TLS on '", options.listen_address,
      "': credentials would cross the network in clear; serve TLS (--tls-cert, --tls-key), "
      "listen on loopback only, or give --mesh-tls where a service mesh encrypts every "
      "connection to the planner"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(
    const PlannerServerOptions& options) {
  RouteGrpcLogsToLog();
  auto credentials = Credentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  if (absl::Status transport = CheckAuthTransport(options); !transport.ok()) return transport;
  absl::StatusOr<std::unique_ptr<JobAuthorizer>> authorizer =
      JobAuthorizer::Create(options.auth, !options.tls.client_ca_file.empty());
  if (!authorizer.ok()) return authorizer.status();
  // What request_scan_test proves of every request message, checked once
  // more where it matters: a field the scan cannot bound never serves.
  const RequestBounds bounds(options.service.limits);
  for (const google::protobuf::Descriptor* request : ScannedRequests()) {
    if (absl::Status covered = bounds.Covers(request); !covered.ok()) return covered;
  }
  ServiceOptions service = options.service;
  service.authorizer = *std::move(authorizer);

  std::unique_ptr<PlannerServer> server(new PlannerServer());
  server->host_ = HostOf(options.listen_address);
  server->service_ = std::make_unique<PlannerService>(service);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<PluginsOption>(options.auth.mode == AuthMode::kNone));
  const int receive_limit = ReceiveLimitBytes(options.service.limits);
  const ServerQuotas quotas = ServerQuotasFor(options.service.limits, receive_limit);
  grpc::ResourceQuota memory("knapformer-planner");
  memory.Resize(static_cast<size_t>(quotas.memory_bytes));
  builder.SetResourceQuota(memory);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, quotas.streams_per_connection);
  // A second server on the same port must fail to start, not silently take
  // half the connections (and break every rendezvous).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Group-mode clients ping every second while a step waits, to find a
  // hung replica (client/planner_client.cc); gRPC's default (one ping per
  // 5 minutes without data) would answer them with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  if (options.max_connection_age > absl::ZeroDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_MS,
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(options.max_connection_age),
                                           std::numeric_limits<int>::max())));
  }
  builder.SetMaxReceiveMessageSize(receive_limit);
  builder.AddListeningPort(options.listen_address, *credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot serve on '", options.listen_address,
        "' (malformed address, or the port is in use)"));
  }
  if (!options.health_address.empty()) {
    // Its own server, so that nothing but health answers in plaintext.
    grpc::ServerBuilder health_builder;
    health_builder.SetOption(std::make_unique<PluginsOption>(/*reflection=*/false));
    // Every other method is UNIMPLEMENTED there (and the server needs a
    // service of its own to start: health is added as it starts).
    server->health_unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
    health_builder.RegisterCallbackGenericService(server->health_unimplemented_.get());
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    health_builder.AddListeningPort(options.health_address, grpc::InsecureServerCredentials(),
                                    &server->health_port_);
    server->health_server_ = health_builder.BuildAndStart();
    if (server->health_server_ == nullptr || server->health_port_ == 0) {
      server->Shutdown(absl::ZeroDuration());
      return absl::UnavailableError(absl::StrCat(
          "--health-listen: cannot serve on '", options.health_address,
          "' (malformed address, or the port is in use)"));
    }
  }
  for (grpc::Server* s : {server->server_.get(), server->health_server_.get()}) {
    if (s == nullptr) continue;
    grpc::HealthCheckServiceInterface* health = s->GetHealthCheckService();
    health->SetServingStatus(true);
    health->SetServingStatus(v1::Planner::service_full_name(), true);
  }

  if (!options.metrics_address.empty()) {
    try {
      server->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_address);
    } catch (const std::exception& e) {
      server->Shutdown(absl::ZeroDuration());
      return absl::UnavailableError(absl::StrCat("--metrics: cannot serve on '",
                                                 options.metrics_address, "': ", e.what()));
    }
    server->exposer_->RegisterCollectable(server->service_->metrics().registry());
    server->exposer_->RegisterCollectable(server->service_->metrics().gauges());
    const std::vector<int> ports = server->exposer_->GetListeningPorts();
    server->metrics_port_ = ports.empty() ? 0 : ports[0];
    server->metrics_wake_host_ = WakeHost(options.metrics_address);
  }
  Log(LogLevel::kInfo,
      absl::StrCat("planner serving on ", server->address(),
                   options.tls.cert_file.empty() ? " (plaintext" : " (TLS",
                   ", auth ", AuthModeName(options.auth.mode), ")",
                   server->metrics_port_ != 0
                       ? absl::StrCat(", metrics on ", HostOf(options.metrics_address), ":",
                                      server->metrics_port_, "/metrics")
                       : std::string()));
  return server;
}

PlannerServer::~PlannerServer() { Shutdown(); }

std::string PlannerServer::address() const { return absl::StrCat(host_, ":", port_); }

void PlannerServer::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + grace;
  server_->GetHealthCheckService()->Shutdown();
  if (health_server_ != nullptr) health_server_->GetHealthCheckService()->Shutdown();
  service_->Drain();  // from here new steps are refused with UNAVAILABLE
  service_->WaitForAnswers(deadline);
  // What is left are health Watch streams, which never end by themselves
  // (given the whole grace, one open watch, a load balancer's or a probe's,
  // held every stop for all of it), and steps still being solved past the
  // grace: gRPC cancels them all now. Wait() still waits for a solve that is
  // under way to answer its cancelled call; a solve is never interrupted.
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  if (health_server_ != nullptr) {
    health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
    health_server_->Wait();
  }
  StopMetrics();
  Log(LogLevel::kInfo, "planner stopped");
}

void PlannerServer::StopMetrics() {
  if (exposer_ == nullptr) return;
  // civetweb's accept loop looks at its stop flag only between polls of its
  // listening socket, which wait up to 2 s (SOCKET_TIMEOUT_QUANTUM): the
  // stop alone took ~2 s. A connection ends the poll; it is closed at once,
  // so a worker that takes it sees EOF.
  std::atomic<bool> stopped{false};
  std::thread stopper([this, &stopped] {
    exposer_.reset();
    stopped = true;
  });
  while (!stopped) {
    WakeListener(metrics_wake_host_, metrics_port_);
    absl::SleepFor(absl::Milliseconds(20));
  }
  stopper.join();
}

}  // namespace knapformer
