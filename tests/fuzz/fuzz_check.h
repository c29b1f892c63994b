#ifndef KNAPFORMER_TESTS_FUZZ_FUZZ_CHECK_H_
#define KNAPFORMER_TESTS_FUZZ_FUZZ_CHECK_H_

// The fuzzers' oracle: a property that must hold for every input. A broken
// one aborts with its message, which libFuzzer reports as a crash (and the
// corpus test as a failure).

#include <string>

#include "absl/strings/string_view.h"

namespace knapformer::fuzz {

[[noreturn]] void Fail(absl::string_view what, absl::string_view detail = "");

inline void Require(bool holds, absl::string_view what, absl::string_view detail = "") {
  if (!holds) Fail(what, detail);
}

}  // namespace knapformer::fuzz

#endif  // KNAPFORMER_TESTS_FUZZ_FUZZ_CHECK_H_
