#include "client/row_exchange.h"

#include <numeric>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>

#include "absl/strings/str_cat.h"
#include "client/exchange_agreement.h"
#include "client/host_tensor_cache.h"
#include "client/row_packing.h"

namespace knapformer {
namespace {

using row_packing::CopyHostRows;
using row_packing::Empty;
using row_packing::FromTorchError;
using row_packing::HasHeadGroups;
using row_packing::MovedRowBytes;
using row_packing::OutputShape;
using row_packing::Pack;
using row_packing::Packed;
using row_packing::RowAddress;
using row_packing::Sum;
using row_packing::Unpack;

// The device of the move's transport.
c10::Device TransportDevice(const Transport& transport) {
  const int cuda = transport.cuda_device();
  return cuda < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, cuda);
}

// Whether the transport moves segments of host memory (AllToAllOptions::Segments).
bool MovesHostSegments(const Transport& transport) {
  return transport.MovesSegments() && TransportDevice(transport).is_cpu();
}

// ---- The messages of an exchange that moves segments ---------------------

// A message to or from one peer. Three kinds: one tensor's rows (sent from
// where they lie or from staging, received likewise); every tensor's rows
// packed one after another and then the sender's flag byte (rows in head
// groups, which are gathered anyway, and small messages, for which a copy
// costs less than a message of its own for the flag); the flag byte alone,
// behind a peer's unpacked rows.
struct Message {
  enum Kind { kTensorRows, kPackedRows, kFlag };
  Kind kind = kTensorRows;
  int peer = 0;
  bool outgoing = true;
  size_t tensor = 0;  // kTensorRows
  int64_t rows = 0;   // kTensorRows, kPackedRows
  int64_t bytes = 0;  // on the wire, the flag byte included
};

// Rows to or from one peer up to this many bytes travel packed with the flag
// (Message::kPackedRows): one message instead of one per tensor plus one
// for the flag, where each message costs a wake-up on either side.
constexpr int64_t kPackedMessageBytes = int64_t{256} << 10;

bool PacksRows(const RowMove& move, int64_t bytes) {
  return HasHeadGroups(move) || bytes <= kPackedMessageBytes;
}

// The messages of a segment exchange, in the order every rank derives from
// the agreed counts and row sizes (`flagged`: the exchange carries every
// rank's flag): for each peer other than `me`, what goes to it, then what
// comes from it. Between two ranks, messages pair up in this order; the
// exchange and its stand-in from scratch must send exactly these, or their
// peers wait.
template <typename Visit>
void ForEachMessage(const std::vector<int64_t>& tensor_row_bytes, const RowMove& move, int me,
                    bool flagged, Visit&& visit) {
  const int64_t row_bytes = Sum(tensor_row_bytes);
  const int n = static_cast<int>(move.send_rows->size());
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    for (const bool outgoing : {true, false}) {
      const int64_t rows = outgoing ? (*move.send_rows)[p] : (*move.recv_rows)[p];
      if (PacksRows(move, rows * row_bytes)) {
        if (rows > 0 || flagged) {
          visit(Message{Message::kPackedRows, p, outgoing, 0, rows, rows * row_bytes + 1});
        }
        continue;
      }
      for (size_t t = 0; t < tensor_row_bytes.size(); ++t) {
        if (tensor_row_bytes[t] == 0) continue;
        visit(Message{Message::kTensorRows, p, outgoing, t, rows, rows * tensor_row_bytes[t]});
      }
      if (flagged) visit(Message{Message::kFlag, p, outgoing, 0, 0, 1});
    }
  }
}

