#ifndef KNAPFORMER_CLIENT_ROW_EXCHANGE_H_
#define KNAPFORMER_CLIENT_ROW_EXCHANGE_H_

// The balancer's data movement (client/sequence_balancer.h): one exchange of
// rows between the ranks of a group, as an autograd node whose backward is
// the reverse exchange, and how the ranks agree that they can make it.
//
// Agreement. Every rank of the group must know, before it trusts what it
// received, that every peer moved rows of the same shape and did not give
// up; a rank that gave up alone would leave its peers waiting in the
// exchange. Three modes (Agreement):
//  - kOncePerStep (the default): the first exchange of each call (route,
//    reverse_route, pre_attn, post_attn) agrees in one small all-gather on
//    every rank's verdict and on the signature of its tensors (dtype, shape
//    after dimension 0 and requires_grad of each); the group's ExchangeBook
//    keeps it. Later exchanges of that call, in this step and the next ones,
//    move at once, with one status byte per rank carried with the rows (in
//    the rows' own messages where the transport moves segments: the last
//    byte of a message that packs a peer's rows, or a 1-byte message right
//    behind larger ones; else a flagged Transport::AllToAll). A rank whose
//    tensors differ from the call's agreed signature, or that fails on its
//    own (its rows, its device, an allocation), still moves the agreed
//    bytes, from scratch memory, with its flag raised: every rank sees the
//    flag in that same exchange, and then all of them agree on why (the one
//    all-gather of a failed exchange), so the error is the same on every
//    rank, at once, naming the world rank, the call, the field and both
//    values, and the transport stays usable for the next step. When every
//    rank changed its signature alike (a second route of other tensors), the
//    book records it for that exchange and the exchange runs again (once:
//    the next step expects it). Backward exchanges move gradients shaped as
//    their forward's outputs, so their signature was agreed in the forward:
//    they only carry flags (a local failure, e.g. out of memory).
//  - kEveryExchange (debugging): the all-gather before every exchange.
//  - kOff: no agreement; a rank's mistake is its own error and its peers
//    wait in the exchange until that process exits or the transport's
//    timeout.
//
// Includes only ATen's Tensor class; the autograd machinery stays in the .cc.
// What an exchange is (RowMove and the types it carries) is row_move.h's.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "client/row_move.h"
#include "transport/transport.h"

namespace knapformer {

// The backward of `move`: the way back for the gradients of its outputs
// (counts transposed, orders inverted, no book: a backward exchange moves
// gradients shaped as its forward's outputs, so it only carries flags).
// What the autograd node of an exchange runs, and what
// SequenceBalancer::BackwardOf runs for the torch.compile custom ops.
RowMove Reversed(const RowMove& move);

// A 0-element tensor that owns `transport` (RowMove::owner).
at::Tensor OwnerTensor(std::shared_ptr<Transport> transport);

// `move` of `xs` without recording a backward (a backward's own exchange
// when its graph is not recorded). Throws TransportError (c10::Error for
// torch's own).
std::vector<at::Tensor> MoveRowsOnce(at::TensorList xs, const RowMove& move);

// The exchange as an autograd node over `xs`, chained after `chain` (the
// previous exchange's link, or none): returns the moved tensors, then this
// exchange's link. Throws TransportError (c10::Error for torch's own).
std::vector<at::Tensor> MoveRowsWithGrad(at::TensorList xs, at::TensorList chain,
                                         const RowMove& move);

// Collective, in place of `move` on a rank that cannot make it (its tensors
// were refused before the exchange): takes part as the move's agreement
// requires, so that no peer waits, and returns the error every rank of the
// group returns. REQUIRES: !reason.ok().
absl::Status RefuseExchange(const RowMove& move, const absl::Status& reason);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_ROW_EXCHANGE_H_
