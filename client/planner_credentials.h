#ifndef KNAPFORMER_CLIENT_PLANNER_CREDENTIALS_H_
#define KNAPFORMER_CLIENT_PLANNER_CREDENTIALS_H_

// How a rank proves itself to a planner that checks who may act as a job
// (serve --auth, docs/service.md#security): TLS from PEM files, and the
// job token every call carries.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace grpc {
class ChannelCredentials;
}  // namespace grpc

namespace knapformer {

// PEM files for TLS to the planner. All empty: plaintext. ca_file alone:
// TLS, the planner's certificate verified against it (and its name against
// the target's host). cert_file and key_file as well: mutual TLS (serve
// --tls-client-ca, --auth=mtls). The files are read again every
// refresh_interval (whole seconds, at least 1), so that a renewed
// certificate is used without restarting the trainer.
struct PlannerTls {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  absl::Duration refresh_interval = absl::Seconds(60);
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }
};

// Channel credentials from `tls`'s files, checked now. InvalidArgument
// naming the field (planner_tls_ca, planner_tls_cert, planner_tls_key) for
// a file that cannot be read or holds no PEM block, no CA, or a
// certificate without its key.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PlannerChannelCredentials(
    const PlannerTls& tls);

// InvalidArgument unless `token` is empty or fits an HTTP header value
// (visible ASCII: a token with a line break could add headers of its own).
absl::Status CheckPlannerToken(const std::string& token);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_PLANNER_CREDENTIALS_H_
