#ifndef KNAPFORMER_SERVER_JOB_AUTH_H_
#define KNAPFORMER_SERVER_JOB_AUTH_H_

// Which callers may act as a job, and which tenant each acts for: every RPC
// that names a job (Plan, PlanGroup, GetJob) asks a JobAuthorizer before
// anything else reads the request, so that a refused caller learns nothing
// about the job, not even whether it exists. The tenant is what the
// service's shares are kept per (request memory, calls in flight, solver
// turns, room in the job table): the scope of the caller's credential.
//
// Modes (`serve --auth`):
//   none   every caller is every job, and each job its own tenant (the
//          sidecar and rank 0's embedded planner, on loopback or in the pod);
//   token  the call carries "authorization: Bearer <token>", a version-2
//          token (job_token.h) minted under a key of the key file for the job
//          the request names, or for a prefix of it ending in "/" (one
//          Secret per namespace: deploy/k8s's ids are NAMESPACE/NAME/UID),
//          not expired, not revoked. Its tenant is its scope (the job id, or
//          the prefix);
//   mtls   the client's certificate (verified against --tls-client-ca)
//          names the job: a SPIFFE id spiffe://TRUST_DOMAIN/ns/NS/... in the
//          configured trust domain for a job id "NS/..." (tenant "NS/"),
//          or, only where enabled, a DNS or URI name equal to the job id
//          (tenant: the job id).
//
// The key file holds one key per line (at least 32 characters, e.g.
// `openssl rand -hex 32`; blank lines and lines starting with # skipped).
// The first line mints; every line verifies (a token names its key's id), so
// a key is rotated by adding the new one first, minting new tokens, then
// removing the old line once its tokens are replaced. The revocation list
// holds token ids (16 hex digits), one per line. Both are read again when
// their content changes (looked at once a second; whole lines only: a line
// still being written is not taken). A key file that is missing, empty or
// unreadable, or a revocation list that is unreadable or malformed, refuses
// every token (UNAVAILABLE) until fixed, with a warning in the log and
// knapformer_planner_auth_keys at 0: revocation by deletion never fails
// open.

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/watched_file.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace knapformer {

enum class AuthMode { kNone, kToken, kMtls };

// "none", "token" or "mtls"; InvalidArgument naming the three otherwise.
absl::StatusOr<AuthMode> ParseAuthMode(absl::string_view name);
const char* AuthModeName(AuthMode mode);

struct AuthOptions {
  AuthMode mode = AuthMode::kNone;
  // token: the key file (required) and the revocation list (optional).
  std::string key_file;
  std::string revoked_file;
  // mtls: SPIFFE ids in this trust domain name namespaces' jobs; empty =
  // none does. And whether a DNS or URI name equal to a job id names it.
  // At least one of the two is required.
  std::string mtls_trust_domain;
  bool mtls_job_names = false;
  // How often the key file and revocation list are looked at.
  absl::Duration file_look_interval = absl::Seconds(1);
};

struct JobKey {
  std::string id;  // KeyIdOf(secret)
  std::string secret;
};

// The keys of a key file (format above), the first first. InvalidArgument
// naming the file and line for a short key, or when it holds no key;
// NotFound when it cannot be read.
absl::StatusOr<std::vector<JobKey>> ReadJobKeys(const std::string& path);

// What a JobAuthorizer reads from a call: its bearer token ("" without
// one) and its verified certificate's names (DNS and URI SANs).
struct CallerCredentials {
  std::string bearer_token;
  bool has_authorization = false;  // an "authorization" header, of any form
  bool authorization_is_bearer = false;
  std::vector<std::string> certificate_names;
};
CallerCredentials CredentialsOf(const grpc::ServerContextBase& context);

// The key file and revocation list as last read, for the metrics.
struct AuthFilesState {
  int64_t keys = 0;  // 0 while failing closed
  int64_t revoked_tokens = 0;
};

// Thread-safe.
class JobAuthorizer {
 public:
  // Errors: InvalidArgument for a mode without what it needs (token: a key
  // file; mtls: `client_ca_required` false, i.e. no --tls-client-ca, or
  // neither a trust domain nor job names) or options of another mode, and
  // the key file's and revocation list's errors now.
  static absl::StatusOr<std::unique_ptr<JobAuthorizer>> Create(const AuthOptions& options,
                                                              bool client_ca_required);

  AuthMode mode() const { return options_.mode; }

  // The tenant `caller` acts for as `job_id` at `now`; else UNAUTHENTICATED
  // (no credential of the mode's kind, or one that is malformed, expired,
  // revoked or not this planner's), PERMISSION_DENIED (a credential for
  // other jobs: the message names its scope and the job asked for) or
  // UNAVAILABLE (failing closed: the key file or revocation list is
  // unusable). The messages never depend on the service's state.
  absl::StatusOr<std::string> Authorize(const CallerCredentials& caller, const std::string& job_id,
                                        absl::Time now);
  absl::StatusOr<std::string> Authorize(const grpc::ServerContextBase& context,
                                        const std::string& job_id);

  // Reads the files when due (logging a change) and says what they hold;
  // nullopt outside token mode (no files).
  std::optional<AuthFilesState> Refresh();

 private:
  using Keys = std::vector<JobKey>;
  using Revoked = std::set<std::string>;
  explicit JobAuthorizer(const AuthOptions& options);
  absl::StatusOr<std::string> AuthorizeToken(const CallerCredentials& caller,
                                             const std::string& job_id, absl::Time now);
  absl::StatusOr<std::string> AuthorizeCertificate(const CallerCredentials& caller,
                                                   const std::string& job_id) const;
  // The files' values now (read when due, a change logged); an error while
  // either is unusable.
  absl::StatusOr<std::shared_ptr<const Keys>> CurrentKeys();
  absl::StatusOr<std::shared_ptr<const Revoked>> CurrentRevoked();

  const AuthOptions options_;
  std::unique_ptr<WatchedFile<Keys>> keys_;
  std::unique_ptr<WatchedFile<Revoked>> revoked_;  // null without a list
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_JOB_AUTH_H_
