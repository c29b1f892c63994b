#include "server/job_auth.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"
#include "grpcpp/grpcpp.h"

namespace knapformer {
namespace {

constexpr absl::string_view kTokenPrefix = "kf1.";
constexpr size_t kMinKeyChars = 32;
constexpr absl::Duration kKeyFileLook = absl::Seconds(1);

// The key file's modification time and size, to tell a changed file;
// false when it cannot be looked at.
bool StatFile(const std::string& path, int64_t* mtime_ns, int64_t* size) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return false;
  *mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  *size = st.st_size;
  return true;
}

// The URI SAN spiffe://DOMAIN/ns/NS/... names namespace NS ("" otherwise).
std::string SpiffeNamespace(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, "spiffe://")) return "";
  std::vector<absl::string_view> parts = absl::StrSplit(name, '/');
  if (parts.size() < 3 || parts[1] != "ns" || parts[2].empty()) return "";
  return std::string(parts[2]);
}

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

absl::StatusOr<std::vector<std::string>> ReadJobKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("key file ", path, ": cannot be read"));
  }
  std::vector<std::string> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view key = absl::StripAsciiWhitespace(line);
    if (key.empty() || key[0] == '#') continue;
    if (key.size() < kMinKeyChars) {
      return absl::InvalidArgumentError(absl::StrCat("key file ", path, ", line ", number, ": a key of ",
                                                     key.size(), " characters; at least ",
                                                     kMinKeyChars, " (openssl rand -hex 32)"));
    }
    keys.emplace_back(key);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("key file ", path, ": no key (one per line, e.g. openssl rand -hex 32)"));
  }
  return keys;
}

std::string MintJobPrefixToken(absl::string_view key, absl::string_view prefix) {
  return absl::StrCat(MintJobToken(key, prefix), ".", prefix);
}

std::string MintJobToken(absl::string_view key, absl::string_view job_id) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_bytes = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(job_id.data()), job_id.size(), mac, &mac_bytes);
  return absl::StrCat(kTokenPrefix,
                      absl::BytesToHexString(absl::string_view(
                          reinterpret_cast<const char*>(mac), mac_bytes)));
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

absl::StatusOr<std::unique_ptr<JobAuthorizer>> JobAuthorizer::Create(AuthMode mode,
                                                                     const std::string& key_file,
                                                                     bool client_ca_required) {
  if (mode == AuthMode::kToken && key_file.empty()) {
    return absl::InvalidArgumentError(
        "--auth=token needs --auth-key-file (one key per line: openssl rand -hex 32)");
  }
  if (mode != AuthMode::kToken && !key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-key-file is for --auth=token, not --auth=", AuthModeName(mode)));
  }
  if (mode == AuthMode::kMtls && !client_ca_required) {
    return absl::InvalidArgumentError(
        "--auth=mtls needs --tls-cert, --tls-key and --tls-client-ca (clients' certificates "
        "are what names their jobs)");
  }
  std::unique_ptr<JobAuthorizer> authorizer(new JobAuthorizer(mode, key_file));
  if (mode == AuthMode::kToken) {
    absl::StatusOr<std::vector<std::string>> keys = ReadJobKeys(key_file);
    if (!keys.ok()) return keys.status();
    absl::MutexLock lock(&authorizer->mu_);
    authorizer->keys_ = *std::move(keys);
    StatFile(key_file, &authorizer->file_mtime_ns_, &authorizer->file_size_);
    authorizer->last_look_ = absl::Now();
  }
  return authorizer;
}

std::vector<std::string> JobAuthorizer::CurrentKeys() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - last_look_ < kKeyFileLook) return keys_;
  last_look_ = now;
  int64_t mtime_ns = 0, size = 0;
  if (!StatFile(key_file_, &mtime_ns, &size)) {
    Log(LogLevel::kWarning,
        absl::StrCat("auth: key file ", key_file_, " cannot be looked at; keeping its last keys"));
    return keys_;
  }
  if (mtime_ns == file_mtime_ns_ && size == file_size_) return keys_;
  // A version of the file already found unusable is not read (or warned
  // about) again until it changes.
  if (mtime_ns == refused_mtime_ns_ && size == refused_size_) return keys_;
  absl::StatusOr<std::vector<std::string>> keys = ReadJobKeys(key_file_);
  if (!keys.ok()) {
    refused_mtime_ns_ = mtime_ns;
    refused_size_ = size;
    Log(LogLevel::kWarning,
        absl::StrCat("auth: ", keys.status().message(), "; keeping the keys last read"));
    return keys_;
  }
  keys_ = *std::move(keys);
  file_mtime_ns_ = mtime_ns;
  file_size_ = size;
  Log(LogLevel::kInfo, absl::StrCat("auth: read ", keys_.size(), " key(s) from ", key_file_));
  return keys_;
}

absl::Status JobAuthorizer::Authorize(const CallerCredentials& caller,
                                      const std::string& job_id) {
  switch (mode_) {
    case AuthMode::kNone:
      return absl::OkStatus();
    case AuthMode::kToken: {
      if (!caller.has_authorization) {
        return absl::UnauthenticatedError(
            "this planner needs a job token: metadata 'authorization: Bearer <token>' "
            "(knapformer token --job ID; KNAPFORMER_PLANNER_TOKEN)");
      }
      absl::string_view token = caller.bearer_token;
      // "kf1.<64 hex>" for one job, "kf1.<64 hex>.<prefix ending in />" for
      // every job under the prefix (the MAC is of the prefix).
      const size_t mac_end = kTokenPrefix.size() + 64;
      const bool scoped = token.size() > mac_end + 1 && token[mac_end] == '.' &&
                          token.back() == '/';
      if (!caller.authorization_is_bearer || !absl::StartsWith(token, kTokenPrefix) ||
          (token.size() != mac_end && !scoped)) {
        return absl::UnauthenticatedError(
            "authorization: not 'Bearer kf1.<64 hex digits>[.<job id prefix>/]' "
            "(knapformer token --job ID)");
      }
      const std::string scope = scoped ? std::string(token.substr(mac_end + 1)) : job_id;
      if (scoped && !absl::StartsWith(job_id, scope)) {
        return absl::PermissionDeniedError(
            "authorization: the token is not this planner's token for the job the request names");
      }
      const absl::string_view mac = token.substr(0, mac_end);
      for (const std::string& key : CurrentKeys()) {
        const std::string expected = MintJobToken(key, scope);
        if (CRYPTO_memcmp(expected.data(), mac.data(), expected.size()) == 0) {
          return absl::OkStatus();
        }
      }
      return absl::PermissionDeniedError(
          "authorization: the token is not this planner's token for the job the request names");
    }
    case AuthMode::kMtls: {
      if (caller.certificate_names.empty()) {
        return absl::UnauthenticatedError(
            "this planner needs a client certificate whose DNS or URI name names the job");
      }
      for (const std::string& name : caller.certificate_names) {
        if (name == job_id) return absl::OkStatus();
        const std::string ns = SpiffeNamespace(name);
        if (!ns.empty() && absl::StartsWith(job_id, absl::StrCat(ns, "/"))) {
          return absl::OkStatus();
        }
      }
      return absl::PermissionDeniedError(
          "the client certificate names neither the job the request names nor its namespace "
          "(a DNS or URI name equal to the job id, or spiffe://DOMAIN/ns/NS/... for a job "
          "'NS/...')");
    }
  }
  return absl::InternalError("auth: unknown mode");
}

}  // namespace knapformer
