#include "transport/c10d_transport.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "transport/agreement.h"
#include "transport/backend_checks.h"

namespace knapformer {
namespace {

// LibTorch 1.13's c10d counts a collective's elements in int: one call moves
// at most this many elements of the widest type that divides the row size.
constexpr int64_t kMaxElementsPerCall = std::numeric_limits<int>::max();

// The widest element type whose size divides `row_bytes`, so that as few
// elements as possible carry the rows, among the types every backend moves:
// Gloo and NCCL have int64, int32 and uint8 but no int16, so rows of 2 mod 4
// bytes (an odd number of 16-bit values) go as bytes.
at::ScalarType WidestElement(int64_t row_bytes) {
  if (row_bytes % 8 == 0) return at::kLong;
  if (row_bytes % 4 == 0) return at::kInt;
  return at::kByte;
}

// A [rows, row elements] view of `data` (or an empty tensor: a null pointer
// may back no view, and there is nothing to move then).
at::Tensor Rows(void* data, int64_t rows, int64_t row_bytes, c10::Device device) {
  const at::ScalarType type = WidestElement(row_bytes);
  const int64_t row_elements = row_bytes == 0 ? 0 : row_bytes / c10::elementSize(type);
  const auto options = at::TensorOptions().dtype(type).device(device);
  if (rows == 0 || row_bytes == 0) return at::empty({rows, row_elements}, options);
  return at::from_blob(data, {rows, row_elements}, options);
}

// Bytes each rank contributes to the first all-gather of AllGatherBytes: its
// length and up to kInlineBytes of payload, so that small strings (verdicts,
// lengths of a few sequences) take one collective, not two.
constexpr int64_t kSlotBytes = 64;
constexpr int64_t kInlineBytes = kSlotBytes - sizeof(int64_t);

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> group,
                             c10::intrusive_ptr<c10d::ProcessGroup> host_group,
                             C10dTransportOptions options, std::vector<int> global_ranks)
    : group_(std::move(group)),
      host_group_(std::move(host_group)),
      options_(std::move(options)),
      global_ranks_(std::move(global_ranks)) {
  options_.host_group.reset();  // held in host_group_ (the root's, or a subgroup's)
}

absl::StatusOr<std::unique_ptr<C10dTransport>> C10dTransport::Create(
    c10::intrusive_ptr<c10d::ProcessGroup> group, C10dTransportOptions options) {
  if (!group) return absl::InvalidArgumentError("group: must not be null");
  if (options.device.is_cuda() && !options.device.has_index()) {
    return absl::InvalidArgumentError(
        "device: name the rank's CUDA device with its index (cuda:N), not 'cuda'");
  }
  if (!options.device.is_cpu() && !options.device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat("device: ", options.device.str(),
                                                   " is neither the CPU nor a CUDA device"));
  }
  c10::intrusive_ptr<c10d::ProcessGroup> host_group = options.host_group;
  if (host_group && (host_group->getSize() != group->getSize() ||
                     host_group->getRank() != group->getRank())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_group: rank ", host_group->getRank(), " of ", host_group->getSize(),
        ", but the group's rank is ", group->getRank(), " of ", group->getSize(),
        "; it must span the same ranks in the same order"));
  }
  std::vector<int> ranks(group->getSize());
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::unique_ptr<C10dTransport>(new C10dTransport(
      std::move(group), std::move(host_group), std::move(options), std::move(ranks)));
}

int C10dTransport::rank() const { return group_->getRank(); }
int C10dTransport::size() const { return group_->getSize(); }
int C10dTransport::cuda_device() const {
  return options_.device.is_cuda() ? options_.device.index() : -1;
}

