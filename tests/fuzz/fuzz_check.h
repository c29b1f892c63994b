#ifndef KNAPFORMER_TESTS_FUZZ_FUZZ_CHECK_H_
#define KNAPFORMER_TESTS_FUZZ_FUZZ_CHECK_H_

// The fuzzers' oracle: a property that must hold for every input. A broken
// one aborts with its message, which libFuzzer reports as a crash (and the
// corpus test as a failure).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace knapformer::fuzz {

[[noreturn]] void Fail(absl::string_view what, absl::string_view detail = "");

inline void Require(bool holds, absl::string_view what, absl::string_view detail = "") {
  if (!holds) Fail(what, detail);
}

// `values` holds each of 0..values.size()-1 exactly once.
void RequirePermutation(std::vector<int64_t> values, absl::string_view what);

// A refusal of the service's request checks names the field ("spec.topology: ...").
void RequireNamesAField(const absl::Status& refused);

}  // namespace knapformer::fuzz

#endif  // KNAPFORMER_TESTS_FUZZ_FUZZ_CHECK_H_