// A flagged exchange of the agreed shape on behalf of a rank that cannot
// send its own rows: zeros out, received rows dropped, `flag` raised; the
// same messages as the peers' where the transport moves segments
// (ForEachMessage). Returns the flags, or the transport's error.
absl::StatusOr<std::vector<uint8_t>> FlaggedFromScratch(
    const RowMove& move, const std::vector<int64_t>& tensor_row_bytes, uint8_t flag) {
  Transport& transport = *move.transport;
  std::vector<uint8_t> flags;
  if (transport.size() == 1) return std::vector<uint8_t>{flag};  // no peer to tell
  const int64_t row_bytes = Sum(tensor_row_bytes);
  try {
    const auto options = at::TensorOptions().dtype(at::kByte).device(TransportDevice(transport));
    // Room for a flag byte per peer each way.
    const int64_t flag_bytes = transport.size();
    at::Tensor send = at::zeros({Sum(*move.send_rows) * row_bytes + flag_bytes}, options);
    at::Tensor recv = at::empty({Sum(*move.recv_rows) * row_bytes + flag_bytes}, options);
    absl::Status moved;
    if (MovesHostSegments(transport)) {
      std::vector<SendSegment> sends;
      std::vector<RecvSegment> recvs;
      std::vector<const uint8_t*> flag_of(transport.size(), nullptr);  // by peer, received
      uint8_t* out = send.data_ptr<uint8_t>();
      uint8_t* in = recv.data_ptr<uint8_t>();
      ForEachMessage(tensor_row_bytes, move, transport.rank(), /*flagged=*/true,
                     [&](const Message& m) {
                       const bool carries_flag = m.kind != Message::kTensorRows;
                       if (m.outgoing) {
                         if (carries_flag) out[m.bytes - 1] = flag;
                         sends.push_back({m.peer, out, m.bytes});
                         out += m.bytes;
                       } else {
                         if (carries_flag) flag_of[m.peer] = in + m.bytes - 1;
                         recvs.push_back({m.peer, in, m.bytes});
                         in += m.bytes;
                       }
                     });
      moved = transport.AllToAll(nullptr, *move.send_rows, nullptr, *move.recv_rows, row_bytes,
                                 AllToAllOptions::Segments(&sends, &recvs));
      flags.assign(transport.size(), flag);
      for (int p = 0; p < transport.size(); ++p) {
        if (flag_of[p] != nullptr) flags[p] = *flag_of[p];
      }
    } else {
      moved = transport.AllToAll(send.data_ptr(), *move.send_rows, recv.data_ptr(), *move.recv_rows,
                                 row_bytes, AllToAllOptions::Flagged(flag, &flags));
    }
    if (!moved.ok()) return moved;
  } catch (const c10::Error& e) {
    // Not even scratch memory: the peers wait until the transport's timeout.
    return FromTorchError(e, move.what.c_str());
  }
  return flags;
}

bool AnyRaised(const std::vector<uint8_t>& flags) {
  for (uint8_t f : flags) {
    if (f != 0) return true;
  }
  return false;
}

// The flag a rank raises: it failed on its own, or its tensors are not the
// signature the call agreed on (which every rank may have changed alike).
constexpr uint8_t kFailed = 1;
constexpr uint8_t kSignatureChanged = 2;

// ---- The exchange -------------------------------------------------------

