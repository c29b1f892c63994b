#ifndef KNAPFORMER_CLIENT_VARLEN_ATTENTION_H_
#define KNAPFORMER_CLIENT_VARLEN_ATTENTION_H_

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace knapformer {

// Plain softmax(q k^T / sqrt(head_dim)) v over each sequence of a packed
// batch separately: q, k, v are [sum(lengths), heads, head_dim]. A CPU
// reference for examples and tests (a trainer uses its own fused kernel,
// e.g. flash-attention's varlen entry point, on the same lengths).
at::Tensor VarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_VARLEN_ATTENTION_H_
