#include "transport/c10d_transport.h"

#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <utility>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"

namespace knapformer {
namespace {

absl::Status FromException(const char* what, const char* op) {
  const std::string message = absl::StrCat(op, ": ", what);
  if (absl::StrContains(what, "imed out") || absl::StrContains(what, "imeout")) {
    return absl::DeadlineExceededError(message);
  }
  return absl::UnavailableError(message);
}

// Runs one c10d collective to completion; its exceptions become a status.
template <typename Collective>
absl::Status Run(const char* op, Collective&& collective) {
  try {
    c10::intrusive_ptr<c10d::Work> work = collective();
    work->wait();
    return absl::OkStatus();
  } catch (const c10::Error& e) {
    return FromException(e.what_without_backtrace(), op);
  } catch (const std::exception& e) {
    return FromException(e.what(), op);
  }
}

int64_t Sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

// A [rows, row_bytes] byte view of `data` (or an empty tensor, since a null
// pointer may not back a view).
at::Tensor ByteRows(void* data, int64_t rows, int64_t row_bytes, c10::Device device) {
  const auto options = at::TensorOptions().dtype(at::kByte).device(device);
  if (rows == 0 || row_bytes == 0 || data == nullptr) return at::empty({rows, row_bytes}, options);
  return at::from_blob(data, {rows, row_bytes}, options);
}

}  // namespace

C10dTransport::C10dTransport(c10::intrusive_ptr<c10d::ProcessGroup> group,
                             C10dTransportOptions options, std::vector<int> global_ranks)
    : group_(std::move(group)),
      options_(std::move(options)),
      global_ranks_(std::move(global_ranks)) {}

absl::StatusOr<std::unique_ptr<C10dTransport>> C10dTransport::Create(
    c10::intrusive_ptr<c10d::ProcessGroup> group, C10dTransportOptions options) {
  if (!group) return absl::InvalidArgumentError("group: must not be null");
  std::vector<int> ranks(group->getSize());
  std::iota(ranks.begin(), ranks.end(), 0);
  return std::unique_ptr<C10dTransport>(
      new C10dTransport(std::move(group), std::move(options), std::move(ranks)));
}

int C10dTransport::rank() const { return group_->getRank(); }
int C10dTransport::size() const { return group_->getSize(); }

absl::Status C10dTransport::CheckRowCounts(const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) {
  const int n = size();
  if (absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, n); !sizes.ok()) {
    return sizes;
  }
  at::Tensor sent_to_me = at::empty({n}, at::kLong);
  at::Tensor i_send = at::from_blob(const_cast<int64_t*>(send_rows.data()), {n}, at::kLong).clone();
  std::vector<int64_t> equal_splits;  // empty = n equal splits
  absl::Status status = Run("all-to-all of row counts", [&] {
    return group_->alltoall_base(sent_to_me, i_send, equal_splits, equal_splits);
  });
  if (!status.ok()) return status;

  // Every rank learns the first disagreement (smallest receiver, then
  // sender) so that all of them return the same error, not only the one
  // that saw it.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  at::Tensor mine = at::full({3}, kNone, at::kLong);
  const int64_t* sent = sent_to_me.data_ptr<int64_t>();
  for (int p = 0; p < n; ++p) {
    if (sent[p] != recv_rows[p]) {
      mine[0] = int64_t{rank()} * n + p;
      mine[1] = recv_rows[p];
      mine[2] = sent[p];
      break;
    }
  }
  std::vector<std::vector<at::Tensor>> all(1);
  for (int p = 0; p < n; ++p) all[0].push_back(at::empty({3}, at::kLong));
  std::vector<at::Tensor> input = {mine};
  status = Run("all-gather of count checks", [&] { return group_->allgather(all, input); });
  if (!status.ok()) return status;
  int64_t first = kNone, expected = 0, got = 0;
  for (const at::Tensor& t : all[0]) {
    const int64_t* v = t.data_ptr<int64_t>();
    if (v[0] < first) std::tie(first, expected, got) = std::make_tuple(v[0], v[1], v[2]);
  }
  if (first == kNone) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "recv_rows: rank ", first / n, " expects ", expected, " rows from rank ", first % n,
      ", which sends it ", got));
}

absl::Status C10dTransport::AllToAllRows(const void* send, const std::vector<int64_t>& send_rows,
                                         void* recv, const std::vector<int64_t>& recv_rows,
                                         int64_t row_bytes) {
  return AllToAll(send, send_rows, recv, recv_rows, row_bytes, options_.check_counts);
}

absl::Status C10dTransport::AllToAllRowsPrechecked(const void* send,
                                                   const std::vector<int64_t>& send_rows,
                                                   void* recv,
                                                   const std::vector<int64_t>& recv_rows,
                                                   int64_t row_bytes) {
  return AllToAll(send, send_rows, recv, recv_rows, row_bytes, /*check_counts=*/false);
}