// The exchange in place, for transports that move segments (host memory)
// and for a group of one rank (any device, no peer at all); this rank's own
// rows are one copy, never on the wire. The messages are ForEachMessage's:
//  - one tensor's rows to a peer are sent from where they lie when they are
//    consecutive rows of the input (else gathered once into that tensor's
//    staging), and received where they belong when they land on
//    consecutive rows of the output (else into staging, scattered after);
//  - rows packed with the flag (head groups, small messages) are gathered
//    straight from the inputs into one buffer per side and scattered
//    straight into the outputs: one pass each way.
class Segmented {
 public:
  // Allocates the outputs, gathers what must be staged and copies this
  // rank's own rows. Throws c10::Error.
  Segmented(at::TensorList xs, const RowMove& move) {
    const Transport& t = *move.transport;
    me_ = t.rank();
    const int n = t.size();
    send_offset_.assign(n + 1, 0);
    recv_offset_.assign(n + 1, 0);
    for (int p = 0; p < n; ++p) {
      send_offset_[p + 1] = send_offset_[p] + (*move.send_rows)[p];
      recv_offset_[p + 1] = recv_offset_[p] + (*move.recv_rows)[p];
    }
    // Planned from the orders in host memory; this rank's own rows are
    // copied with the orders on the rows' device.
    before_ = move.before.host_index.defined() ? move.before.host_index.data_ptr<int64_t>()
                                               : nullptr;
    landing_ = move.after.host_inverse.defined() ? move.after.host_inverse.data_ptr<int64_t>()
                                                 : nullptr;
    host_ = xs.empty() || xs[0].device().is_cpu();
    const int64_t recv_count = recv_offset_[n];
    for (const at::Tensor& x : xs) {
      at::Tensor flat = x.resolve_conj().resolve_neg().contiguous();
      flat = flat.reshape({flat.size(0), RowElements(flat)});
      at::Tensor out = Empty(OutputShape(x, move, recv_count), x);
      at::Tensor out_flat = out.view({out.size(0), RowElements(out)});
      Tensor tensor{flat, out, out_flat, {}, {}, MovedRowBytes(x, move), {}, {}};
      tensor.src = {static_cast<char*>(flat.data_ptr()), flat.size(0),
                    flat.size(1) * static_cast<int64_t>(flat.element_size()), tensor.row_bytes,
                    move.input_groups};
      tensor.dst = {static_cast<char*>(out_flat.data_ptr()), out_flat.size(0),
                    out_flat.size(1) * static_cast<int64_t>(out_flat.element_size()),
                    tensor.row_bytes, move.output_groups};
      tensor_row_bytes_.push_back(tensor.row_bytes);
      tensors_.push_back(std::move(tensor));
    }
    packed_out_.assign(n, -1);
    packed_in_.assign(n, -1);
    flags_in_.assign(n, 0);
    flag_at_.assign(n, nullptr);
    // Room in the staging for every packed message, its flag byte included
    // (the messages of a flagged exchange: the most there can be).
    int64_t packed_send = 0, packed_recv = 0;
    ForEachMessage(tensor_row_bytes_, move, me_, /*flagged=*/true, [&](const Message& m) {
      if (m.kind != Message::kPackedRows) return;
      int64_t& end = m.outgoing ? packed_send : packed_recv;
      (m.outgoing ? packed_out_ : packed_in_)[m.peer] = end;
      end += m.bytes;
    });
    if (packed_send > 0) send_stage_ = EmptyHostTensor({packed_send}, at::kByte);
    if (packed_recv > 0) recv_stage_ = EmptyHostTensor({packed_recv}, at::kByte);
    GatherPacked();
    StageTensorRows(n);
    for (Tensor& tensor : tensors_) CopyOwnRows(tensor, move.before.index, move.after.inverse);
  }

  // The segments of the exchange (ForEachMessage's), with `flag` in those
  // that carry this rank's flag when `flagged`.
  void Segments(const RowMove& move, uint8_t flag, bool flagged, std::vector<SendSegment>* sends,
                std::vector<RecvSegment>* recvs) {
    flag_out_ = flag;
    char* send_stage = send_stage_.defined() ? static_cast<char*>(send_stage_.data_ptr()) : nullptr;
    char* recv_stage = recv_stage_.defined() ? static_cast<char*>(recv_stage_.data_ptr()) : nullptr;
    // Rows into each tensor's staging so far, on either side.
    std::vector<int64_t> staged_send(tensors_.size(), 0), staged_recv(tensors_.size(), 0);
    ForEachMessage(tensor_row_bytes_, move, me_, flagged, [&](const Message& m) {
      const int p = m.peer;
      switch (m.kind) {
        case Message::kPackedRows:
          if (m.outgoing) {
            char* data = send_stage + packed_out_[p];
            data[m.bytes - 1] = static_cast<char>(flag);
            sends->push_back({p, data, m.bytes});
          } else {
            char* data = recv_stage + packed_in_[p];
            flag_at_[p] = reinterpret_cast<const uint8_t*>(data + m.bytes - 1);
            recvs->push_back({p, data, m.bytes});
          }
          break;
        case Message::kFlag:
          if (m.outgoing) {
            sends->push_back({p, &flag_out_, 1});
          } else {
            flag_at_[p] = &flags_in_[p];
            recvs->push_back({p, &flags_in_[p], 1});
          }
          break;
        case Message::kTensorRows: {
          const Tensor& t = tensors_[m.tensor];
          if (m.outgoing) {
            const char* data =
                send_start_[p] >= 0
                    ? RowPointer(t.flat, send_start_[p], t.row_bytes)
                    : RowPointer(t.staged_send, staged_send[m.tensor], t.row_bytes);
            if (send_start_[p] < 0) staged_send[m.tensor] += m.rows;
            sends->push_back({p, data, m.bytes});
          } else {
            char* data = recv_start_[p] >= 0
                             ? RowPointer(t.out_flat, recv_start_[p], t.row_bytes)
                             : RowPointer(t.staged_recv, staged_recv[m.tensor], t.row_bytes);
            if (recv_start_[p] < 0) staged_recv[m.tensor] += m.rows;
            recvs->push_back({p, data, m.bytes});
          }
          break;
        }
      }
    });
  }

