#ifndef KNAPFORMER_PROTO_MASK_PROTO_H_
#define KNAPFORMER_PROTO_MASK_PROTO_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/repeated_field.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/attention_mask.h"
#include "planner/balancer_input.h"

namespace knapformer {

using ProtoMasks = google::protobuf::RepeatedPtrField<v1::AttentionMask>;
using ProtoLengths = google::protobuf::RepeatedField<int64_t>;

// One mask from its message. InvalidArgument naming `field` for an unknown
// kind or span_causal of another size than span_lengths; its values are
// checked against the sequence by CheckMask.
absl::StatusOr<AttentionMask> MaskFromProto(const v1::AttentionMask& proto,
                                            const std::string& field);
void MaskToProto(const AttentionMask& mask, v1::AttentionMask* out);

// One rank's masks as a request carries them: none, or one valid mask per
// sequence. InvalidArgument naming `field` ("attention_masks[3].spans: ...").
absl::Status CheckProtoMasks(const ProtoMasks& masks, const ProtoLengths& lengths,
                             const std::string& field);

// A step's masks from each rank's list (masks_of(r), lengths_of(r) for r in
// [0, ranks)), decoded but not checked against their sequences (each rank
// checked its own; BalancerInput::Check checks the step): empty when no rank
// gives any, so that a step without masks is planned exactly as before.
// InvalidArgument naming field_of(r) when some ranks with sequences give
// masks and others none, or a mask does not decode (MaskFromProto).
absl::StatusOr<RankMasks> DecodeRankMasks(
    int32_t ranks, const std::function<const ProtoLengths&(int32_t)>& lengths_of,
    const std::function<const ProtoMasks&(int32_t)>& masks_of,
    const std::function<std::string(int32_t)>& field_of);

// A step's input from each rank's lists (lengths_of(r), masks_of(r) for r
// in [0, ranks)): DecodeRankMasks, then checked once (BalancerInput::Check,
// naming field_of(r) for rank r's masks).
absl::StatusOr<BalancerInput> BalancerInputFromProto(
    int32_t ranks, const std::function<const ProtoLengths&(int32_t)>& lengths_of,
    const std::function<const ProtoMasks&(int32_t)>& masks_of,
    const std::function<std::string(int32_t)>& field_of, const BalancerLimits& limits);

}  // namespace knapformer

#endif  // KNAPFORMER_PROTO_MASK_PROTO_H_
