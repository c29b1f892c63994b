#include "server/job_token.h"

#include <cstdlib>
#include <vector>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace knapformer {
namespace {

constexpr absl::string_view kVersion = "kf2";
constexpr size_t kKeyIdDigits = 8;
constexpr size_t kTokenIdDigits = 16;
constexpr size_t kMacDigits = 64;

std::string HexHmac(absl::string_view key, absl::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_bytes = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &mac_bytes);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), mac_bytes));
}

// What the MAC covers: a domain of its own for each kind (the kind first),
// then every other field, newline-separated (no field holds a newline).
std::string MacMessage(TokenKind kind, int64_t expires, absl::string_view key_id,
                       absl::string_view token_id, absl::string_view scope) {
  return absl::StrCat("knapformer token v2\n", TokenKindName(kind), "\n", expires, "\n", key_id,
                      "\n", token_id, "\n", scope);
}

bool IsLowerHex(absl::string_view text, size_t digits) {
  if (text.size() != digits) return false;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status NotAToken(absl::string_view why) {
  return absl::UnauthenticatedError(absl::StrCat(
      "authorization: not a knapformer token (", why,
      "; kf2.KIND.EXPIRES.KEY.ID.MAC.SCOPE, as `knapformer token` prints it)"));
}

}  // namespace

const char* TokenKindName(TokenKind kind) { return kind == TokenKind::kJob ? "job" : "prefix"; }

bool IsTokenId(absl::string_view text) { return IsLowerHex(text, kTokenIdDigits); }

std::string KeyIdOf(absl::string_view key) {
  return HexHmac(key, "knapformer key id").substr(0, kKeyIdDigits);
}

std::string NewTokenId() {
  unsigned char bytes[kTokenIdDigits / 2];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // No entropy is fatal to minting; an all-zero id would be one for all.
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

std::string MintToken(absl::string_view key, TokenKind kind, absl::string_view scope,
                      absl::Time expires, absl::string_view token_id) {
  const int64_t seconds = absl::ToUnixSeconds(expires);
  const std::string key_id = KeyIdOf(key);
  return absl::StrCat(kVersion, ".", TokenKindName(kind), ".", seconds, ".", key_id, ".", token_id,
                      ".", HexHmac(key, MacMessage(kind, seconds, key_id, token_id, scope)), ".",
                      scope);
}

absl::StatusOr<JobToken> ParseToken(absl::string_view text) {
  if (absl::StartsWith(text, "kf1.")) {
    return absl::UnauthenticatedError(
        "authorization: a kf1 token, which this planner no longer accepts (a job's kf1 token "
        "could act as every job under it); mint a kf2 token: knapformer token --job ID --ttl 30d");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(text, absl::MaxSplits('.', 6));
  if (parts.size() != 7 || parts[0] != kVersion) return NotAToken("no kf2. fields");
  JobToken token;
  if (parts[1] == "job") {
    token.kind = TokenKind::kJob;
  } else if (parts[1] == "prefix") {
    token.kind = TokenKind::kPrefix;
  } else {
    return NotAToken("its kind is neither job nor prefix");
  }
  int64_t expires = 0;
  if (!absl::SimpleAtoi(parts[2], &expires) || expires <= 0 ||
      parts[2] != absl::StrCat(expires)) {
    return NotAToken("its expiry is not Unix seconds");
  }
  token.expires = absl::FromUnixSeconds(expires);
  if (!IsLowerHex(parts[3], kKeyIdDigits)) return NotAToken("its key id is not 8 hex digits");
  if (!IsTokenId(parts[4])) return NotAToken("its id is not 16 hex digits");
  if (!IsLowerHex(parts[5], kMacDigits)) return NotAToken("its MAC is not 64 hex digits");
  token.scope = std::string(parts[6]);
  if (token.scope.empty()) return NotAToken("its scope is empty");
  if ((token.kind == TokenKind::kPrefix) != absl::EndsWith(token.scope, "/")) {
    return NotAToken("a prefix scope ends in '/', and only a prefix scope does");
  }
  token.key_id = std::string(parts[3]);
  token.token_id = std::string(parts[4]);
  token.mac = std::string(parts[5]);
  return token;
}

bool TokenMacMatches(const JobToken& token, absl::string_view key) {
  const std::string expected =
      HexHmac(key, MacMessage(token.kind, absl::ToUnixSeconds(token.expires), token.key_id,
                              token.token_id, token.scope));
  return expected.size() == token.mac.size() &&
         CRYPTO_memcmp(expected.data(), token.mac.data(), expected.size()) == 0;
}

}  // namespace knapformer
