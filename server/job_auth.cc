#include "server/job_auth.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"
#include "server/job_token.h"

namespace knapformer {
namespace {

constexpr size_t kMinKeyChars = 32;

absl::StatusOr<std::vector<JobKey>> ParseJobKeys(const std::string& path,
                                                 const FileLines& lines) {
  std::vector<JobKey> keys;
  for (const FileLine& line : lines.whole) {
    const absl::string_view key = absl::StripAsciiWhitespace(line.text);
    if (key.empty() || key[0] == '#') continue;
    if (key.size() < kMinKeyChars) {
      return absl::InvalidArgumentError(absl::StrCat("key file ", path, ", line ", line.number,
                                                     ": a key of ", key.size(),
                                                     " characters; at least ", kMinKeyChars,
                                                     " (openssl rand -hex 32)"));
    }
    keys.push_back(JobKey{KeyIdOf(key), std::string(key)});
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key file ", path, ": no key (one per line, each ending with a newline: openssl rand "
        "-hex 32 >keys)",
        lines.unterminated ? "; its last line has no newline and is not read (it may be being "
                             "written)"
                           : ""));
  }
  return keys;
}

absl::StatusOr<std::set<std::string>> ParseRevoked(const std::string& path,
                                                   const FileLines& lines) {
  std::set<std::string> revoked;
  for (const FileLine& line : lines.whole) {
    const absl::string_view id = absl::StripAsciiWhitespace(line.text);
    if (id.empty() || id[0] == '#') continue;
    if (!IsTokenId(id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "revocation list ", path, ", line ", line.number,
          ": not a token id (16 hex digits, as `knapformer token` prints it)"));
    }
    revoked.emplace(id);
  }
  return revoked;
}

// The namespace a SPIFFE id spiffe://DOMAIN/ns/NS/... names when DOMAIN is
// `trust_domain` ("" otherwise, and for any other name).
std::string SpiffeNamespace(absl::string_view name, absl::string_view trust_domain) {
  if (trust_domain.empty() || !absl::ConsumePrefix(&name, "spiffe://")) return "";
  std::vector<absl::string_view> parts = absl::StrSplit(name, '/');
  if (parts.size() < 3 || !absl::EqualsIgnoreCase(parts[0], trust_domain) || parts[1] != "ns" ||
      parts[2].empty()) {
    return "";
  }
  return std::string(parts[2]);
}

bool IsTrustDomain(absl::string_view domain) {
  if (domain.empty()) return false;
  for (char c : domain) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_')) {
      return false;
    }
  }
  return true;
}

// The value of `file` now, a new version or a new error logged (`unit`
// names what the value counts).
template <typename T>
absl::StatusOr<std::shared_ptr<const T>> LoggedCurrent(WatchedFile<T>& file, const char* unit) {
  bool changed = false;
  absl::StatusOr<std::shared_ptr<const T>> value = file.Current(&changed);
  if (!changed) return value;
  if (value.ok()) {
    Log(LogLevel::kInfo,
        absl::StrCat("auth: read ", (*value)->size(), " ", unit, " from ", file.path()));
  } else {
    Log(LogLevel::kWarning, absl::StrCat("auth: ", value.status().message(),
                                         "; every token is refused until it is fixed"));
  }
  return value;
}

constexpr absl::string_view kFailingClosed =
    "the planner cannot check tokens now: its key file or revocation list is unusable (its log "
    "says why), and every token is refused until that is fixed";

}  // namespace

absl::StatusOr<AuthMode> ParseAuthMode(absl::string_view name) {
  if (name == "none") return AuthMode::kNone;
  if (name == "token") return AuthMode::kToken;
  if (name == "mtls") return AuthMode::kMtls;
  return absl::InvalidArgumentError(
      absl::StrCat("--auth: '", name, "' is not one of none, token, mtls"));
}

const char* AuthModeName(AuthMode mode) {
  switch (mode) {
    case AuthMode::kNone:
      return "none";
    case AuthMode::kToken:
      return "token";
    case AuthMode::kMtls:
      return "mtls";
  }
  return "?";
}

absl::StatusOr<std::vector<JobKey>> ReadJobKeys(const std::string& path) {
  absl::StatusOr<std::string> content = ReadSmallFile("key file", path);
  if (!content.ok()) return content.status();
  return ParseJobKeys(path, WholeLines(*content));
}

