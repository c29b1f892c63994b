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

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/status.h"
#include "transport/transport.h"

namespace knapformer {

enum class Agreement { kOff, kOncePerStep, kEveryExchange };

// A transport failure or an agreed error inside an exchange; carries the
// status through torch's autograd (which rethrows exceptions as they are)
// back to the API.
class TransportError : public std::runtime_error {
 public:
  explicit TransportError(absl::Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// A row order (gather: row i of the result is row index[i] of the source)
// and its inverse; both undefined when it is the identity, which then costs
// nothing.
struct RowOrder {
  at::Tensor index;
  at::Tensor inverse;
  // The same in host memory (the tensors above when they are): an
  // exchange plans which rows are runs from them without reading a device.
  at::Tensor host_index;
  at::Tensor host_inverse;

  static RowOrder Of(const std::vector<int64_t>& rows);
  RowOrder Inverted() const { return {inverse, index, host_inverse, host_index}; }
};

// One tensor's part of an exchange's signature.
struct TensorSignature {
  int dtype = 0;  // a c10::ScalarType
  std::vector<int64_t> trailing;
  bool requires_grad = false;
  bool operator==(const TensorSignature& o) const {
    return dtype == o.dtype && trailing == o.trailing && requires_grad == o.requires_grad;
  }
};
using ExchangeSignature = std::vector<TensorSignature>;

// The signature of the tensors a caller passes to an exchange.
ExchangeSignature SignatureOf(const std::vector<at::Tensor>& xs);

// What the ranks of one group agreed about each call's exchanges: the
// signature and row size of the n-th exchange of the call in a step, kept
// from step to step (a trainer makes the same calls every step). The
// exchange expected of a call's n-th exchange is the n-th one agreed, else
// the call's last one agreed: every rank's book is the same, as it holds
// only what the group agreed, so every rank expects the same.
class ExchangeBook {
 public:
  struct Entry {
    ExchangeSignature signature;
    int64_t row_bytes = 0;                 // of all the tensors, as moved
    std::vector<int64_t> tensor_row_bytes;  // of each
  };
  // At every step: the calls count from 0 again.
  void StartStep() { next_.clear(); }
  // The ordinal of the call's next exchange in this step (counting it).
  int Next(const std::string& call) { return next_[call]++; }
  // What is expected of the call's `ordinal`-th exchange; null when the
  // group never agreed on one of this call.
  const Entry* Expected(const std::string& call, int ordinal) const;
  void Record(const std::string& call, int ordinal, Entry entry);
  // Forgets everything (the group changed).
  void Clear() {
    agreed_.clear();
    next_.clear();
  }

 private:
  std::map<std::string, std::vector<Entry>> agreed_;
  std::map<std::string, int> next_;
};

// One exchange of rows: the input's rows in `before` order are sent,
// send_rows[p] to group rank p, recv_rows[p] come from each, and the result
// is the received rows in `after` order. Counts were cross-checked once for
// the step, in PlanRouting.
struct RowMove {
  Transport* transport = nullptr;
  std::string what;  // the call, for errors
  Agreement agreement = Agreement::kOncePerStep;
  // A 0-element tensor owning the transport (OwnerTensor), or undefined when
  // the caller owns it. Saved in the autograd node, so a backward pass can
  // run after the balancer is gone.
  at::Tensor owner;
  const std::vector<int64_t>* send_rows = nullptr;
  const std::vector<int64_t>* recv_rows = nullptr;
  RowOrder before;
  RowOrder after;
  // Ulysses head groups. Each input row moves as `input_groups` rows, one per
  // group of heads (dimension 1 split evenly), group-major: group g of input
  // row t is moved row g * T + t for T input rows, so position g of a bag
  // receives its heads of every row (pre_attn). Each output row is made of
  // `output_groups` received rows the same way (post_attn). 1: rows move
  // whole. A move with groups sends one message per peer each way on
  // transports that move segments, every tensor's rows and then the flag
  // byte, packed in the one pass that gathers the head groups anyway.
  int64_t input_groups = 1;
  int64_t output_groups = 1;
  // The chain's "a backward has started" flag (a 1-element bool tensor
  // shared by the chain's nodes), or undefined when not chained.
  at::Tensor chain_started;
  // The world rank of each member of the group, by group rank: errors name
  // world ranks.
  std::vector<int> world_ranks;
  uint64_t step = 0;
  // A forward exchange: the step's book of the group and the signature of
  // the caller's tensors. Null in a backward pass.
  ExchangeBook* book = nullptr;
  int ordinal = 0;  // in the book: the call's ordinal-th exchange this step
  ExchangeSignature signature;
};

// The backward of `move`: the way back for the gradients of its outputs
// (counts transposed, orders inverted, no book: a backward exchange moves
// gradients shaped as its forward's outputs, so it only carries flags).
// What the autograd node of an exchange runs, and what
// SequenceBalancer::BackwardOf runs for the torch.compile custom ops.
RowMove Reversed(const RowMove& move);

// A 0-element tensor that owns `transport` (RowMove::owner).
at::Tensor OwnerTensor(std::shared_ptr<Transport> transport);

// Elements per row (the product of the sizes after dimension 0).
int64_t RowElements(const at::Tensor& x);

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
