#include "client/planner_credentials.h"

#include "absl/strings/str_cat.h"
#include "common/pem_file.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace knapformer {

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PlannerChannelCredentials(
    const PlannerTls& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "planner_tls_cert and planner_tls_key: a client certificate needs its key (set both, "
        "or neither)");
  }
  if (tls.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "planner_tls_ca: TLS to the planner needs the CA that signed its certificate");
  }
  // Read once here for a clear error when the client is made; the provider
  // reads them again every refresh interval (a renewed Secret).
  if (absl::Status readable = CheckPemFiles({{"planner_tls_ca", tls.ca_file},
                                              {"planner_tls_cert", tls.cert_file},
                                              {"planner_tls_key", tls.key_file}});
      !readable.ok()) {
    return readable;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.ca_file, PemRefreshSeconds(tls.refresh_interval));
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!tls.cert_file.empty()) options.watch_identity_key_cert_pairs();
  // The planner's certificate must name the host the target names.
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

absl::Status CheckPlannerToken(const std::string& token) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(
          "planner_token: character ", i, " is not visible ASCII (knapformer token --job ID "
          "prints one token on one line)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace knapformer