  // Every rank's flag, by rank (`mine` for this one), once a flagged
  // exchange of Segments has ended.
  std::vector<uint8_t> ReceivedFlags(uint8_t mine) const {
    std::vector<uint8_t> flags(flag_at_.size(), 0);
    for (size_t p = 0; p < flags.size(); ++p) {
      if (flag_at_[p] != nullptr) flags[p] = *flag_at_[p];
    }
    flags[me_] = mine;
    return flags;
  }

  // Scatters what was received into staging; the outputs. Throws c10::Error.
  std::vector<at::Tensor> Finish() {
    for (size_t p = 0; p < packed_in_.size(); ++p) {
      if (packed_in_[p] < 0) continue;
      char* received = static_cast<char*>(recv_stage_.data_ptr()) + packed_in_[p];
      const int64_t rows = recv_offset_[p + 1] - recv_offset_[p];
      for (const Tensor& t : tensors_) {
        CopyHostRows(RowAddress::Packed(received, t.row_bytes), nullptr, 0, t.dst, landing_,
                     recv_offset_[p], rows);
        received += rows * t.row_bytes;
      }
    }
    std::vector<at::Tensor> outputs;
    for (Tensor& t : tensors_) {
      if (t.staged_recv.defined() && host_) {
        CopyHostRows(RowAddress::Packed(static_cast<char*>(t.staged_recv.data_ptr()), t.row_bytes),
                     nullptr, 0, t.dst, scatter_.data_ptr<int64_t>(), 0, scatter_.size(0));
      } else if (t.staged_recv.defined()) {
        t.out_flat.index_copy_(0, scatter_.to(t.out_flat.device()), t.staged_recv);
      }
      outputs.push_back(t.out);
    }
    return outputs;
  }

 private:
  struct Tensor {
    at::Tensor flat, out, out_flat;  // [rows, elements] views
    at::Tensor staged_send, staged_recv;
    int64_t row_bytes = 0;  // of an exchanged row
    RowAddress src, dst;    // in host memory: where exchanged rows lie in flat and out_flat
  };

  // Every tensor's rows to each peer whose rows travel packed, into the
  // send staging (host memory: packed rows only move over transports that
  // move segments).
  void GatherPacked() {
    for (size_t p = 0; p < packed_out_.size(); ++p) {
      if (packed_out_[p] < 0) continue;
      char* staged = static_cast<char*>(send_stage_.data_ptr()) + packed_out_[p];
      const int64_t rows = send_offset_[p + 1] - send_offset_[p];
      for (const Tensor& t : tensors_) {
        CopyHostRows(t.src, before_, send_offset_[p], RowAddress::Packed(staged, t.row_bytes),
                     nullptr, 0, rows);
        staged += rows * t.row_bytes;
      }
    }
  }