absl::StatusOr<at::Tensor> C10dTransport::GatherToHost(const at::Tensor& mine, const char* op) {
  c10d::ProcessGroup& group = metadata_group();
  if (mine.device().is_cpu()) {
    // Gloo's all-gather is a ring: size - 1 hops one after another, each a
    // wake-up of every process, which is what small metadata pays for. An
    // all-to-all of `mine` to every peer moves the same bytes per rank in
    // one round (4 processes on 2 cores: the count check, an all-to-all and
    // one of these, went from 5-6 ms to 3-4.5 ms).
    const int64_t n = group.getSize();
    std::vector<int64_t> shape = mine.sizes().vec();
    shape.insert(shape.begin(), n);
    at::Tensor input = mine.unsqueeze(0).expand(shape).contiguous();
    at::Tensor output = at::empty(shape, mine.options());
    std::vector<int64_t> output_splits, input_splits;  // empty: equal splits
    absl::Status status = Run(op, [&] {
      return group.alltoall_base(output, input, output_splits, input_splits);
    });
    if (!status.ok()) return status;
    return output;
  }
  std::vector<std::vector<at::Tensor>> output(1);
  for (int p = 0; p < group.getSize(); ++p) output[0].push_back(at::empty_like(mine));
  std::vector<at::Tensor> input = {mine};
  absl::Status status = Run(op, [&] { return group.allgather(output, input); });
  if (!status.ok()) return status;
  return at::stack(output[0]).to(at::kCPU);
}

absl::Status C10dTransport::Usable() const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "c10d transport unusable after an earlier failure: ", broken_.message()));
}

template <typename Collective>
absl::Status C10dTransport::Run(const char* op, Collective&& collective) {
  // c10d's exceptions carry no kind (Gloo's own timeout, a peer gone and a
  // refused argument are all runtime errors with a text), so the code says
  // who ended the wait: this transport, at its collective_timeout, with the
  // work still unfinished (DeadlineExceeded); else the backend
  // (Unavailable, with its text).
  const bool bounded = options_.collective_timeout != absl::InfiniteDuration();
  const auto bound =
      bounded ? std::chrono::milliseconds(
                    std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.collective_timeout)))
              : kNoTimeout;  // c10d's: wait for as long as the backend does
  c10::intrusive_ptr<c10d::Work> work;
  std::optional<std::string> what;  // set when the collective threw
  try {
    work = collective();
    work->wait(bound);
  } catch (const c10::Error& e) {
    what = e.what_without_backtrace();
  } catch (const std::exception& e) {
    what = e.what();
  }
  absl::Status status;
  if (what.has_value()) {
    if (bounded && work && !work->isCompleted()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          op, ": not every rank took part within ", absl::FormatDuration(options_.collective_timeout),
          " (C10dTransportOptions.collective_timeout)"));
    } else {
      status = absl::UnavailableError(absl::StrCat(op, ": ", *what));
    }
  }
  // After a failed collective the peers' states are unknown (some may have
  // finished it): no later collective can be trusted to match.
  if (!status.ok() && broken_.ok()) broken_ = status;
  return status;
}

// Tensor operations outside the collectives (allocating on the device,
// copying to the host) throw too: a device that is not there, memory.
template <typename Body>
auto Guard(const char* op, const c10::Device& device, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, " on ", device.str(), ": ", e.what_without_backtrace()));
  }
}

absl::Status C10dTransport::CheckRowCounts(const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) {
  return Guard("row count check", metadata_device(),
               [&] { return DoCheckRowCounts(send_rows, recv_rows, /*refuse=*/false); });
}

absl::Status C10dTransport::DoCheckRowCounts(const std::vector<int64_t>& send_rows,
                                             const std::vector<int64_t>& recv_rows, bool refuse) {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  const int n = size();
  if (!refuse) {
    if (absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, n); !sizes.ok()) {
      return sizes;
    }
  }
  const c10::Device device = metadata_device();
  at::Tensor i_send =
      at::tensor(refuse ? std::vector<int64_t>(n, 0) : send_rows, at::kLong).to(device);
  at::Tensor sent_to_me = at::empty({n}, i_send.options());
  std::vector<int64_t> equal_splits;  // empty = n equal splits
  absl::Status status = Run("all-to-all of row counts", [&] {
    return metadata_group().alltoall_base(sent_to_me, i_send, equal_splits, equal_splits);
  });
  if (!status.ok()) return status;
  const at::Tensor sent_host = sent_to_me.to(at::kCPU);
  const int64_t* sent = sent_host.data_ptr<int64_t>();
  // Every rank learns every rank's verdict, so that all of them return the
  // same error (the first disagreement), not only the one that saw it.
  const std::vector<int64_t> mine =
      refuse ? RefusingVerdict(rank(), n)
             : CountVerdict(rank(), n, std::vector<int64_t>(sent, sent + n), recv_rows, 0);
  absl::StatusOr<at::Tensor> all =
      GatherToHost(at::tensor(mine, at::kLong).to(device), "all-gather of count checks");
  if (!all.ok()) return all.status();
  const int64_t* v = all->data_ptr<int64_t>();
  return JudgeVerdicts(std::vector<int64_t>(v, v + static_cast<int64_t>(n) * kVerdictFields), n);
}

