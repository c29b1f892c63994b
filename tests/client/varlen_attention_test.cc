// The block-sparse masked attention equals dense attention under the same
// mask, built here pair by pair from the masks' definitions: outputs and
// gradients, float64, every kind of mask and lengths around the query
// block's size.
#include "client/varlen_attention.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <torch/torch.h>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

bool Attends(const AttentionMask& mask, int64_t q, int64_t k) {
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      return true;
    case AttentionMask::Kind::kCausal:
      return k <= q;
    case AttentionMask::Kind::kWindow:
      return k <= q && q - k < mask.window;
    case AttentionMask::Kind::kSpans: {
      int64_t start = 0;
      for (const MaskSpan& span : mask.spans) {
        const int64_t end = start + span.length;
        if (q < end) return k < start || (k < end && (!span.causal || k <= q));
        start = end;
      }
      return false;
    }
  }
  return false;
}

at::Tensor DenseAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::vector<int64_t>& lengths,
                          const std::vector<AttentionMask>& masks) {
  std::vector<at::Tensor> out;
  int64_t start = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t l = lengths[i];
    if (l == 0) continue;
    at::Tensor allowed = torch::zeros({l, l}, torch::kBool);
    for (int64_t a = 0; a < l; ++a) {
      for (int64_t b = 0; b < l; ++b) allowed[a][b] = Attends(masks[i], a, b);
    }
    at::Tensor qs = q.narrow(0, start, l).transpose(0, 1);
    at::Tensor ks = k.narrow(0, start, l).transpose(0, 1);
    at::Tensor vs = v.narrow(0, start, l).transpose(0, 1);
    at::Tensor scores = torch::matmul(qs, ks.transpose(1, 2)) / std::sqrt(double(q.size(2)));
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
    out.push_back(torch::matmul(torch::softmax(scores, -1), vs).transpose(0, 1));
    start += l;
  }
  return torch::cat(out, 0);
}

TEST(VarlenAttentionTest, BlockSparseMaskedAttentionEqualsDenseAttention) {
  std::mt19937_64 random(5);
  std::vector<int64_t> lengths;
  std::vector<AttentionMask> masks;
  for (int64_t l : {1, 7, 127, 128, 129, 300}) {
    std::vector<MaskSpan> spans;
    for (int64_t left = l; left > 0;) {
      const int64_t n = std::min<int64_t>(left, 1 + random() % 90);
      spans.push_back({n, random() % 2 == 0});
      left -= n;
    }
    for (const AttentionMask& mask :
         {AttentionMask::Full(), AttentionMask::Causal(), AttentionMask::Window(1),
          AttentionMask::Window(50), AttentionMask::Window(1000), AttentionMask::Spans(spans)}) {
      lengths.push_back(l);
      masks.push_back(mask);
    }
  }
  lengths.push_back(0);
  masks.push_back(AttentionMask::Causal());
  int64_t rows = 0;
  for (int64_t l : lengths) rows += l;
  torch::manual_seed(3);
  auto make = [&] { return torch::randn({rows, 2, 4}, torch::kDouble).requires_grad_(true); };
  at::Tensor q = make(), k = make(), v = make();
  at::Tensor upstream = torch::randn({rows, 2, 4}, torch::kDouble);
  at::Tensor sparse = VarlenAttention(q, k, v, lengths, masks);
  auto sparse_grads = torch::autograd::grad({(sparse * upstream).sum()}, {q, k, v});
  at::Tensor dense = DenseAttention(q, k, v, lengths, masks);
  auto dense_grads = torch::autograd::grad({(dense * upstream).sum()}, {q, k, v});
  EXPECT_TRUE(torch::allclose(sparse, dense, 1e-12, 1e-13))
      << (sparse - dense).abs().max().item<double>();
  for (int t = 0; t < 3; ++t) {
    EXPECT_TRUE(torch::allclose(sparse_grads[t], dense_grads[t], 1e-12, 1e-13)) << "input " << t;
  }
  // A masked sequence's answer differs from full attention's: the mask is used.
  at::Tensor full = VarlenAttention(q, k, v, lengths);
  EXPECT_FALSE(torch::allclose(full, dense, 1e-6, 1e-6));
}

}  // namespace
}  // namespace knapformer
