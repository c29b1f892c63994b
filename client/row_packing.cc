#include "client/row_packing.h"

#include <cstring>
#include <numeric>
#include <utility>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "client/host_tensor_cache.h"

namespace knapformer::row_packing {
namespace {

// x as [rows, bytes per row] of kByte, sharing x's memory when it can. A
// tensor torch calls contiguous may still have odd strides where a size is 0
// or 1 (an expanded gradient of zero rows, say), which a byte view refuses:
// those are copied to plain strides first.
at::Tensor ByteRows(const at::Tensor& x) {
  const int64_t rows = x.size(0);
  const int64_t elements = RowElements(x);
  at::Tensor flat = x.resolve_conj().resolve_neg().contiguous().reshape({rows, elements});
  if (flat.stride(1) != 1 || (elements > 1 && flat.stride(0) != elements)) {
    flat = at::empty({rows, elements}, flat.options()).copy_(flat);
  }
  return flat.view(at::kByte);
}

// x's rows in `index` order (all of them, unchanged, when it is undefined).
at::Tensor Reordered(const at::Tensor& x, const at::Tensor& index) {
  if (!index.defined()) return x;
  at::Tensor out = Empty(x.sizes(), x);
  at::index_select_out(out, x, 0, index.to(x.device()));
  return out;
}

// [T, heads, ...] -> [groups * T, heads / groups, ...]: group g of every
// row, contiguous, where a packed exchange sends to position g (one pass).
at::Tensor SplitHeads(const at::Tensor& x, int64_t groups) {
  std::vector<int64_t> split = x.sizes().vec();
  split[1] /= groups;
  split.insert(split.begin() + 1, groups);
  std::vector<int64_t> rows(split.begin() + 1, split.end());
  rows[0] = groups * x.size(0);
  const at::Tensor view = x.reshape(split).transpose(0, 1);
  return Empty(view.sizes(), x).copy_(view).reshape(rows);
}

// The inverse: [groups * T, heads, ...] -> [T, groups * heads, ...].
at::Tensor MergeHeads(const at::Tensor& y, int64_t groups) {
  std::vector<int64_t> split = y.sizes().vec();
  split[0] /= groups;
  std::vector<int64_t> whole = split;
  whole[1] *= groups;
  split.insert(split.begin(), groups);
  const at::Tensor view = y.reshape(split).transpose(0, 1);
  return Empty(view.sizes(), y).copy_(view).reshape(whole);
}

// The widest element (8, 4, 2 or 1 bytes) that divides every size in
// `bytes` and aligns every tensor's memory: copies of columns move elements
// of this size, not one byte at a time.
int64_t WordSize(const std::vector<int64_t>& bytes, at::TensorList tensors) {
  for (int64_t w : {8, 4, 2}) {
    bool fits = true;
    for (int64_t b : bytes) fits = fits && b % w == 0;
    for (const at::Tensor& t : tensors) {
      fits = fits && reinterpret_cast<uintptr_t>(t.data_ptr()) % w == 0;
    }
    if (fits) return w;
  }
  return 1;
}

// A [rows, bytes] byte tensor as [rows, bytes / word] elements of `word` bytes.
at::Tensor Words(const at::Tensor& bytes, int64_t word) {
  switch (word) {
    case 8:
      return bytes.view(at::kLong);
    case 4:
      return bytes.view(at::kInt);
    case 2:
      return bytes.view(at::kShort);
    default:
      return bytes;
  }
}

}  // namespace

int64_t Sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

at::Tensor Empty(at::IntArrayRef shape, const at::Tensor& like) {
  if (like.device().is_cpu()) return EmptyHostTensor(shape, like.scalar_type());
  return at::empty(shape, like.options());
}

absl::Status FromTorchError(const c10::Error& e, const char* what) {
  const std::string message = absl::StrCat(what, ": ", e.what_without_backtrace());
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InvalidArgumentError(message);
}

bool HasHeadGroups(const RowMove& move) {
  return move.input_groups > 1 || move.output_groups > 1;
}

int64_t MovedRowBytes(const at::Tensor& x, const RowMove& move) {
  return RowElements(x) * static_cast<int64_t>(x.element_size()) / move.input_groups;
}

std::vector<int64_t> OutputShape(const at::Tensor& x, const RowMove& move, int64_t received) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = received / move.output_groups;
  if (HasHeadGroups(move)) shape[1] = shape[1] / move.input_groups * move.output_groups;
  return shape;
}

