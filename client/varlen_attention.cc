#include "client/varlen_attention.h"

#include <cmath>
#include <algorithm>
#include <limits>

#include <ATen/ATen.h>

namespace knapformer {

namespace {

// Queries of causal and windowed sequences go in blocks of this many, each
// against only the keys it may see: the work follows the pairs attended
// (plus a block's triangle), as a block-sparse kernel's does.
constexpr int64_t kQueryBlock = 128;

// Queries [q_begin, q_end) against keys [k_begin, k_end) of one sequence;
// `masked`: some pair in it is not attended.
struct Block {
  int64_t q_begin, q_end, k_begin, k_end;
  bool masked;
};

std::vector<Block> BlocksOf(int64_t length, const AttentionMask& mask) {
  std::vector<Block> blocks;
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      blocks.push_back({0, length, 0, length, false});
      break;
    case AttentionMask::Kind::kSpans: {
      int64_t begin = 0;
      for (const MaskSpan& span : mask.spans) {
        blocks.push_back({begin, begin + span.length, 0, begin + span.length, span.causal});
        begin += span.length;
      }
      break;
    }
    case AttentionMask::Kind::kCausal:
    case AttentionMask::Kind::kWindow:
      for (int64_t begin = 0; begin < length; begin += kQueryBlock) {
        const int64_t end = std::min(length, begin + kQueryBlock);
        const int64_t first_key = mask.kind == AttentionMask::Kind::kWindow
                                      ? std::max<int64_t>(0, begin - mask.window + 1)
                                      : 0;
        blocks.push_back({begin, end, first_key, end, true});
      }
      break;
  }
  return blocks;
}

// Booleans of `block`: true where its query attends to its key.
at::Tensor AttendsBlock(const AttentionMask& mask, const Block& block) {
  const at::Tensor row = at::arange(block.q_begin, block.q_end, at::kLong).unsqueeze(1);
  const at::Tensor col = at::arange(block.k_begin, block.k_end, at::kLong).unsqueeze(0);
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      break;
    case AttentionMask::Kind::kCausal:
      return col <= row;
    case AttentionMask::Kind::kWindow:
      return (col <= row).logical_and(row - col < mask.window);
    case AttentionMask::Kind::kSpans: {
      // Each token's span: a key attends when its span is earlier, or the
      // same span attended fully, or causally with key <= query.
      std::vector<int64_t> span_of, causal_of;
      for (size_t s = 0; s < mask.spans.size(); ++s) {
        span_of.insert(span_of.end(), mask.spans[s].length, static_cast<int64_t>(s));
        causal_of.insert(causal_of.end(), mask.spans[s].length, mask.spans[s].causal ? 1 : 0);
      }
      const at::Tensor span = at::tensor(span_of, at::kLong);
      const at::Tensor query_span = span.slice(0, block.q_begin, block.q_end).unsqueeze(1);
      const at::Tensor key_span = span.slice(0, block.k_begin, block.k_end).unsqueeze(0);
      const at::Tensor causal = at::tensor(causal_of, at::kLong)
                                    .slice(0, block.q_begin, block.q_end)
                                    .to(at::kBool)
                                    .unsqueeze(1);
      const at::Tensor same = query_span == key_span;
      return (key_span < query_span)
          .logical_or(same.logical_and(causal.logical_not().logical_or(col <= row)));
    }
  }
  return at::ones({block.q_end - block.q_begin, block.k_end - block.k_begin}, at::kBool);
}

}  // namespace

at::Tensor AttendsMatrix(int64_t length, const AttentionMask& mask) {
  return AttendsBlock(mask, {0, length, 0, length, true});
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
  const AttentionMask full;
  int64_t start = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t length = lengths[i];
    if (length == 0) continue;
    const AttentionMask& mask = masks.empty() ? full : masks[i];
    for (const Block& block : BlocksOf(length, mask)) {
      // [heads, rows, head_dim]
      at::Tensor qs = q.narrow(0, start + block.q_begin, block.q_end - block.q_begin).transpose(0, 1);
      at::Tensor ks = k.narrow(0, start + block.k_begin, block.k_end - block.k_begin).transpose(0, 1);
      at::Tensor vs = v.narrow(0, start + block.k_begin, block.k_end - block.k_begin).transpose(0, 1);
      at::Tensor scores = at::matmul(qs, ks.transpose(1, 2)) * scale;
      if (block.masked) {
        // Every query attends at least to itself: no row is all -inf.
        scores = scores.masked_fill(AttendsBlock(mask, block).logical_not(),
                                    -std::numeric_limits<double>::infinity());
      }
      out.push_back(at::matmul(at::softmax(scores, -1), vs).transpose(0, 1));
    }
    start += length;
  }
  // No tokens: an empty result that is still part of q's graph, so that
  // backward gives q (and what made it) a gradient.
  if (out.empty()) return q.narrow(0, 0, 0) * 1;
  return at::cat(out, 0);
}

}  // namespace knapformer
