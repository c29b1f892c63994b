#include "server/planner_server.h"

#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/exposer.h"
#include "common/log.h"

namespace knapformer {
namespace {

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' is not a PEM file"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const TlsFiles& tls) {
  if (tls.cert_file.empty() && tls.key_file.empty() && tls.client_ca_file.empty()) {
    return grpc::InsecureServerCredentials();
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: TLS needs both (and --tls-client-ca only with them)");
  }
  grpc::SslServerCredentialsOptions options;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  auto key = ReadPem("--tls-key", tls.key_file);
  if (!key.ok()) return key.status();
  auto cert = ReadPem("--tls-cert", tls.cert_file);
  if (!cert.ok()) return cert.status();
  pair.private_key = *std::move(key);
  pair.cert_chain = *std::move(cert);
  options.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca_file.empty()) {
    auto ca = ReadPem("--tls-client-ca", tls.client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

// "host" of "host:port" ("[::1]:0" -> "[::1]").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannerServer>> PlannerServer::Start(
    const PlannerServerOptions& options) {
  auto credentials = Credentials(options.tls);
  if (!credentials.ok()) return credentials.status();

  std::unique_ptr<PlannerServer> server(new PlannerServer());
  server->host_ = HostOf(options.listen_address);
  server->service_ = std::make_unique<PlannerService>(options.service);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // A second server on the same port must fail to start, not silently take
  // half the connections (and break every rendezvous).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.service.limits.max_message_bytes);
  builder.AddListeningPort(options.listen_address, *credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot serve on '", options.listen_address,
        "' (malformed address, or the port is in use)"));
  }
  grpc::HealthCheckServiceInterface* health = server->server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(v1::Planner::service_full_name(), true);

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
  }
  Log(LogLevel::kInfo,
      absl::StrCat("planner serving on ", server->address(),
                   options.tls.cert_file.empty() ? " (plaintext)" : " (TLS)",
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
  server_->GetHealthCheckService()->Shutdown();
  service_->Drain();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  server_->Wait();
  exposer_.reset();
  Log(LogLevel::kInfo, "planner stopped");
}

}  // namespace knapformer