  // Rows that travel by tensor: which peers' rows are one run on either
  // side, and the staging of those that are not.
  void StageTensorRows(int n) {
    for (int p = 0; p < n; ++p) {
      send_start_.push_back(RunStart(before_, send_offset_[p], send_offset_[p + 1]));
      recv_start_.push_back(RunStart(landing_, recv_offset_[p], recv_offset_[p + 1]));
    }
    // The rows staged on either side: the positions of the peers whose
    // rows are not one run, in peer order.
    std::vector<int64_t> gather, scatter;
    for (int p = 0; p < n; ++p) {
      if (p == me_) continue;
      if (packed_out_[p] < 0 && send_start_[p] < 0) {
        for (int64_t k = send_offset_[p]; k < send_offset_[p + 1]; ++k) {
          gather.push_back(before_[k]);
        }
      }
      if (packed_in_[p] < 0 && recv_start_[p] < 0) {
        for (int64_t j = recv_offset_[p]; j < recv_offset_[p + 1]; ++j) {
          scatter.push_back(landing_[j]);
        }
      }
    }
    if (!gather.empty()) gather_ = at::tensor(gather, at::kLong);
    if (!scatter.empty()) scatter_ = at::tensor(scatter, at::kLong);
    for (Tensor& t : tensors_) {
      if (gather_.defined()) {
        t.staged_send = Empty({gather_.size(0), t.flat.size(1)}, t.flat);
        if (host_) {
          CopyHostRows(t.src, gather_.data_ptr<int64_t>(), 0,
                       RowAddress::Packed(static_cast<char*>(t.staged_send.data_ptr()),
                                          t.row_bytes),
                       nullptr, 0, gather_.size(0));
        } else {
          at::index_select_out(t.staged_send, t.flat, 0, gather_.to(t.flat.device()));
        }
      }
      if (scatter_.defined()) t.staged_recv = Empty({scatter_.size(0), t.flat.size(1)}, t.flat);
    }
  }

  // The first of consecutive rows index[begin..end) name (identity without
  // an index), or -1 when they are not consecutive.
  static int64_t RunStart(const int64_t* index, int64_t begin, int64_t end) {
    if (index == nullptr || begin == end) return begin;
    for (int64_t k = begin + 1; k < end; ++k) {
      if (index[k] != index[k - 1] + 1) return -1;
    }
    return index[begin];
  }

  static char* RowPointer(const at::Tensor& rows, int64_t row, int64_t row_bytes) {
    return static_cast<char*>(rows.data_ptr()) + row * row_bytes;
  }

  // This rank's rows to itself: from their input rows to their output rows
  // (`before`, `landing`: the orders on the rows' device, defined where a
  // side is not one run; host rows are copied by the orders in host memory).
  void CopyOwnRows(Tensor& t, const at::Tensor& before, const at::Tensor& landing) {
    const int64_t rows = send_offset_[me_ + 1] - send_offset_[me_];
    if (rows == 0 || t.row_bytes == 0) return;
    if (host_) {
      CopyHostRows(t.src, before_, send_offset_[me_], t.dst, landing_, recv_offset_[me_], rows);
      return;
    }
    // A device tensor in a group of one: its rows move whole (MovesInPlace).
    const int64_t src = send_start_[me_], dst = recv_start_[me_];
    auto positions = [](const at::Tensor& index, int64_t begin, int64_t count) {
      return index.narrow(0, begin, count);
    };
    if (src >= 0 && dst >= 0) {
      t.out_flat.narrow(0, dst, rows).copy_(t.flat.narrow(0, src, rows));
    } else if (dst >= 0) {
      at::Tensor into = t.out_flat.narrow(0, dst, rows);
      at::index_select_out(into, t.flat, 0, positions(before, send_offset_[me_], rows));
    } else {
      at::Tensor from = src >= 0 ? t.flat.narrow(0, src, rows)
                                 : at::index_select(t.flat, 0,
                                                    positions(before, send_offset_[me_], rows));
      t.out_flat.index_copy_(0, positions(landing, recv_offset_[me_], rows), from);
    }
  }

  int me_ = 0;
  bool host_ = true;  // the rows are in host memory: copied by CopyHostRows
  const int64_t* before_ = nullptr;   // the orders in host memory (null: identity)
  const int64_t* landing_ = nullptr;
  std::vector<int64_t> tensor_row_bytes_;
  std::vector<int64_t> send_offset_, recv_offset_;  // by peer, then the total
  // By peer: where its packed rows (and flag) lie in the staging, or -1
  // where they travel by tensor.
  std::vector<int64_t> packed_out_, packed_in_;
  at::Tensor send_stage_, recv_stage_;
  std::vector<int64_t> send_start_, recv_start_;  // by peer: RunStart
  at::Tensor gather_, scatter_;                   // by tensor: the staged rows' positions
  uint8_t flag_out_ = 0;                          // kFlag messages' bytes
  std::vector<uint8_t> flags_in_;
  // By peer: where its flag arrives in the last Segments' messages (null:
  // no flag from it).
  std::vector<const uint8_t*> flag_at_;
  std::vector<Tensor> tensors_;
};

