#ifndef KNAPFORMER_TRANSPORT_LOCAL_TRANSPORT_H_
#define KNAPFORMER_TRANSPORT_LOCAL_TRANSPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace knapformer {

// The meeting point of the ranks of one in-process group: each collective
// is an exchange of one byte string per rank. Thread-safe.
class LocalHub {
 public:
  LocalHub(int size, absl::Duration timeout) : size_(size), timeout_(timeout) {}

  int size() const { return size_; }

  // Round `round` of rank `rank`: deposits `mine`, waits until every rank
  // has, and returns all of them by rank. DeadlineExceeded naming the
  // missing ranks after the hub's timeout.
  absl::StatusOr<std::vector<std::string>> Exchange(uint64_t round, int rank, std::string mine);

  // The hub of a subgroup, shared by its members (created on first use).
  std::shared_ptr<LocalHub> SubHub(const std::vector<int>& ranks);

 private:
  struct Round {
    std::vector<std::string> blobs;
    std::vector<bool> arrived;
    int count = 0;
    int departed = 0;
  };

  const int size_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::map<uint64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
  std::map<std::vector<int>, std::shared_ptr<LocalHub>> subhubs_ ABSL_GUARDED_BY(mu_);
};

// A Transport between threads of one process, for tests and for running the
// client's logic without a distributed engine. Every collective copies
// through the hub (O(size x bytes)); it is for correctness, not speed.
class LocalTransport final : public Transport {
 public:
  // One transport per rank of a new hub of `size` ranks.
  static std::vector<std::unique_ptr<LocalTransport>> CreateGroup(
      int size, absl::Duration timeout = absl::Seconds(30));

  LocalTransport(std::shared_ptr<LocalHub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }
  // Every rank's segments to each peer, concatenated, in one round of the
  // hub (and so a flagged all-to-all's flags travel in that round).
  bool MovesSegments() const override { return true; }
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) override;
  absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) override;

 protected:
  // The counts travel with the rows through the hub: always checked, at no
  // cost (counts_checked changes nothing).
  absl::Status MoveRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        bool counts_checked) override;
  absl::Status MoveSegments(const std::vector<SendSegment>& sends,
                            const std::vector<RecvSegment>& recvs, int64_t row_bytes,
                            uint8_t mine, std::vector<uint8_t>* flags) override;

 private:
  std::shared_ptr<LocalHub> hub_;
  const int rank_;
  uint64_t round_ = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_LOCAL_TRANSPORT_H_
