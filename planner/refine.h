#ifndef KNAPFORMER_PLANNER_REFINE_H_
#define KNAPFORMER_PLANNER_REFINE_H_

#include <cstdint>
#include <vector>

namespace knapformer {

struct RefineItem {
  double workload = 0;
  int32_t id = 0;       // global sequence id: the deterministic tie-break
  int64_t length = 0;   // tokens
  int32_t bag = 0;      // group-relative bag; updated in place
};

// Local refinement of a bag assignment, per-GPU load = assigned / gpus.
// Each round takes the most loaded bag H that is not yet known to be stuck and
// the least loaded bag L, and applies the single move (a sequence from H to L)
// or swap (a heavier sequence of H for a lighter one of L) that lowers
// max(load H, load L) the most; when none does, H is stuck and skipped from
// then on. A sequence only goes to a bag of at most its length in GPUs
// (sequences shorter than the smallest bag stay among the smallest bags).
// The sorted vector of loads only decreases, so max/mean never gets worse.
//
// `gpus[b]` is the size of bag b (ascending); `assigned[b]` its workload, kept
// up to date. Deterministic: ties go to the lowest sequence ids and bag ids.
void RefineBags(const std::vector<int32_t>& gpus, int32_t max_rounds,
                std::vector<RefineItem>& items, std::vector<double>& assigned);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_REFINE_H_