CallerCredentials CredentialsOf(const grpc::ServerContextBase& context) {
  CallerCredentials caller;
  const auto& metadata = context.client_metadata();
  auto header = metadata.find("authorization");
  if (header != metadata.end()) {
    caller.has_authorization = true;
    absl::string_view value(header->second.data(), header->second.size());
    if (absl::ConsumePrefix(&value, "Bearer ")) {
      caller.authorization_is_bearer = true;
      caller.bearer_token = std::string(absl::StripAsciiWhitespace(value));
    }
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const char* property : {GRPC_PEER_DNS_PROPERTY_NAME, GRPC_PEER_URI_PROPERTY_NAME}) {
      for (const grpc::string_ref& name : auth->FindPropertyValues(property)) {
        caller.certificate_names.emplace_back(name.data(), name.size());
      }
    }
  }
  return caller;
}

JobAuthorizer::JobAuthorizer(const AuthOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<JobAuthorizer>> JobAuthorizer::Create(const AuthOptions& options,
                                                                     bool client_ca_required) {
  const bool token = options.mode == AuthMode::kToken;
  const bool mtls = options.mode == AuthMode::kMtls;
  const std::string mode = AuthModeName(options.mode);
  if (token && options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth=token needs --auth-key-file (one key per line: openssl rand -hex 32)");
  }
  for (const auto& [flag, given] :
       {std::pair{"--auth-key-file", !options.key_file.empty()},
        std::pair{"--auth-revoked-file", !options.revoked_file.empty()}}) {
    if (given && !token) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is for --auth=token, not --auth=", mode));
    }
  }
  for (const auto& [flag, given] :
       {std::pair{"--mtls-trust-domain", !options.mtls_trust_domain.empty()},
        std::pair{"--mtls-job-names", options.mtls_job_names}}) {
    if (given && !mtls) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is for --auth=mtls, not --auth=", mode));
    }
  }
  if (mtls && !client_ca_required) {
    return absl::InvalidArgumentError(
        "--auth=mtls needs --tls-cert, --tls-key and --tls-client-ca (clients' certificates "
        "are what names their jobs)");
  }
  if (mtls && options.mtls_trust_domain.empty() && !options.mtls_job_names) {
    return absl::InvalidArgumentError(
        "--auth=mtls needs --mtls-trust-domain DOMAIN (a SPIFFE id spiffe://DOMAIN/ns/NS/... "
        "acts as the jobs 'NS/...'), or --mtls-job-names=on (a DNS or URI name equal to a job "
        "id acts as that job), or both");
  }
  if (!options.mtls_trust_domain.empty() && !IsTrustDomain(options.mtls_trust_domain)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mtls-trust-domain: '", options.mtls_trust_domain,
                     "' is not a SPIFFE trust domain (lowercase letters, digits, '.', '-', '_')"));
  }
  std::unique_ptr<JobAuthorizer> authorizer(new JobAuthorizer(options));
  if (token) {
    authorizer->keys_ = std::make_unique<WatchedFile<Keys>>(
        "key file", options.key_file, options.file_look_interval,
        [](const std::string& path, const FileLines& lines) { return ParseJobKeys(path, lines); });
    absl::StatusOr<std::shared_ptr<const Keys>> keys = authorizer->keys_->Current();
    if (!keys.ok()) {
      return keys.status().code() == absl::StatusCode::kNotFound
                 ? absl::InvalidArgumentError(
                       absl::StrCat("--auth-key-file: ", keys.status().message()))
                 : keys.status();
    }
    if (!options.revoked_file.empty()) {
      authorizer->revoked_ = std::make_unique<WatchedFile<Revoked>>(
          "revocation list", options.revoked_file, options.file_look_interval,
          [](const std::string& path, const FileLines& lines) {
            return ParseRevoked(path, lines);
          });
      absl::StatusOr<std::shared_ptr<const Revoked>> revoked = authorizer->revoked_->Current();
      if (!revoked.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--auth-revoked-file: ", revoked.status().message()));
      }
    }
  }
  return authorizer;
}

absl::StatusOr<std::shared_ptr<const JobAuthorizer::Keys>> JobAuthorizer::CurrentKeys() {
  return LoggedCurrent(*keys_, "key(s)");
}

absl::StatusOr<std::shared_ptr<const JobAuthorizer::Revoked>> JobAuthorizer::CurrentRevoked() {
  if (revoked_ == nullptr) return std::make_shared<const Revoked>();
  return LoggedCurrent(*revoked_, "revoked token id(s)");
}

std::optional<AuthFilesState> JobAuthorizer::Refresh() {
  if (keys_ == nullptr) return std::nullopt;
  AuthFilesState state;
  absl::StatusOr<std::shared_ptr<const Keys>> keys = CurrentKeys();
  absl::StatusOr<std::shared_ptr<const Revoked>> revoked = CurrentRevoked();
  if (keys.ok() && revoked.ok()) {
    state.keys = static_cast<int64_t>((*keys)->size());
    state.revoked_tokens = static_cast<int64_t>((*revoked)->size());
  }
  return state;
}