// Whether `move` of `xs` can run in place (Segmented): host memory over a
// transport that moves segments, or any device in a group of one rank (whose
// rows are all its own: one copy, no transport call).
bool MovesInPlace(at::TensorList xs, const RowMove& move) {
  const bool alone = move.transport->size() == 1;
  if (!alone && !MovesHostSegments(*move.transport)) return false;
  if (HasHeadGroups(move) && !MovesHostSegments(*move.transport)) return false;
  for (const at::Tensor& x : xs) {
    if (!alone && !x.device().is_cpu()) return false;
    if (x.device() != xs[0].device()) return false;
  }
  const RowOrder* orders[] = {&move.before, &move.after};
  for (const RowOrder* order : orders) {
    for (const at::Tensor& host : {order->host_index, order->host_inverse}) {
      if (host.defined() && (!host.device().is_cpu() || !host.is_contiguous())) return false;
    }
    for (const at::Tensor& index : {order->index, order->inverse}) {
      if (index.defined() && !xs.empty() && index.device() != xs[0].device()) return false;
    }
    if (order->index.defined() != order->host_index.defined()) return false;
  }
  return true;
}

void ThrowIfError(absl::Status status) {
  if (!status.ok()) throw TransportError(std::move(status));
}

// Every tensor's rows exchanged in one exchange (in place where the
// transport moves segments, else packed into one all-to-all), agreed as
// move.agreement says (row_exchange.h). Everything that can fail on one
// rank alone (packing, allocating, a backend's limit, tensors unlike the
// peers') is decided before any received row is trusted, and every rank of
// the group learns of it in the same exchange.
std::vector<at::Tensor> MoveRows(at::TensorList xs, const RowMove& move) {
  std::vector<int64_t> tensor_row_bytes;
  for (const at::Tensor& x : xs) tensor_row_bytes.push_back(MovedRowBytes(x, move));
  const int64_t row_bytes = Sum(tensor_row_bytes);
  const bool in_place = MovesInPlace(xs, move);
  Packed packed;
  std::unique_ptr<Segmented> segmented;
  absl::Status prepared;
  if (in_place) {
    try {
      segmented = std::make_unique<Segmented>(xs, move);
    } catch (const c10::Error& e) {
      prepared = FromTorchError(e, move.what.c_str());
    }
  } else {
    prepared = Pack(xs, move, row_bytes, &packed);
  }
  if (prepared.ok()) {
    prepared = move.transport->CheckLimits(*move.send_rows, *move.recv_rows, row_bytes);
  }
  // The rows on the wire, with this rank's flag (flags == nullptr: none).
  auto exchange = [&](uint8_t flag, std::vector<uint8_t>* flags) {
    if (in_place && move.transport->size() == 1) {  // no peer: nothing on the wire
      if (flags != nullptr) flags->assign(1, flag);
    } else if (in_place) {
      std::vector<SendSegment> sends;
      std::vector<RecvSegment> recvs;
      segmented->Segments(move, flag, flags != nullptr, &sends, &recvs);
      ThrowIfError(move.transport->AllToAll(nullptr, *move.send_rows, nullptr, *move.recv_rows,
                                            row_bytes, AllToAllOptions::Segments(&sends, &recvs)));
      if (flags != nullptr) *flags = segmented->ReceivedFlags(flag);
    } else if (flags != nullptr) {
      ThrowIfError(move.transport->AllToAll(
          packed.send.data_ptr(), *move.send_rows, packed.received.data_ptr(), *move.recv_rows,
          row_bytes, AllToAllOptions::Flagged(flag, flags)));
    } else {
      ThrowIfError(move.transport->AllToAll(
          packed.send.data_ptr(), *move.send_rows, packed.received.data_ptr(), *move.recv_rows,
          row_bytes, AllToAllOptions::Checked()));
    }
  };
  auto outputs = [&] { return in_place ? segmented->Finish() : Unpack(xs, move, packed); };
  const ExchangeBook::Entry* agreed =
      move.book != nullptr ? move.book->Expected(move.what, move.ordinal) : nullptr;
  const bool flagged = move.agreement == Agreement::kOncePerStep &&
                       (move.book == nullptr || agreed != nullptr);
  auto move_agreed = [&] {
    if (move.book != nullptr) {
      move.book->Record(move.what, move.ordinal, {move.signature, row_bytes, tensor_row_bytes});
    }
    exchange(0, nullptr);
    return outputs();
  };
  if (!flagged) {
    ThrowIfError(move.agreement == Agreement::kOff
                     ? prepared
                     : AgreeOnExchange(move, prepared, row_bytes,
                                       move.book != nullptr ? &move.signature : nullptr));
    return move_agreed();
  }
  // The call's shape was agreed: move at once, flags with the rows.
  uint8_t flag = 0;
  if (!prepared.ok()) {
    flag = kFailed;
  } else if (agreed != nullptr && !(agreed->signature == move.signature)) {
    flag = kSignatureChanged;
  }
  std::vector<uint8_t> flags;
  if (flag == 0) {
    exchange(0, &flags);
  } else {
    absl::StatusOr<std::vector<uint8_t>> scratch = FlaggedFromScratch(
        move, agreed != nullptr ? agreed->tensor_row_bytes : tensor_row_bytes, flag);
    if (!scratch.ok()) ThrowIfError(prepared.ok() ? scratch.status() : prepared);
    flags = *std::move(scratch);
  }
  if (!AnyRaised(flags)) {
    if (move.book != nullptr) move.book->Record(move.what, move.ordinal, *agreed);
    return outputs();
  }
  // A rank raised its flag: every rank knows, and all agree on why.
  ThrowIfError(AgreeOnExchange(move, prepared, row_bytes,
                               move.book != nullptr ? &move.signature : nullptr));
  // Nobody failed and every rank passed the same new signature: the book
  // records it for this exchange, which runs again with it.
  return move_agreed();
}