absl::Status C10dTransport::AllToAll(const void* send, const std::vector<int64_t>& send_rows,
                                     void* recv, const std::vector<int64_t>& recv_rows,
                                     int64_t row_bytes, bool check_counts) {
  const int n = size();
  if (absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, n); !sizes.ok()) {
    return sizes;
  }
  if (row_bytes < 0) return absl::InvalidArgumentError("row_bytes: must be >= 0");
  for (int p = 0; p < n; ++p) {
    if (send_rows[p] < 0 || recv_rows[p] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("send_rows/recv_rows: negative count for rank ", p));
    }
  }
  if (check_counts) {
    absl::Status status = CheckRowCounts(send_rows, recv_rows);
    if (!status.ok()) return status;
  }
  at::Tensor input = ByteRows(const_cast<void*>(send), Sum(send_rows), row_bytes, options_.device);
  at::Tensor output = ByteRows(recv, Sum(recv_rows), row_bytes, options_.device);
  // alltoall_base moves out of the split vectors it is given: pass copies.
  std::vector<int64_t> input_splits = send_rows;
  std::vector<int64_t> output_splits = recv_rows;
  return Run("all-to-all", [&] {
    return group_->alltoall_base(output, input, output_splits, input_splits);
  });
}

absl::StatusOr<std::vector<std::string>> C10dTransport::AllGatherBytes(absl::string_view mine) {
  const int n = size();
  const auto on_device = at::TensorOptions().device(options_.device);
  std::vector<std::vector<at::Tensor>> sizes(1);
  for (int p = 0; p < n; ++p) sizes[0].push_back(at::empty({1}, on_device.dtype(at::kLong)));
  std::vector<at::Tensor> my_size = {
      at::full({1}, static_cast<int64_t>(mine.size()), on_device.dtype(at::kLong))};
  absl::Status status =
      Run("all-gather of sizes", [&] { return group_->allgather(sizes, my_size); });
  if (!status.ok()) return status;
  std::vector<int64_t> lengths(n);
  int64_t longest = 0;
  for (int p = 0; p < n; ++p) {
    lengths[p] = sizes[0][p].to(at::kCPU).item<int64_t>();
    longest = std::max(longest, lengths[p]);
  }
  // Gloo's allgather needs equal sizes: pad to the longest.
  at::Tensor padded = at::zeros({longest}, at::kByte);
  if (!mine.empty()) std::memcpy(padded.data_ptr<uint8_t>(), mine.data(), mine.size());
  std::vector<at::Tensor> input = {padded.to(options_.device)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int p = 0; p < n; ++p) output[0].push_back(at::empty({longest}, on_device.dtype(at::kByte)));
  status = Run("all-gather", [&] { return group_->allgather(output, input); });
  if (!status.ok()) return status;
  std::vector<std::string> result(n);
  for (int p = 0; p < n; ++p) {
    at::Tensor host = output[0][p].to(at::kCPU);
    result[p].assign(reinterpret_cast<const char*>(host.data_ptr<uint8_t>()), lengths[p]);
  }
  return result;
}

absl::StatusOr<std::unique_ptr<Transport>> C10dTransport::Subgroup(const std::vector<int>& ranks) {
  if (!options_.new_subgroup) {
    return absl::FailedPreconditionError(
        "new_subgroup: this transport was created without a subgroup factory");
  }
  int my_index = -1;
  std::vector<int> global;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= size() || (i > 0 && ranks[i] <= ranks[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ranks: [", absl::StrJoin(ranks, ","), "] must be ascending ranks of a group of ",
          size()));
    }
    if (ranks[i] == rank()) my_index = static_cast<int>(i);
    global.push_back(global_ranks_[ranks[i]]);
  }
  if (my_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks: [", absl::StrJoin(ranks, ","), "] does not contain rank ", rank()));
  }
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  try {
    group = options_.new_subgroup(global, my_index);
  } catch (const c10::Error& e) {
    return FromException(e.what_without_backtrace(), "new subgroup");
  } catch (const std::exception& e) {
    return FromException(e.what(), "new subgroup");
  }
  if (!group || group->getSize() != static_cast<int>(ranks.size()) ||
      group->getRank() != my_index) {
    return absl::InternalError("new_subgroup: the factory returned a group of the wrong shape");
  }
  return std::unique_ptr<Transport>(
      new C10dTransport(std::move(group), options_, std::move(global)));
}

c10::intrusive_ptr<c10d::ProcessGroup> NewGlooGroup(c10::intrusive_ptr<c10d::Store> store,
                                                    int rank, int size,
                                                    const GlooGroupOptions& options) {
  auto gloo = c10d::ProcessGroupGloo::Options::create();
  gloo->timeout = options.timeout;
  gloo->devices.push_back(
      options.hostname.empty()
          ? c10d::ProcessGroupGloo::createDefaultDevice()
          : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo);
}

SubgroupFactory GlooSubgroupFactory(c10::intrusive_ptr<c10d::Store> store,
                                    GlooGroupOptions options) {
  auto created = std::make_shared<std::pair<std::mutex, std::map<std::vector<int>, int>>>();
  return [store = std::move(store), options = std::move(options), created](
             const std::vector<int>& global_ranks, int rank) {
    int serial = 0;
    {
      std::lock_guard<std::mutex> lock(created->first);
      serial = created->second[global_ranks]++;
    }
    const std::string prefix =
        absl::StrCat("knapformer/subgroup/", absl::StrJoin(global_ranks, ","), "/", serial);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return NewGlooGroup(prefixed, rank, static_cast<int>(global_ranks.size()), options);
  };
}

}  // namespace knapformer