absl::Status Pack(at::TensorList xs, const RowMove& move, int64_t row_bytes, Packed* packed) {
  const int64_t send_count = Sum(*move.send_rows);
  const int64_t recv_count = Sum(*move.recv_rows);
  const int64_t groups = move.input_groups;
  packed->single = xs.size() == 1;
  try {
    if (packed->single) {
      // Conjugate and negative views are lazy bits on the tensor, not in its
      // bytes: resolve them before the bytes travel.
      at::Tensor x = xs[0].resolve_conj().resolve_neg().contiguous();
      if (groups > 1) x = SplitHeads(x, groups);
      packed->send = Reordered(x, move.before.index);
      std::vector<int64_t> shape = packed->send.sizes().vec();
      shape[0] = recv_count;
      packed->received = Empty(shape, packed->send);
      return absl::OkStatus();
    }
    std::vector<at::Tensor> bytes;
    std::vector<int64_t> sizes = {row_bytes};
    for (const at::Tensor& x : xs) {
      bytes.push_back(ByteRows(x));
      sizes.push_back(bytes.back().size(1));
      sizes.push_back(bytes.back().size(1) / groups);
    }
    packed->send = Empty({send_count, row_bytes}, bytes[0]);
    packed->received = Empty({recv_count, row_bytes}, packed->send);
    packed->word = WordSize(sizes, bytes);
    const at::Tensor send = Words(packed->send, packed->word);
    int64_t column = 0;
    for (const at::Tensor& b : bytes) {
      const at::Tensor words = Words(b, packed->word);
      const int64_t width = words.size(1) / groups;  // of a moved row
      at::Tensor slot = send.narrow(1, column, width);
      column += width;
      if (groups > 1 && !move.before.index.defined()) {
        // Moved row g * T + t is group g of row t: one strided copy.
        const int64_t rows = words.size(0);
        slot.view({groups, rows, width}).copy_(words.view({rows, groups, width}).transpose(0, 1));
        continue;
      }
      const at::Tensor rows = groups > 1 ? SplitHeads(words, groups) : words;
      if (move.before.index.defined()) {
        at::index_select_out(slot, rows, 0, move.before.index.to(rows.device()));
      } else {
        slot.copy_(rows);
      }
    }
  } catch (const c10::Error& e) {
    return FromTorchError(e, move.what.c_str());
  }
  return absl::OkStatus();
}

std::vector<at::Tensor> Unpack(at::TensorList xs, const RowMove& move, const Packed& packed) {
  const int64_t groups = move.output_groups;
  if (packed.single) {
    at::Tensor y = Reordered(packed.received, move.after.index);
    return {groups > 1 ? MergeHeads(y, groups) : y};
  }
  const int64_t recv_count = Sum(*move.recv_rows);
  const at::Tensor received = Words(packed.received, packed.word);
  std::vector<at::Tensor> outputs;
  int64_t column = 0;
  for (const at::Tensor& x : xs) {
    // Each output is a tensor of its own, not a view of the receive buffer,
    // which is freed here instead of living as long as any one output.
    at::Tensor out = Empty(OutputShape(x, move, recv_count), x);
    const int64_t rows = out.size(0);
    const at::Tensor out_words =
        Words(out.view({rows, RowElements(out)}).view(at::kByte), packed.word);
    const int64_t width = out_words.size(1) / groups;  // of a moved row
    at::Tensor slot = received.narrow(1, column, width);
    column += width;
    if (move.after.index.defined()) {
      slot = at::index_select(slot, 0, move.after.index.to(slot.device()));
    }
    if (groups > 1) {
      // Output row t's group g is moved row g * T + t: one strided copy.
      out_words.view({rows, groups, width}).transpose(0, 1).copy_(slot.view({groups, rows, width}));
    } else {
      out_words.copy_(slot);
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

void CopyHostRows(const RowAddress& src, const int64_t* src_rows, int64_t src_begin,
                  const RowAddress& dst, const int64_t* dst_rows, int64_t dst_begin,
                  int64_t count) {
  const int64_t bytes = src.bytes;
  if (count == 0 || bytes == 0) return;
  auto from = [&](int64_t i) {
    return src.At(src_rows != nullptr ? src_rows[src_begin + i] : src_begin + i);
  };
  auto to = [&](int64_t i) {
    return dst.At(dst_rows != nullptr ? dst_rows[dst_begin + i] : dst_begin + i);
  };
  for (int64_t i = 0; i < count;) {
    const char* s = from(i);
    char* d = to(i);
    int64_t run = 1;
    while (i + run < count && from(i + run) == s + run * bytes && to(i + run) == d + run * bytes) {
      ++run;
    }
    std::memcpy(d, s, run * bytes);
    i += run;
  }
}

}  // namespace knapformer::row_packing
