#include "common/malloc_policy.h"

#include <malloc.h>

#include "absl/strings/str_cat.h"

namespace knapformer {

absl::Status RetainFreedMemory() {
  // mallopt returns 1 on success, 0 on error (e.g. a threshold past its maximum).
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocRetainMmapThreshold)) != 1) {
    return absl::InternalError(
        absl::StrCat("mallopt(M_MMAP_THRESHOLD, ", kMallocRetainMmapThreshold, ") failed"));
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocRetainTrimThreshold)) != 1) {
    return absl::InternalError(
        absl::StrCat("mallopt(M_TRIM_THRESHOLD, ", kMallocRetainTrimThreshold, ") failed"));
  }
  return absl::OkStatus();
}

absl::Status KeepAllFreedMemory() {
  if (mallopt(M_MMAP_MAX, 0) != 1) return absl::InternalError("mallopt(M_MMAP_MAX, 0) failed");
  // -1 disables trimming (glibc's documented "never" value).
  if (mallopt(M_TRIM_THRESHOLD, -1) != 1) {
    return absl::InternalError("mallopt(M_TRIM_THRESHOLD, -1) failed");
  }
  return absl::OkStatus();
}

}  // namespace knapformer
