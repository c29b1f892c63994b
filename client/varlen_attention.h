#ifndef KNAPFORMER_CLIENT_VARLEN_ATTENTION_H_
#define KNAPFORMER_CLIENT_VARLEN_ATTENTION_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "planner/attention_mask.h"

namespace knapformer {

// Plain softmax(q k^T / sqrt(head_dim)) v over each sequence of a packed
// batch separately: q, k, v are [sum(lengths), heads, head_dim]. A CPU
// reference for examples and tests (a trainer uses its own fused kernel,
// e.g. flash-attention's varlen entry point, on the same lengths).
at::Tensor VarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths);

// The same with each sequence's attention mask (masks[i] for lengths[i];
// empty: all full), e.g. SequenceBalancer::attention_masks() after PreAttn.
// Block-sparse, as a FlexAttention block mask runs: each span of a
// block-causal sequence, and each block of 128 queries of a causal or
// windowed one, attends only to the keys it may see, so the work follows
// the pairs attended rather than l^2. REQUIRES: masks is empty or one valid
// mask per length (CheckMask).
at::Tensor VarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths,
                           const std::vector<AttentionMask>& masks);

// [length, length] booleans: true where query i attends to key j.
at::Tensor AttendsMatrix(int64_t length, const AttentionMask& mask);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_VARLEN_ATTENTION_H_
