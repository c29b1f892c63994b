#include "proto/mask_proto.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<AttentionMask> MaskFromProto(const v1::AttentionMask& proto,
                                            const std::string& field) {
  switch (proto.kind()) {
    case v1::AttentionMask::FULL:
      return AttentionMask::Full();
    case v1::AttentionMask::CAUSAL:
      return AttentionMask::Causal();
    case v1::AttentionMask::WINDOW:
      return AttentionMask::Window(proto.window());
    case v1::AttentionMask::SPANS: {
      if (proto.span_causal_size() != 0 && proto.span_causal_size() != proto.span_lengths_size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".span_causal: ", proto.span_causal_size(), " entries for ",
            proto.span_lengths_size(), " span_lengths (give as many, or none: all full)"));
      }
      if (proto.span_lengths_size() > AttentionMask::kMaxSpans) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".spans: ",
                                                       proto.span_lengths_size(),
                                                       " spans exceed the limit of ",
                                                       AttentionMask::kMaxSpans));
      }
      std::vector<MaskSpan> spans(proto.span_lengths_size());
      for (int j = 0; j < proto.span_lengths_size(); ++j) {
        spans[j] = {proto.span_lengths(j),
                    proto.span_causal_size() != 0 && proto.span_causal(j)};
      }
      return AttentionMask::Spans(std::move(spans));
    }
    default:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ".kind: unknown mask kind ",
                                                 static_cast<int>(proto.kind()),
                                                 " (FULL, CAUSAL, WINDOW or SPANS)"));
}

void MaskToProto(const AttentionMask& mask, v1::AttentionMask* out) {
  out->Clear();
  switch (mask.kind) {
    case AttentionMask::Kind::kFull:
      return;
    case AttentionMask::Kind::kCausal:
      out->set_kind(v1::AttentionMask::CAUSAL);
      return;
    case AttentionMask::Kind::kWindow:
      out->set_kind(v1::AttentionMask::WINDOW);
      out->set_window(mask.window);
      return;
    case AttentionMask::Kind::kSpans: {
      out->set_kind(v1::AttentionMask::SPANS);
      bool any_causal = false;
      for (const MaskSpan& span : mask.spans) {
        out->add_span_lengths(span.length);
        any_causal |= span.causal;
      }
      if (any_causal) {
        for (const MaskSpan& span : mask.spans) out->add_span_causal(span.causal);
      }
      return;
    }
  }
}

absl::Status CheckProtoMasks(const ProtoMasks& masks, const ProtoLengths& lengths,
                             const std::string& field) {
  if (masks.empty()) return absl::OkStatus();
  if (masks.size() != lengths.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", masks.size(), " masks for ", lengths.size(),
        " sequences (give one per sequence, or none at all)"));
  }
  for (int i = 0; i < masks.size(); ++i) {
    const std::string mask_field = absl::StrCat(field, "[", i, "]");
    absl::StatusOr<AttentionMask> mask = MaskFromProto(masks.Get(i), mask_field);
    if (!mask.ok()) return mask.status();
    if (absl::Status status = CheckMask(lengths.Get(i), *mask, mask_field); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RankMasks> DecodeRankMasks(
    int32_t ranks, const std::function<const ProtoLengths&(int32_t)>& lengths_of,
    const std::function<const ProtoMasks&(int32_t)>& masks_of,
    const std::function<std::string(int32_t)>& field_of) {
  int32_t first_with_masks = -1;
  for (int32_t r = 0; r < ranks && first_with_masks < 0; ++r) {
    if (!masks_of(r).empty()) first_with_masks = r;
  }
  if (first_with_masks < 0) return RankMasks();
  RankMasks masks(ranks);
  for (int32_t r = 0; r < ranks; ++r) {
    const ProtoMasks& given = masks_of(r);
    if (given.empty() && !lengths_of(r).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field_of(r), ": none for ", lengths_of(r).size(), " sequences, while ",
          field_of(first_with_masks),
          " gives masks (in a step with masks, every rank gives one per sequence)"));
    }
    masks[r].reserve(given.size());
    for (int i = 0; i < given.size(); ++i) {
      absl::StatusOr<AttentionMask> mask =
          MaskFromProto(given.Get(i), absl::StrCat(field_of(r), "[", i, "]"));
      if (!mask.ok()) return mask.status();
      masks[r].push_back(*std::move(mask));
    }
  }
  return masks;
}

absl::StatusOr<BalancerInput> BalancerInputFromProto(
    int32_t ranks, const std::function<const ProtoLengths&(int32_t)>& lengths_of,
    const std::function<const ProtoMasks&(int32_t)>& masks_of,
    const std::function<std::string(int32_t)>& field_of, const BalancerLimits& limits) {
  absl::StatusOr<RankMasks> masks = DecodeRankMasks(ranks, lengths_of, masks_of, field_of);
  if (!masks.ok()) return masks.status();
  RankLengths lengths(ranks);
  for (int32_t r = 0; r < ranks; ++r) lengths[r].assign(lengths_of(r).begin(), lengths_of(r).end());
  return BalancerInput::Check(ranks, std::move(lengths), *std::move(masks), limits,
                              [&](size_t r) { return field_of(static_cast<int32_t>(r)); });
}

}  // namespace knapformer
