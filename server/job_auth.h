#ifndef KNAPFORMER_SERVER_JOB_AUTH_H_
#define KNAPFORMER_SERVER_JOB_AUTH_H_

// Which callers may act as a job: every RPC that names a job (Plan,
// PlanGroup, GetJob) asks a JobAuthorizer before anything else reads the
// request, so that a refused caller learns nothing about the job, not even
// whether it exists.
//
// Modes (`serve --auth`):
//   none   every caller is every job (the sidecar and rank 0's embedded
//          planner, which listen on loopback or inside the pod);
//   token  the call carries "authorization: Bearer <token>" minted for the
//          job it names: "kf1." and the hex HMAC-SHA256 of the job id under
//          a key of the key file (MintJobToken; `knapformer token --job ID`),
//          or for a prefix of it that ends in "/": the MAC of the prefix,
//          "." and the prefix (MintJobPrefixToken; `--job-prefix NS/`), so
//          that one Secret per namespace serves the jobs whose ids begin
//          with it (deploy/k8s's ids are NAMESPACE/NAME/UID, the UID
//          unknown before the Job exists);
//   mtls   the client's certificate (verified against --tls-client-ca)
//          names the job: a DNS or URI subject alternative name equal to the
//          job id, or a Kubernetes SPIFFE id spiffe://DOMAIN/ns/NS/... for a
//          job id "NS/...", i.e. a namespace's workloads may act as that
//          namespace's jobs.
//
// The key file holds one key per line (at least 32 characters each, e.g.
// `openssl rand -hex 32`; blank lines and lines starting with # skipped).
// The first line mints; every line verifies, so a key is rotated by adding
// the new one first, minting new tokens, then removing the old line. The
// file is read again when its modification time or size changes (looked at
// most once a second); a file that has become unreadable or empty keeps the
// keys last read, with a warning.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace knapformer {

enum class AuthMode { kNone, kToken, kMtls };

// "none", "token" or "mtls"; InvalidArgument naming the three otherwise.
absl::StatusOr<AuthMode> ParseAuthMode(absl::string_view name);
const char* AuthModeName(AuthMode mode);

// The keys of a key file (format above). InvalidArgument naming the file
// and line for a short key, NotFound when unreadable, InvalidArgument when
// it holds no key.
absl::StatusOr<std::vector<std::string>> ReadJobKeys(const std::string& path);

// The token for `job_id` under `key`.
std::string MintJobToken(absl::string_view key, absl::string_view job_id);
// The token for every job id that begins with `prefix`. REQUIRES: `prefix`
// ends in "/" (so "team-a/" never grants "team-ab/...").
std::string MintJobPrefixToken(absl::string_view key, absl::string_view prefix);

// What a JobAuthorizer reads from a call: its bearer token ("" without
// one) and its verified certificate's names (DNS and URI SANs).
struct CallerCredentials {
  std::string bearer_token;
  bool has_authorization = false;  // an "authorization" header, of any form
  bool authorization_is_bearer = false;
  std::vector<std::string> certificate_names;
};
CallerCredentials CredentialsOf(const grpc::ServerContextBase& context);

class JobAuthorizer {
 public:
  // Errors: InvalidArgument for a mode without what it needs (token: a key
  // file; mtls: `client_ca_required` false, i.e. no --tls-client-ca), and
  // ReadJobKeys' errors.
  static absl::StatusOr<std::unique_ptr<JobAuthorizer>> Create(AuthMode mode,
                                                              const std::string& key_file,
                                                              bool client_ca_required);

  AuthMode mode() const { return mode_; }

  // Ok when `caller` may act as `job_id`; else UNAUTHENTICATED (no
  // credential of the mode's kind, or a malformed one) or PERMISSION_DENIED
  // (a credential for another job). The messages never depend on the
  // service's state.
  absl::Status Authorize(const CallerCredentials& caller, const std::string& job_id);
  absl::Status Authorize(const grpc::ServerContextBase& context, const std::string& job_id) {
    return mode_ == AuthMode::kNone ? absl::OkStatus() : Authorize(CredentialsOf(context), job_id);
  }

 private:
  JobAuthorizer(AuthMode mode, std::string key_file) : mode_(mode), key_file_(std::move(key_file)) {}
  // Reads the key file again when it changed (at most once a second).
  std::vector<std::string> CurrentKeys();

  const AuthMode mode_;
  const std::string key_file_;
  absl::Mutex mu_;
  std::vector<std::string> keys_ ABSL_GUARDED_BY(mu_);
  int64_t file_mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t file_size_ ABSL_GUARDED_BY(mu_) = -1;
  // The last version of the file that was refused (warned about once).
  int64_t refused_mtime_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_size_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time last_look_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_JOB_AUTH_H_
