#include "transport/local_transport.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "transport/backend_checks.h"

namespace knapformer {
namespace {

// An all-to-all contribution: the rows per destination, then the rows.
std::string PackRows(const void* send, const std::vector<int64_t>& send_rows, int64_t row_bytes) {
  int64_t total = 0;
  for (int64_t rows : send_rows) total += rows;
  std::string blob(sizeof(int64_t) * send_rows.size() + total * row_bytes, '\0');
  std::memcpy(blob.data(), send_rows.data(), sizeof(int64_t) * send_rows.size());
  if (total > 0) {
    std::memcpy(blob.data() + sizeof(int64_t) * send_rows.size(), send, total * row_bytes);
  }
  return blob;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LocalHub::Exchange(uint64_t round, int rank,
                                                            std::string mine) {
  absl::MutexLock lock(&mu_);
  Round& r = rounds_[round];
  if (r.blobs.empty()) {
    r.blobs.resize(size_);
    r.arrived.assign(size_, false);
  }
  r.blobs[rank] = std::move(mine);
  r.arrived[rank] = true;
  ++r.count;
  auto complete = [&r]() { return r.count == static_cast<int>(r.blobs.size()); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&complete), timeout_)) {
    std::vector<int> missing;
    for (int p = 0; p < size_; ++p) {
      if (!r.arrived[p]) missing.push_back(p);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "local transport: rank ", rank, " waited ", absl::FormatDuration(timeout_),
        " in collective ", round, " for ranks ", absl::StrJoin(missing, ",")));
  }
  std::vector<std::string> all = r.blobs;
  if (++r.departed == size_) rounds_.erase(round);
  return all;
}

std::shared_ptr<LocalHub> LocalHub::SubHub(const std::vector<int>& ranks) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<LocalHub>& hub = subhubs_[ranks];
  if (hub == nullptr) hub = std::make_shared<LocalHub>(static_cast<int>(ranks.size()), timeout_);
  return hub;
}

std::vector<std::unique_ptr<LocalTransport>> LocalTransport::CreateGroup(int size,
                                                                         absl::Duration timeout) {
  auto hub = std::make_shared<LocalHub>(size, timeout);
  std::vector<std::unique_ptr<LocalTransport>> group;
  for (int r = 0; r < size; ++r) group.push_back(std::make_unique<LocalTransport>(hub, r));
  return group;
}

absl::Status LocalTransport::MoveRows(const void* send, const std::vector<int64_t>& send_rows,
                                      void* recv, const std::vector<int64_t>& recv_rows,
                                      int64_t row_bytes, bool /*counts_checked*/) {
  const int n = size();
  if (absl::Status valid = CheckExchange(send_rows, recv_rows, row_bytes, n); !valid.ok()) {
    return valid;
  }
  auto all = hub_->Exchange(round_++, rank_, PackRows(send, send_rows, row_bytes));
  if (!all.ok()) return all.status();
  char* out = static_cast<char*>(recv);
  for (int p = 0; p < n; ++p) {
    const std::string& blob = (*all)[p];
    std::vector<int64_t> rows(n);
    std::memcpy(rows.data(), blob.data(), sizeof(int64_t) * n);
    if (rows[rank_] != recv_rows[p]) {
      return absl::InvalidArgumentError(absl::StrCat("all-to-all: rank ", rank_, " expects ",
                                                     recv_rows[p], " rows from rank ", p,
                                                     ", which sends ", rows[rank_]));
    }
    int64_t before = 0;
    for (int q = 0; q < rank_; ++q) before += rows[q];
    const char* data = blob.data() + sizeof(int64_t) * n + before * row_bytes;
    std::memcpy(out, data, recv_rows[p] * row_bytes);
    out += recv_rows[p] * row_bytes;
  }
  return absl::OkStatus();
}

absl::Status LocalTransport::MoveSegments(const std::vector<SendSegment>& sends,
                                          const std::vector<RecvSegment>& recvs,
                                          int64_t /*row_bytes*/, uint8_t mine,
                                          std::vector<uint8_t>* flags) {
  const int n = size();
  if (absl::Status valid = CheckSegments(sends, recvs, rank_, n); !valid.ok()) return valid;
  // [flag][bytes to each rank, int64 by rank][the bytes to rank 0][to rank 1]...
  std::vector<std::string> to(n);
  for (const SendSegment& s : sends) {
    to[s.peer].append(static_cast<const char*>(s.data), s.bytes);
  }
  std::string blob(1 + sizeof(int64_t) * n, '\0');
  blob[0] = static_cast<char>(mine);
  for (int p = 0; p < n; ++p) {
    const int64_t size = static_cast<int64_t>(to[p].size());
    std::memcpy(blob.data() + 1 + sizeof(int64_t) * p, &size, sizeof(size));
  }
  for (const std::string& part : to) blob += part;
  auto all = hub_->Exchange(round_++, rank_, std::move(blob));
  if (!all.ok()) return all.status();
  if (flags != nullptr) flags->assign(n, 0);
  std::vector<absl::string_view> from(n);
  for (int p = 0; p < n; ++p) {
    const std::string& theirs = (*all)[p];
    if (theirs.size() < 1 + sizeof(int64_t) * n) {
      return absl::InternalError(absl::StrCat("segment exchange: rank ", p, " sent ",
                                              theirs.size(), " bytes, not a segment exchange"));
    }
    if (flags != nullptr) (*flags)[p] = static_cast<uint8_t>(theirs[0]);
    int64_t offset = 1 + sizeof(int64_t) * n;
    int64_t size = 0;
    for (int q = 0; q <= rank_; ++q) {
      std::memcpy(&size, theirs.data() + 1 + sizeof(int64_t) * q, sizeof(size));
      if (q < rank_) offset += size;
    }
    from[p] = absl::string_view(theirs).substr(offset, size);
  }
  std::vector<int64_t> read(n, 0);
  for (const RecvSegment& r : recvs) {
    if (read[r.peer] + r.bytes > static_cast<int64_t>(from[r.peer].size())) {
      return absl::InvalidArgumentError(absl::StrCat("segment exchange: rank ", rank_,
                                                     " expects more bytes from rank ", r.peer,
                                                     " than its ", from[r.peer].size()));
    }
    std::memcpy(r.data, from[r.peer].data() + read[r.peer], r.bytes);
    read[r.peer] += r.bytes;
  }
  for (int p = 0; p < n; ++p) {
    if (p != rank_ && read[p] != static_cast<int64_t>(from[p].size())) {
      return absl::InvalidArgumentError(absl::StrCat("segment exchange: rank ", rank_, " reads ",
                                                     read[p], " bytes from rank ", p,
                                                     ", which sends it ", from[p].size()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> LocalTransport::AllGatherBytes(absl::string_view mine) {
  return hub_->Exchange(round_++, rank_, std::string(mine));
}

absl::StatusOr<std::unique_ptr<Transport>> LocalTransport::Subgroup(const std::vector<int>& ranks) {
  absl::StatusOr<int> position = IndexInSubgroup(ranks, rank_, size());
  if (!position.ok()) return position.status();
  return std::unique_ptr<Transport>(new LocalTransport(hub_->SubHub(ranks), *position));
}

}  // namespace knapformer
