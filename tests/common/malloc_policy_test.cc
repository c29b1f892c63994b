#include "common/malloc_policy.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Escapes the blocks so the compiler cannot elide a malloc/free pair.
void* volatile escaped = nullptr;

// Bytes malloc serves from mmap (hblkhd) while `count` blocks of `bytes` are
// live, and free bytes it keeps in its heaps (fordblks) once they are freed.
struct Observed {
  size_t mmapped_while_live = 0;
  size_t kept_after_free = 0;
};

Observed AllocateAndFree(size_t bytes, int count) {
  Observed observed;
  // Reserved first: a vector buffer allocated after the last block would sit
  // between it and the heap top, and nothing could ever be trimmed.
  std::vector<void*> blocks;
  blocks.reserve(count);
  for (int i = 0; i < count; ++i) {
    blocks.push_back(std::malloc(bytes));
    std::memset(blocks.back(), 1, bytes);
    escaped = blocks.back();
  }
  observed.mmapped_while_live = mallinfo2().hblkhd;
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) std::free(*it);
  escaped = nullptr;
  observed.kept_after_free = mallinfo2().fordblks;
  return observed;
}

// One test: the policy is process-wide and cannot be undone, so glibc's
// default is observed first, in the same process. glibc adapts its
// thresholds to the largest mmapped block freed (16 MiB here: mmap above
// it, trim above 32 MiB of free heap top), so the later blocks are larger
// than that: 24 MiB blocks, three of them.
TEST(MallocPolicyTest, BlocksComeFromTheHeapAndStayForReuse) {
  const Observed before = AllocateAndFree(16 * kMiB, 1);
  EXPECT_GE(before.mmapped_while_live, 16 * kMiB);  // its own mmap
  EXPECT_LT(before.kept_after_free, 16 * kMiB);     // unmapped on free

  ASSERT_TRUE(RetainFreedMemory().ok());
  const Observed after = AllocateAndFree(24 * kMiB, 3);
  EXPECT_LT(after.mmapped_while_live, 24 * kMiB);  // from the heap
  EXPECT_GE(after.kept_after_free, 72 * kMiB);     // not trimmed

  // Above RetainFreedMemory's 32 MiB a block that no free heap space fits
  // (72 MiB are free now) is still its own mmap, unmapped on free ...
  const Observed large = AllocateAndFree(128 * kMiB, 1);
  EXPECT_GE(large.mmapped_while_live, 128 * kMiB);
  // ... and with KeepAllFreedMemory (train-sim's ranks) none is, of any size.
  ASSERT_TRUE(KeepAllFreedMemory().ok());
  const Observed kept = AllocateAndFree(128 * kMiB, 2);
  EXPECT_EQ(kept.mmapped_while_live, 0u);
  EXPECT_GE(kept.kept_after_free, 256 * kMiB);
}

}  // namespace
}  // namespace knapformer