absl::StatusOr<std::string> JobAuthorizer::Authorize(const grpc::ServerContextBase& context,
                                                     const std::string& job_id) {
  if (options_.mode == AuthMode::kNone) return job_id;
  return Authorize(CredentialsOf(context), job_id, absl::Now());
}

absl::StatusOr<std::string> JobAuthorizer::Authorize(const CallerCredentials& caller,
                                                     const std::string& job_id, absl::Time now) {
  switch (options_.mode) {
    case AuthMode::kNone:
      return job_id;
    case AuthMode::kToken:
      return AuthorizeToken(caller, job_id, now);
    case AuthMode::kMtls:
      return AuthorizeCertificate(caller, job_id);
  }
  return absl::InternalError("auth: unknown mode");
}

absl::StatusOr<std::string> JobAuthorizer::AuthorizeToken(const CallerCredentials& caller,
                                                          const std::string& job_id,
                                                          absl::Time now) {
  if (!caller.has_authorization) {
    return absl::UnauthenticatedError(
        "this planner needs a job token: metadata 'authorization: Bearer <token>' "
        "(knapformer token --job ID --ttl 30d; KNAPFORMER_PLANNER_TOKEN)");
  }
  if (!caller.authorization_is_bearer) {
    return absl::UnauthenticatedError(
        "authorization: not 'Bearer <token>' (knapformer token --job ID --ttl 30d)");
  }
  absl::StatusOr<JobToken> token = ParseToken(caller.bearer_token);
  if (!token.ok()) return token.status();
  absl::StatusOr<std::shared_ptr<const Keys>> keys = CurrentKeys();
  absl::StatusOr<std::shared_ptr<const Revoked>> revoked = CurrentRevoked();
  if (!keys.ok() || !revoked.ok()) return absl::UnavailableError(kFailingClosed);
  const JobKey* key = nullptr;
  for (const JobKey& candidate : **keys) {
    if (candidate.id == token->key_id) key = &candidate;
  }
  if (key == nullptr) {
    return absl::UnauthenticatedError(absl::StrCat(
        "authorization: the token was minted under key ", token->key_id,
        ", which is not one of this planner's keys (retired, or another planner's)"));
  }
  if (!TokenMacMatches(*token, key->secret)) {
    return absl::UnauthenticatedError(
        "authorization: the token's MAC does not match its fields (altered, or not minted "
        "under this planner's key)");
  }
  if (now >= token->expires) {
    return absl::UnauthenticatedError(absl::StrCat(
        "authorization: the token expired at ",
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", token->expires, absl::UTCTimeZone()),
        " (mint a new one: knapformer token)"));
  }
  if ((*revoked)->count(token->token_id) != 0) {
    return absl::UnauthenticatedError(
        absl::StrCat("authorization: the token ", token->token_id, " is revoked"));
  }
  const bool covers = token->kind == TokenKind::kJob
                          ? job_id == token->scope
                          : absl::StartsWith(job_id, token->scope);
  if (!covers) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authorization: the token is for ",
        token->kind == TokenKind::kJob ? "job '" : "the jobs under '", token->scope,
        "', not for job '", job_id, "' that the request names"));
  }
  return token->scope;
}

absl::StatusOr<std::string> JobAuthorizer::AuthorizeCertificate(const CallerCredentials& caller,
                                                                const std::string& job_id) const {
  if (caller.certificate_names.empty()) {
    return absl::UnauthenticatedError(
        "this planner needs a client certificate whose SPIFFE id or name names the job");
  }
  for (const std::string& name : caller.certificate_names) {
    const std::string ns = SpiffeNamespace(name, options_.mtls_trust_domain);
    if (!ns.empty() && absl::StartsWith(job_id, absl::StrCat(ns, "/"))) {
      return absl::StrCat(ns, "/");
    }
    if (options_.mtls_job_names && name == job_id) return job_id;
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the client certificate does not name job '", job_id, "': ",
      options_.mtls_trust_domain.empty()
          ? std::string()
          : absl::StrCat("a SPIFFE id spiffe://", options_.mtls_trust_domain,
                         "/ns/NS/... names the jobs 'NS/...'"),
      !options_.mtls_trust_domain.empty() && options_.mtls_job_names ? "; " : "",
      options_.mtls_job_names ? "a DNS or URI name equal to the job id names it" : ""));
}

}  // namespace knapformer