// MoveRows as an autograd node: its backward sends each gradient row back
// the way its row came, for the tensors that required grad (the same set on
// every rank, so the backward exchange matches on every rank too). The
// backward is this node again, reversed, so it is differentiable as well
// (double backward). Callers pass an at::TensorList: autograd only tracks
// the tensors of an argument of that type (a std::vector would silently be a
// non-tensor argument).
//
// Backward order. Autograd runs independent nodes in whatever order they
// become ready, and ranks' graphs differ (a loss that uses one routed tensor
// more than another, CUDA and CPU nodes on different engine threads), so
// two exchanges could run in different orders on different ranks: a hang,
// or rows of one tensor received as another's. Every node therefore takes
// the previous node's `chain` output (an empty tensor) as an input and
// emits its own: the backward of an exchange cannot start before the
// backward of every later exchange of the step has ended, so backward
// exchanges run in exactly the reverse of the forward order, on every rank.
// What a node's backward needs of its forward, kept in the node as one typed
// value (a capsule in saved_data): the way back, ready to run.
struct SavedMove : torch::CustomClassHolder {
  // The way back's counts (the forward's, transposed), which `back` points to.
  std::vector<int64_t> send_rows;
  std::vector<int64_t> recv_rows;
  RowMove back;
  // The forward's chain flag (RowMove::chain_started; `back` carries none).
  at::Tensor chain_started;
  std::vector<int64_t> differentiable;  // the inputs that required grad
  int64_t inputs = 0;
  bool chained = false;  // the forward took a chain link as an input
};
constexpr char kSavedMove[] = "move";