absl::Status C10dTransport::MoveRows(const void* send, const std::vector<int64_t>& send_rows,
                                     void* recv, const std::vector<int64_t>& recv_rows,
                                     int64_t row_bytes, bool counts_checked) {
  return Guard("all-to-all", options_.device, [&] {
    return RunAllToAll(send, send_rows, recv, recv_rows, row_bytes,
                       options_.check_counts && !counts_checked);
  });
}

absl::Status C10dTransport::RunAllToAll(const void* send, const std::vector<int64_t>& send_rows,
                                        void* recv, const std::vector<int64_t>& recv_rows,
                                        int64_t row_bytes, bool check_counts) {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  const int n = size();
  absl::Status valid = CheckExchange(send_rows, recv_rows, row_bytes, n);
  if (valid.ok()) valid = CheckBuffers(send, send_rows, recv, recv_rows, row_bytes);
  if (valid.ok()) valid = CheckLimits(send_rows, recv_rows, row_bytes);
  if (check_counts) {
    // Every rank takes part in the check, whatever its own arguments, so a
    // local mistake fails every rank instead of leaving them waiting.
    absl::Status status = Guard("row count check", metadata_device(), [&] {
      return DoCheckRowCounts(send_rows, recv_rows, /*refuse=*/!valid.ok());
    });
    if (!valid.ok()) return valid;
    if (!status.ok()) return status;
  } else if (!valid.ok()) {
    return valid;
  }
  at::Tensor input = Rows(const_cast<void*>(send), TotalRows(send_rows), row_bytes, options_.device);
  at::Tensor output = Rows(recv, TotalRows(recv_rows), row_bytes, options_.device);
  // alltoall_base moves out of the split vectors it is given: pass copies.
  std::vector<int64_t> input_splits = send_rows;
  std::vector<int64_t> output_splits = recv_rows;
  return Run("all-to-all", [&] {
    return group_->alltoall_base(output, input, output_splits, input_splits);
  });
}

absl::Status C10dTransport::MoveSegments(const std::vector<SendSegment>& sends,
                                         const std::vector<RecvSegment>& recvs,
                                         int64_t /*row_bytes*/, uint8_t mine,
                                         std::vector<uint8_t>* flags) {
  if (!MovesSegments()) return Transport::MoveSegments(sends, recvs, 0, mine, flags);
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  const int n = size();
  const int me = rank();
  if (absl::Status valid = CheckSegments(sends, recvs, me, n); !valid.ok()) return valid;
  // One tag for the rows and one for the flags per round, counted by every
  // rank at every call (whether it moves anything or not): the segments
  // between two ranks pair up in order (Gloo matches a pair's messages of
  // one tag first in, first out) and Gloo keeps point-to-point tags apart
  // from its collectives'.
  const int rows_tag = static_cast<int>((flagged_round_ % (1u << 29)) * 2);
  const int flag_tag = rows_tag + 1;
  ++flagged_round_;
  bool any = flags != nullptr && n > 1;
  for (const SendSegment& s : sends) any = any || s.bytes > 0;
  for (const RecvSegment& r : recvs) any = any || r.bytes > 0;
  if (!any) {  // nothing moves (no peer, or no rows and no flags)
    if (flags != nullptr) {
      flags->assign(n, 0);
      (*flags)[me] = mine;
    }
    return absl::OkStatus();
  }
  const auto bytes = at::TensorOptions().dtype(at::kByte);
  at::Tensor flag_out = at::full({1}, static_cast<int64_t>(mine), bytes);
  at::Tensor flags_in = at::zeros({n}, bytes);
  std::vector<std::vector<at::Tensor>> buffers;  // alive until every message is done
  buffers.reserve(recvs.size() + sends.size() + 2 * n);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  auto view = [&](const void* data, int64_t size) {
    return at::from_blob(const_cast<void*>(data), {size}, bytes);
  };
  absl::Status status = Run("segment exchange", [&] {
    for (const RecvSegment& r : recvs) {
      if (r.bytes == 0) continue;
      buffers.push_back({view(r.data, r.bytes)});
      works.push_back(group_->recv(buffers.back(), r.peer, rows_tag));
    }
    if (flags != nullptr) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        buffers.push_back({flags_in.narrow(0, p, 1)});
        works.push_back(group_->recv(buffers.back(), p, flag_tag));
      }
    }
    for (const SendSegment& s : sends) {
      if (s.bytes == 0) continue;
      buffers.push_back({view(s.data, s.bytes)});
      works.push_back(group_->send(buffers.back(), s.peer, rows_tag));
    }
    // Each flag right behind the rows on its pair's connection, so that its
    // receiver mostly reads both in one wake-up.
    if (flags != nullptr) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        buffers.push_back({flag_out});
        works.push_back(group_->send(buffers.back(), p, flag_tag));
      }
    }
    // Run waits on the work it is given; the others are waited on here.
    for (size_t i = 0; i + 1 < works.size(); ++i) works[i]->wait();
    return works.back();
  });
  if (!status.ok()) return status;
  if (flags != nullptr) {
    flags->assign(n, 0);
    for (int p = 0; p < n; ++p) (*flags)[p] = flags_in.data_ptr<uint8_t>()[p];
    (*flags)[me] = mine;
  }
  return absl::OkStatus();
}

