#include "client/varlen_attention.h"

#include <cmath>

#include <ATen/ATen.h>

namespace knapformer {

at::Tensor VarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths) {
  std::vector<at::Tensor> out;
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  int64_t start = 0;
  for (int64_t length : lengths) {
    if (length == 0) continue;
    at::Tensor qs = q.narrow(0, start, length).transpose(0, 1);  // [heads, l, head_dim]
    at::Tensor ks = k.narrow(0, start, length).transpose(0, 1);
    at::Tensor vs = v.narrow(0, start, length).transpose(0, 1);
    at::Tensor weights = at::softmax(at::matmul(qs, ks.transpose(1, 2)) * scale, -1);
    out.push_back(at::matmul(weights, vs).transpose(0, 1));
    start += length;
  }
  // No tokens: an empty result that is still part of q's graph, so that
  // backward gives q (and what made it) a gradient.
  if (out.empty()) return q.narrow(0, 0, 0) * 1;
  return at::cat(out, 0);
}

}  // namespace knapformer