class MoveRowsFunction : public torch::autograd::Function<MoveRowsFunction> {
 public:
  // Returns the moved tensors, then the chain link for the next exchange.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList xs, at::TensorList chain,
                                                const RowMove* move) {
    auto saved = c10::make_intrusive<SavedMove>();
    for (size_t i = 0; i < xs.size(); ++i) {
      if (xs[i].requires_grad()) saved->differentiable.push_back(static_cast<int64_t>(i));
    }
    saved->inputs = static_cast<int64_t>(xs.size());
    // The previous link, or none (an undefined tensor may not be an input).
    saved->chained = !chain.empty();
    saved->chain_started = move->chain_started;
    saved->back = Reversed(*move);
    saved->send_rows = *move->recv_rows;
    saved->recv_rows = *move->send_rows;
    saved->back.send_rows = &saved->send_rows;
    saved->back.recv_rows = &saved->recv_rows;
    ctx->saved_data[kSavedMove] = at::IValue::make_capsule(std::move(saved));
    std::vector<at::Tensor> outputs = MoveRows(xs, *move);
    torch::autograd::variable_list non_differentiable;  // one call: each call replaces the set
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!xs[i].requires_grad()) non_differentiable.push_back(outputs[i]);
    }
    ctx->mark_non_differentiable(non_differentiable);
    outputs.push_back(at::empty({0}));  // the chain link
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::intrusive_ptr<torch::CustomClassHolder> held =
        ctx->saved_data[kSavedMove].toCapsule();
    const SavedMove& saved = static_cast<const SavedMove&>(*held);
    // Exchanges recorded after this point start a new chain instead of
    // linking into a graph whose backward has begun (and may be freed).
    if (saved.chain_started.defined()) saved.chain_started.fill_(true);
    std::vector<at::Tensor> to_send;
    for (int64_t i : saved.differentiable) to_send.push_back(grads[i]);
    // A node of its own only when the backward itself is being recorded
    // (create_graph); otherwise apply runs the exchange and records nothing.
    // Double backward is not chained: it is one exchange per backward node.
    std::vector<at::Tensor> moved =
        MoveRowsFunction::apply(at::TensorList(to_send), at::TensorList(), &saved.back);
    // One gradient per forward input: xs, the chain link (if any), the move.
    torch::autograd::variable_list result(saved.inputs + (saved.chained ? 1 : 0) + 1);
    for (size_t j = 0; j < saved.differentiable.size(); ++j) {
      result[saved.differentiable[j]] = moved[j];
    }
    // Passing the link on releases the previous exchange's backward.
    if (saved.chained) result[saved.inputs] = at::zeros({0});
    return result;
  }
};

}  // namespace

RowMove Reversed(const RowMove& move) {
  RowMove back;
  back.transport = move.transport;
  back.what = move.what + " (backward)";
  back.agreement = move.agreement;
  back.owner = move.owner;
  back.send_rows = move.recv_rows;
  back.recv_rows = move.send_rows;
  // The way back gathers with the inverses, in the opposite order.
  back.before = move.after.Inverted();
  back.after = move.before.Inverted();
  back.input_groups = move.output_groups;
  back.output_groups = move.input_groups;
  back.world_ranks = move.world_ranks;
  back.step = move.step;
  return back;
}

std::vector<at::Tensor> MoveRowsOnce(at::TensorList xs, const RowMove& move) {
  return MoveRows(xs, move);
}

at::Tensor OwnerTensor(std::shared_ptr<Transport> transport) {
  auto* held = new std::shared_ptr<Transport>(std::move(transport));
  return at::from_blob(
      held, {0}, [held](void*) { delete held; }, at::TensorOptions().dtype(at::kByte));
}

std::vector<at::Tensor> MoveRowsWithGrad(at::TensorList xs, at::TensorList chain,
                                         const RowMove& move) {
  return MoveRowsFunction::apply(xs, chain, &move);
}

absl::Status RefuseExchange(const RowMove& move, const absl::Status& reason) {
  if (move.agreement == Agreement::kOff) return reason;
  const ExchangeBook::Entry* agreed =
      move.book != nullptr ? move.book->Expected(move.what, move.ordinal) : nullptr;
  if (move.agreement == Agreement::kOncePerStep && agreed != nullptr) {
    // The peers are already moving the call's agreed rows.
    absl::StatusOr<std::vector<uint8_t>> flags =
        FlaggedFromScratch(move, agreed->tensor_row_bytes, kFailed);
    if (!flags.ok()) return flags.status();
  }
  absl::Status agreed_error = AgreeOnExchange(move, reason, -1, nullptr);
  return agreed_error.ok() ? reason : agreed_error;
}

}  // namespace knapformer
