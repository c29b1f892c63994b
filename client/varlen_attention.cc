#include "client/varlen_attention.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

namespace knapformer {

at::Tensor AttendsMatrix(int64_t length, const AttentionMask& mask) {
  const at::Tensor row = at::arange(length, at::kLong).unsqueeze(1);  // query i
  const at::Tensor col = at::arange(length, at::kLong).unsqueeze(0);  // key j
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      break;
    case AttentionMask::Kind::kCausal:
      return col <= row;
    case AttentionMask::Kind::kWindow:
      return (col <= row).logical_and(row - col < mask.window);
    case AttentionMask::Kind::kSpans: {
      // Each token's span index: a key attends when its span is earlier,
      // or the same span attended fully, or causally with j <= i.
      std::vector<int64_t> span_of, causal_of;
      for (size_t s = 0; s < mask.spans.size(); ++s) {
        span_of.insert(span_of.end(), mask.spans[s].length, static_cast<int64_t>(s));
        causal_of.insert(causal_of.end(), mask.spans[s].length, mask.spans[s].causal ? 1 : 0);
      }
      const at::Tensor span = at::tensor(span_of, at::kLong);
      const at::Tensor causal = at::tensor(causal_of, at::kLong).to(at::kBool).unsqueeze(1);
      const at::Tensor query_span = span.unsqueeze(1), key_span = span.unsqueeze(0);
      const at::Tensor same = query_span == key_span;
      return (key_span < query_span)
          .logical_or(same.logical_and(causal.logical_not().logical_or(col <= row)));
    }
  }
  return at::ones({length, length}, at::kBool);
}

at::Tensor VarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths) {
  return VarlenAttention(q, k, v, lengths, {});
}

at::Tensor VarlenAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& lengths,
                           const std::vector<AttentionMask>& masks) {
  std::vector<at::Tensor> out;
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  int64_t start = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t length = lengths[i];
    if (length == 0) continue;
    at::Tensor qs = q.narrow(0, start, length).transpose(0, 1);  // [heads, l, head_dim]
    at::Tensor ks = k.narrow(0, start, length).transpose(0, 1);
    at::Tensor vs = v.narrow(0, start, length).transpose(0, 1);
    at::Tensor scores = at::matmul(qs, ks.transpose(1, 2)) * scale;
    if (!masks.empty() && masks[i].kind != AttentionMask::Kind::kFull) {
      // Every query attends at least to itself: no row is all -inf.
      scores = scores.masked_fill(AttendsMatrix(length, masks[i]).logical_not(),
                                  -std::numeric_limits<double>::infinity());
    }
    at::Tensor weights = at::softmax(scores, -1);
    out.push_back(at::matmul(weights, vs).transpose(0, 1));
    start += length;
  }
  // No tokens: an empty result that is still part of q's graph, so that
  // backward gives q (and what made it) a gradient.
  if (out.empty()) return q.narrow(0, 0, 0) * 1;
  return at::cat(out, 0);
}

}  // namespace knapformer
