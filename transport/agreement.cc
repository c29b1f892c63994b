#include "transport/agreement.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knapformer {
namespace {

// A verdict on the wire: int32 status code, int64 row bytes, then the
// message (empty when Ok). Fixed-width fields in host order: every rank of
// a group runs this same binary family on one architecture.
constexpr size_t kHeader = sizeof(int32_t) + sizeof(int64_t);

std::string Encode(const absl::Status& status, int64_t row_bytes) {
  std::string bytes(kHeader, '\0');
  const int32_t code = static_cast<int32_t>(status.code());
  std::memcpy(bytes.data(), &code, sizeof(code));
  std::memcpy(bytes.data() + sizeof(code), &row_bytes, sizeof(row_bytes));
  bytes.append(status.message().data(), status.message().size());
  return bytes;
}

}  // namespace

absl::Status AgreeOnStatus(Transport& transport, const absl::Status& mine, int64_t row_bytes) {
  auto all = transport.AllGatherBytes(Encode(mine, row_bytes));
  if (!all.ok()) return all.status();
  std::vector<int64_t> sizes(all->size(), -1);
  for (size_t p = 0; p < all->size(); ++p) {
    const std::string& bytes = (*all)[p];
    if (bytes.size() < kHeader) {
      return absl::InternalError(absl::StrCat("agreement: rank ", p, " sent ", bytes.size(),
                                              " bytes, fewer than a verdict's ", kHeader));
    }
    int32_t code = 0;
    std::memcpy(&code, bytes.data(), sizeof(code));
    std::memcpy(&sizes[p], bytes.data() + sizeof(code), sizeof(int64_t));
    if (code != 0) {
      if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
        code = static_cast<int32_t>(absl::StatusCode::kUnknown);
      }
      return absl::Status(static_cast<absl::StatusCode>(code),
                          absl::StrCat("rank ", p, ": ", bytes.substr(kHeader)));
    }
  }
  for (size_t p = 1; p < sizes.size(); ++p) {
    if (sizes[p] != sizes[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rows of ", sizes[0], " bytes on rank 0 but ", sizes[p], " on rank ", p,
          ": every rank must pass the same dtypes and trailing shapes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace knapformer
