#include "tests/fuzz/fuzz_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace knapformer::fuzz {

void Fail(absl::string_view what, absl::string_view detail) {
  std::fprintf(stderr, "fuzz property broken: %.*s %.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(detail.size()), detail.data());
  std::abort();
}

void RequirePermutation(std::vector<int64_t> values, absl::string_view what) {
  std::sort(values.begin(), values.end());
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    if (values[i] != i) Fail(what);
  }
}

void RequireNamesAField(const absl::Status& refused) {
  const std::string message(refused.message());
  Require(message.find(':') != std::string::npos, "a refused request names the field", message);
}

}  // namespace knapformer::fuzz
