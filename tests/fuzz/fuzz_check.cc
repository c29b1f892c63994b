#include "tests/fuzz/fuzz_check.h"

#include <cstdio>
#include <cstdlib>

namespace knapformer::fuzz {

void Fail(absl::string_view what, absl::string_view detail) {
  std::fprintf(stderr, "fuzz property broken: %.*s %.*s\n", static_cast<int>(what.size()),
               what.data(), static_cast<int>(detail.size()), detail.data());
  std::abort();
}

}  // namespace knapformer::fuzz
