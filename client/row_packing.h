#ifndef KNAPFORMER_CLIENT_ROW_PACKING_H_
#define KNAPFORMER_CLIENT_ROW_PACKING_H_

// How an exchange's rows are laid out (client/row_exchange.cc's building
// blocks): the send and receive buffers of an exchange that packs its
// tensors side by side as bytes, the head groups a Ulysses exchange splits
// and merges, and host rows addressed and copied in runs. Internal to the
// row_exchange library.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "absl/status/status.h"
#include "client/row_move.h"

namespace knapformer::row_packing {

int64_t Sum(const std::vector<int64_t>& values);

// An uninitialised contiguous tensor of `like`'s dtype and device. Host
// memory comes from the host tensor cache: a step allocates the same few
// large buffers every step, and fresh ones cost a page fault per page.
at::Tensor Empty(at::IntArrayRef shape, const at::Tensor& like);

// A torch error while preparing an exchange, as a status.
absl::Status FromTorchError(const c10::Error& e, const char* what);

// ---- Head groups (RowMove::input_groups, output_groups) -------------------

bool HasHeadGroups(const RowMove& move);

// Bytes of one exchanged row of x: a head group of its row when its rows
// split into groups, else its whole row.
int64_t MovedRowBytes(const at::Tensor& x, const RowMove& move);

// The shape of x's output, `received` rows having arrived: [received,
// heads / groups, ...] when x's rows split into groups, [received / groups,
// heads * groups, ...] when the output's rows are made of groups.
std::vector<int64_t> OutputShape(const at::Tensor& x, const RowMove& move, int64_t received);

// ---- Packed exchanges -----------------------------------------------------

// The buffers of one exchange: the send buffer in send order and the
// receive buffer; for several tensors both are [rows, row bytes] of bytes,
// each tensor's rows in its own columns.
struct Packed {
  bool single = true;
  at::Tensor send, received;
  int64_t word = 1;  // several tensors: the columns' element size
};

// One tensor moves as it is (its head groups split in one pass first);
// several are packed side by side as bytes (so each keeps its dtype, bit for
// bit, and Gloo's refusal of bf16 does not matter), each gathered into its
// columns in one pass, its head groups split in the same pass.
absl::Status Pack(at::TensorList xs, const RowMove& move, int64_t row_bytes, Packed* packed);

// The outputs of a packed exchange: each tensor's rows in `after` order,
// its head groups merged, in one pass.
std::vector<at::Tensor> Unpack(at::TensorList xs, const RowMove& move, const Packed& packed);

// ---- Host rows ------------------------------------------------------------

// Where the exchange's rows lie in one tensor's host memory: row v of the
// exchange is `bytes` bytes at At(v). Without head groups that is row v of
// the tensor; with them (RowMove::input_groups / output_groups) it is group
// v / rows of tensor row v % rows.
struct RowAddress {
  char* base = nullptr;
  int64_t rows = 0;    // the tensor's rows
  int64_t stride = 0;  // bytes from one tensor row to the next
  int64_t bytes = 0;   // bytes of one exchanged row
  int64_t groups = 1;
  char* At(int64_t v) const {
    if (groups == 1) return base + v * stride;
    return base + (v % rows) * stride + (v / rows) * bytes;
  }
  // Rows of `bytes` one after another from `data` (a message's).
  static RowAddress Packed(char* data, int64_t bytes) { return {data, 0, bytes, bytes, 1}; }
};

// Host rows: for i in [0, count), exchanged row src_rows[src_begin + i] of
// `src` to row dst_rows[dst_begin + i] of `dst` (an index that is null: the
// row itself), one memcpy per run of rows that lie one after another on
// both sides. Torch's index_copy_ moves one element at a time; this moves
// the run's bytes.
void CopyHostRows(const RowAddress& src, const int64_t* src_rows, int64_t src_begin,
                  const RowAddress& dst, const int64_t* dst_rows, int64_t dst_begin,
                  int64_t count);

}  // namespace knapformer::row_packing

#endif  // KNAPFORMER_CLIENT_ROW_PACKING_H_
