#ifndef KNAPFORMER_SERVER_JOB_TOKEN_H_
#define KNAPFORMER_SERVER_JOB_TOKEN_H_

// The planner's bearer tokens (serve --auth=token; `knapformer token`): a
// credential that says what it is. Version 2:
//
//   kf2.<kind>.<expires>.<key id>.<token id>.<mac>.<scope>
//
//   kind      "job" (scope is one job id) or "prefix" (scope ends in "/":
//             every job id beginning with it, e.g. a namespace's)
//   expires   Unix seconds; the token is refused from then on
//   key id    8 hex digits naming the key it was minted under (KeyIdOf)
//   token id  16 random hex digits, for a revocation list
//   mac       64 hex digits: HMAC-SHA256 under the key of every field above
//             and the scope, the kind first, so a job token and a prefix
//             token are MACs of different messages (kf1 MACed the bare job id
//             or prefix alike, and job 'a/' 's token acted for every 'a/...')
//
// Fields hold no '.' but the scope, which is last and may.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace knapformer {

enum class TokenKind { kJob, kPrefix };
const char* TokenKindName(TokenKind kind);  // "job", "prefix"

struct JobToken {
  TokenKind kind = TokenKind::kJob;
  std::string scope;
  absl::Time expires;
  std::string key_id;
  std::string token_id;
  std::string mac;  // hex, as sent
};

// The key id of `key`: 8 hex digits of an HMAC of a fixed text under it
// (naming the key reveals nothing of it).
std::string KeyIdOf(absl::string_view key);

// 16 random hex digits (the system's CSPRNG).
std::string NewTokenId();
// Whether `text` is a token id: 16 lowercase hex digits.
bool IsTokenId(absl::string_view text);

// The token of `kind` for `scope` under `key`. REQUIRES: a prefix scope ends
// in "/", a job scope does not; token_id is 16 hex digits.
std::string MintToken(absl::string_view key, TokenKind kind, absl::string_view scope,
                      absl::Time expires, absl::string_view token_id);

// The fields of a version-2 token; Unauthenticated naming what is not one
// (a kf1 token is refused by name: it could be stretched).
absl::StatusOr<JobToken> ParseToken(absl::string_view text);

// Whether `token`'s MAC is the one `key` makes of its fields (constant time).
bool TokenMacMatches(const JobToken& token, absl::string_view key);

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_JOB_TOKEN_H_
