#ifndef KNAPFORMER_PLANNER_CHUNK_TABLE_CACHE_H_
#define KNAPFORMER_PLANNER_CHUNK_TABLE_CACHE_H_

#include <cstdint>
#include <mutex>
#include <vector>

#include "planner/plan.h"

namespace knapformer {

// The chunk table of a plan its owner is done with, kept for the next plan
// to fill instead of allocating one (BalancerOptions::chunk_tables).
//
// Why: a plan of 65,536 GPUs has a chunk table of 32 MiB (g4) to 64 MiB
// (g8), past the largest block glibc's malloc serves from its heap (32 MiB,
// common/malloc_policy.h), so every step mapped a fresh one and the kernel
// cleared its pages: 3-16% of planning g4 and g8 there (bench/planner_curve).
// A planner that plans step after step (the service) gives each plan's
// table back once it has answered, and the next plan writes into pages
// already mapped.
//
// Keeps at most one table, the one of most room given back: memory held
// between steps is at most the largest plan's table (32 bytes a chunk,
// BalancerLimits::max_chunks at most). Thread-safe.
class ChunkTableCache {
 public:
  // Keeps `chunks`' storage when it has more room than the table kept, which
  // it then frees; else frees `chunks`.
  void GiveBack(std::vector<Chunk> chunks);

  // The kept table, holding `count` chunks, when it has room for them (it
  // is then no longer kept); else an empty table with no room reserved.
  // The chunks are the old plan's where it had that many (zeroed past its
  // end): only cut or grown at its end, so that the next plan writes each
  // chunk in place without a pass that clears 64 MiB first.
  std::vector<Chunk> Take(int64_t count);

  // The room of the table kept, in bytes (0: none).
  int64_t kept_bytes() const;

 private:
  mutable std::mutex mu_;
  std::vector<Chunk> kept_;  // guarded by mu_
};

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_CHUNK_TABLE_CACHE_H_
