#ifndef KNAPFORMER_CLIENT_ROW_MOVE_H_
#define KNAPFORMER_CLIENT_ROW_MOVE_H_

// What one exchange of rows is (row_exchange.h runs it): the move itself
// (RowMove), the orders around it, the signature of its tensors and the
// group's book of agreed signatures. Apart from row_exchange.h so that the
// exchange's agreement (exchange_agreement.h) and its buffers' layout
// (row_packing.h) need not include the exchange built on them.

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
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

// Elements per row (the product of the sizes after dimension 0).
int64_t RowElements(const at::Tensor& x);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_ROW_MOVE_H_
