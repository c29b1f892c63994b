#include "planner/chunk_table_cache.h"

#include <utility>

namespace knapformer {

void ChunkTableCache::GiveBack(std::vector<Chunk> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  // The table not kept goes with `chunks`, after the lock is released.
  if (chunks.capacity() > kept_.capacity()) kept_.swap(chunks);
}

std::vector<Chunk> ChunkTableCache::Take(int64_t count) {
  std::vector<Chunk> table;
  std::lock_guard<std::mutex> lock(mu_);
  if (count >= 0 && kept_.capacity() >= static_cast<size_t>(count)) {
    table.swap(kept_);
    table.resize(count);
  }
  return table;
}

int64_t ChunkTableCache::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(kept_.capacity() * sizeof(Chunk));
}

}  // namespace knapformer