absl::Status C10dTransport::CheckLimits(const std::vector<int64_t>& send_rows,
                                        const std::vector<int64_t>& recv_rows,
                                        int64_t row_bytes) const {
  const int64_t element_bytes = c10::elementSize(WidestElement(row_bytes));
  const int64_t row_elements = row_bytes / element_bytes;
  const int64_t rows = std::max(TotalRows(send_rows), TotalRows(recv_rows));
  if (row_elements > 0 && rows > kMaxElementsPerCall / row_elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "row_bytes: ", rows, " rows of ", row_bytes, " bytes in one all-to-all exceed c10d's ",
        kMaxElementsPerCall, " elements of ", element_bytes,
        " bytes per call (LibTorch 1.13); move fewer rows per call"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> C10dTransport::AllGatherBytes(absl::string_view mine) {
  return Guard("all-gather", metadata_device(), [&] { return DoAllGatherBytes(mine); });
}

absl::StatusOr<std::vector<std::string>> C10dTransport::DoAllGatherBytes(absl::string_view mine) {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  const int n = size();
  const c10::Device device = metadata_device();
  // First round: every rank's length and the head of its bytes.
  at::Tensor slot = at::zeros({kSlotBytes}, at::kByte);
  const int64_t length = static_cast<int64_t>(mine.size());
  std::memcpy(slot.data_ptr<uint8_t>(), &length, sizeof(length));
  std::memcpy(slot.data_ptr<uint8_t>() + sizeof(length), mine.data(),
              std::min<int64_t>(length, kInlineBytes));
  absl::StatusOr<at::Tensor> slots = GatherToHost(slot.to(device), "all-gather");
  if (!slots.ok()) return slots.status();
  std::vector<int64_t> lengths(n);
  int64_t longest = 0;
  for (int p = 0; p < n; ++p) {
    std::memcpy(&lengths[p], slots->data_ptr<uint8_t>() + p * kSlotBytes, sizeof(int64_t));
    if (lengths[p] < 0) return absl::InternalError("all-gather: a negative length came back");
    longest = std::max(longest, lengths[p]);
  }
  std::vector<std::string> result(n);
  if (longest <= kInlineBytes) {
    for (int p = 0; p < n; ++p) {
      const char* head =
          reinterpret_cast<const char*>(slots->data_ptr<uint8_t>()) + p * kSlotBytes + 8;
      result[p].assign(head, lengths[p]);
    }
    return result;
  }
  // Second round, only for long strings: every rank knows the longest, and
  // the collective needs equal sizes, so all pad to it.
  at::Tensor padded = at::zeros({longest}, at::kByte);
  if (!mine.empty()) std::memcpy(padded.data_ptr<uint8_t>(), mine.data(), mine.size());
  absl::StatusOr<at::Tensor> all = GatherToHost(padded.to(device), "all-gather");
  if (!all.ok()) return all.status();
  for (int p = 0; p < n; ++p) {
    result[p].assign(reinterpret_cast<const char*>(all->data_ptr<uint8_t>()) + p * longest,
                     lengths[p]);
  }
  return result;
}

absl::Status C10dTransport::BroadcastFrom(at::Tensor& tensor, int root, const char* op) {
  std::vector<at::Tensor> tensors = {tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  return Run(op, [&] { return metadata_group().broadcast(tensors, options); });
}

absl::StatusOr<std::string> C10dTransport::BroadcastBytes(int root, absl::string_view mine) {
  if (absl::Status valid = CheckBroadcastRoot(root, size()); !valid.ok()) return valid;
  return Guard("broadcast", metadata_device(), [&] { return DoBroadcastBytes(root, mine); });
}

absl::StatusOr<std::string> C10dTransport::DoBroadcastBytes(int root, absl::string_view mine) {
  if (absl::Status usable = Usable(); !usable.ok()) return usable;
  const c10::Device device = metadata_device();
  const bool is_root = rank() == root;
  // Most answers (a plan of a few hundred chunks) fit in the head: one
  // collective.
  constexpr int64_t kHeadBytes = 4096;
  constexpr int64_t kHeadPayload = kHeadBytes - sizeof(int64_t);
  at::Tensor head = at::zeros({kHeadBytes}, at::kByte);
  const int64_t length = static_cast<int64_t>(mine.size());
  if (is_root) {
    std::memcpy(head.data_ptr<uint8_t>(), &length, sizeof(length));
    std::memcpy(head.data_ptr<uint8_t>() + sizeof(length), mine.data(),
                std::min(length, kHeadPayload));
  }
  head = head.to(device);
  if (absl::Status sent = BroadcastFrom(head, root, "broadcast"); !sent.ok()) return sent;
  head = head.to(at::kCPU);
  int64_t total = 0;
  std::memcpy(&total, head.data_ptr<uint8_t>(), sizeof(total));
  if (total < 0) return absl::InternalError("broadcast: a negative length came back");
  std::string result(reinterpret_cast<const char*>(head.data_ptr<uint8_t>()) + sizeof(total),
                     std::min(total, kHeadPayload));
  if (total <= kHeadPayload) return result;
  const int64_t rest = total - kHeadPayload;
  at::Tensor tail = at::empty({rest}, at::kByte);
  if (is_root) std::memcpy(tail.data_ptr<uint8_t>(), mine.data() + kHeadPayload, rest);
  tail = tail.to(device);
  if (absl::Status sent = BroadcastFrom(tail, root, "broadcast"); !sent.ok()) return sent;
  tail = tail.to(at::kCPU);
  result.append(reinterpret_cast<const char*>(tail.data_ptr<uint8_t>()), rest);
  return result;
}

absl::StatusOr<std::unique_ptr<Transport>> C10dTransport::Subgroup(const std::vector<int>& ranks) {
  if (!options_.new_subgroup) {
    return absl::FailedPreconditionError(
        "new_subgroup: this transport was created without a subgroup factory");
  }
  absl::StatusOr<int> index = IndexInSubgroup(ranks, rank(), size());
  if (!index.ok()) return index.status();
  const int my_index = *index;
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_ranks_[r]);
  if (host_group_ && !options_.new_host_subgroup) {
    return absl::FailedPreconditionError(
        "new_host_subgroup: this transport has a host group but no factory for its subgroups");
  }
  c10::intrusive_ptr<c10d::ProcessGroup> group, host_group;
  try {
    group = options_.new_subgroup(global, my_index);
    if (host_group_) host_group = options_.new_host_subgroup(global, my_index);
  } catch (const c10::Error& e) {
    return absl::UnavailableError(absl::StrCat("new subgroup: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("new subgroup: ", e.what()));
  }
  auto wrong_shape = [&](const c10::intrusive_ptr<c10d::ProcessGroup>& g) {
    return !g || g->getSize() != static_cast<int>(ranks.size()) || g->getRank() != my_index;
  };
  if (wrong_shape(group) || (host_group_ && wrong_shape(host_group))) {
    return absl::InternalError("new_subgroup: the factory returned a group of the wrong shape");
  }
  return std::unique_ptr<Transport>(
      new C10dTransport(std::move(group), std::move(host_group), options_, std::move(global)));
}

}  // namespace knapformer
