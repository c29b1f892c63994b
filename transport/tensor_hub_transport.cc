#include "transport/tensor_hub_transport.h"

#include <cstring>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "absl/strings/str_cat.h"
#include "transport/agreement.h"
#include "transport/backend_checks.h"

namespace knapformer {
namespace {

// `bytes` bytes at `data` on `device`, as a tensor that does not own them.
at::Tensor Bytes(const void* data, int64_t bytes, const c10::Device& device) {
  return at::from_blob(const_cast<void*>(data), {bytes},
                       at::TensorOptions().dtype(at::kByte).device(device));
}

// The first non-empty verdict of a hub round, as every rank's error.
absl::Status FirstVerdict(const std::vector<std::string>& verdicts, absl::StatusCode code) {
  for (const std::string& v : verdicts) {
    if (!v.empty()) return absl::Status(code, v);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::unique_ptr<TensorHubTransport>> TensorHubTransport::CreateGroup(
    int size, c10::Device device, absl::Duration timeout) {
  auto hub = std::make_shared<LocalHub>(size, timeout);
  std::vector<std::unique_ptr<TensorHubTransport>> group;
  for (int r = 0; r < size; ++r) {
    group.push_back(std::make_unique<TensorHubTransport>(hub, r, device));
  }
  return group;
}

absl::Status TensorHubTransport::MoveRows(const void* send,
                                          const std::vector<int64_t>& send_rows, void* recv,
                                          const std::vector<int64_t>& recv_rows,
                                          int64_t row_bytes, bool /*counts_checked*/) {
  const int n = size();
  if (absl::Status valid = CheckExchange(send_rows, recv_rows, row_bytes, n); !valid.ok()) {
    return valid;
  }
  // Round 1: where every rank's send buffer is, and its rows to each rank.
  std::string mine(sizeof(uint64_t) + sizeof(int64_t) * n, '\0');
  const uint64_t address = reinterpret_cast<uintptr_t>(send);
  std::memcpy(mine.data(), &address, sizeof(address));
  std::memcpy(mine.data() + sizeof(address), send_rows.data(), sizeof(int64_t) * n);
  auto all = hub_->Exchange(round_++, rank_, std::move(mine));
  if (!all.ok()) return all.status();
  std::vector<const char*> from(n);
  std::vector<std::vector<int64_t>> rows(n, std::vector<int64_t>(n));
  std::vector<int64_t> sent_to_me(n);
  for (int p = 0; p < n; ++p) {
    uint64_t theirs = 0;
    std::memcpy(&theirs, (*all)[p].data(), sizeof(theirs));
    from[p] = reinterpret_cast<const char*>(static_cast<uintptr_t>(theirs));
    std::memcpy(rows[p].data(), (*all)[p].data() + sizeof(theirs), sizeof(int64_t) * n);
    sent_to_me[p] = rows[p][rank_];
  }
  // Round 2: every rank's count verdict, so that a mismatch fails every rank
  // alike before anything is copied. Always: the copies below read the
  // senders' buffers by these counts (counts_checked changes nothing).
  auto verdicts = hub_->Exchange(
      round_++, rank_, VerdictBytes(CountVerdict(rank_, n, sent_to_me, recv_rows, row_bytes)));
  if (!verdicts.ok()) return verdicts.status();
  if (absl::Status agreed = JudgeVerdictBytes(*verdicts); !agreed.ok()) return agreed;
  std::string failed;
  try {
    char* out = static_cast<char*>(recv);
    for (int p = 0; p < n; ++p) {
      const int64_t bytes = recv_rows[p] * row_bytes;
      if (bytes > 0) {
        int64_t before = 0;
        for (int q = 0; q < rank_; ++q) before += rows[p][q];
        Bytes(out, bytes, device_).copy_(Bytes(from[p] + before * row_bytes, bytes, device_));
      }
      out += bytes;
    }
  } catch (const c10::Error& e) {
    failed = absl::StrCat("all-to-all: rank ", rank_, ": ", e.what_without_backtrace());
  }
  // Round 3: every copy from a sender's buffer is queued before the sender
  // returns (and may free or overwrite it).
  auto done = hub_->Exchange(round_++, rank_, failed);
  if (!done.ok()) return done.status();
  return FirstVerdict(*done, absl::StatusCode::kInternal);
}

absl::Status TensorHubTransport::CheckRowCounts(const std::vector<int64_t>& send_rows,
                                                const std::vector<int64_t>& recv_rows) {
  const int n = size();
  if (absl::Status sizes = CheckRowVectorSizes(send_rows, recv_rows, n); !sizes.ok()) {
    return sizes;
  }
  // Every rank's send and receive counts in one round: every rank judges
  // every rank's verdict without a second round.
  std::string mine(2 * sizeof(int64_t) * n, '\0');
  std::memcpy(mine.data(), send_rows.data(), sizeof(int64_t) * n);
  std::memcpy(mine.data() + sizeof(int64_t) * n, recv_rows.data(), sizeof(int64_t) * n);
  auto all = hub_->Exchange(round_++, rank_, std::move(mine));
  if (!all.ok()) return all.status();
  auto count = [&](int of, bool receives, int peer) {
    int64_t value = 0;
    std::memcpy(&value, (*all)[of].data() + sizeof(int64_t) * ((receives ? n : 0) + peer),
                sizeof(value));
    return value;
  };
  std::vector<int64_t> verdicts;
  for (int receiver = 0; receiver < n; ++receiver) {
    std::vector<int64_t> sent(n), expected(n);
    for (int sender = 0; sender < n; ++sender) {
      sent[sender] = count(sender, /*receives=*/false, receiver);
      expected[sender] = count(receiver, /*receives=*/true, sender);
    }
    const std::vector<int64_t> verdict = CountVerdict(receiver, n, sent, expected, 0);
    verdicts.insert(verdicts.end(), verdict.begin(), verdict.end());
  }
  return JudgeVerdicts(verdicts, n);
}

absl::StatusOr<std::vector<std::string>> TensorHubTransport::AllGatherBytes(
    absl::string_view mine) {
  return hub_->Exchange(round_++, rank_, std::string(mine));
}

absl::StatusOr<std::unique_ptr<Transport>> TensorHubTransport::Subgroup(
    const std::vector<int>& ranks) {
  absl::StatusOr<int> position = IndexInSubgroup(ranks, rank_, size());
  if (!position.ok()) return position.status();
  return std::unique_ptr<Transport>(
      new TensorHubTransport(hub_->SubHub(ranks), *position, device_));
}

}  // namespace knapformer
