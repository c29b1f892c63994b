#ifndef KNAPFORMER_TESTS_TESTING_RECORDING_TRANSPORT_H_
#define KNAPFORMER_TESTS_TESTING_RECORDING_TRANSPORT_H_

// A Transport around another one, for tests: records every data exchange
// (its row size) and can inject the faults a rank meets alone: a device it
// does not have (so every tensor fails the balancer's device check), a
// failed count check in its subgroups, a refused all-to-all. Subgroups are
// wrapped the same way.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "transport/transport.h"

namespace knapformer {
namespace testing_util {

struct Faults {
  // cuda_device() says this device instead of the real one (host memory).
  int claimed_cuda_device = -1;
  // The next this-many subgroup CheckRowCounts calls return this error
  // without taking part (the whole subgroup must be given the same fault,
  // as a real count mismatch is the same error in every member).
  int failing_subgroup_checks = 0;
  absl::Status subgroup_check_error = absl::InvalidArgumentError("injected count mismatch");
  // Counted over every subgroup made from the transport (not faults: what
  // the subgroups' wrappers, made inside the code under test, saw).
  // MovesSegments() says false (a transport that moves contiguous buffers
  // only, as NCCL's do).
  bool hide_segments = false;
  int subgroup_all_gathers = 0;
  int subgroup_flagged = 0;
  int subgroup_exchanges = 0;
};

class RecordingTransport final : public Transport {
 public:
  // Borrows `inner` (it must outlive this).
  RecordingTransport(Transport* inner, std::shared_ptr<Faults> faults)
      : inner_(inner), faults_(std::move(faults)) {}
  RecordingTransport(std::unique_ptr<Transport> owned, std::shared_ptr<Faults> faults,
                     bool is_subgroup)
      : inner_(owned.get()),
        owned_(std::move(owned)),
        faults_(std::move(faults)),
        is_subgroup_(is_subgroup) {}

  // Row sizes of the data exchanges, in call order.
  const std::vector<int64_t>& exchanges() const { return exchanges_; }
  // AllGatherBytes calls so far (the agreement's collective).
  int all_gathers() const { return all_gathers_; }
  // Flagged all-to-alls so far (exchanges that carry their own flags).
  int flagged() const { return flagged_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  int cuda_device() const override {
    return faults_->claimed_cuda_device >= 0 ? faults_->claimed_cuda_device
                                             : inner_->cuda_device();
  }
  absl::Status AllToAll(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        const AllToAllOptions& options = {}) override {
    exchanges_.push_back(row_bytes);
    if (options.flags != nullptr) ++flagged_;
    if (is_subgroup_) {
      if (options.flags != nullptr) ++faults_->subgroup_flagged;
      ++faults_->subgroup_exchanges;
    }
    return inner_->AllToAll(send, send_rows, recv, recv_rows, row_bytes, options);
  }
  bool MovesSegments() const override {
    return !faults_->hide_segments && inner_->MovesSegments();
  }
  absl::Status CheckRowCounts(const std::vector<int64_t>& send_rows,
                              const std::vector<int64_t>& recv_rows) override {
    if (is_subgroup_ && faults_->failing_subgroup_checks > 0) {
      --faults_->failing_subgroup_checks;
      return faults_->subgroup_check_error;
    }
    return inner_->CheckRowCounts(send_rows, recv_rows);
  }
  absl::StatusOr<std::vector<std::string>> AllGatherBytes(absl::string_view mine) override {
    ++all_gathers_;
    if (is_subgroup_) ++faults_->subgroup_all_gathers;
    return inner_->AllGatherBytes(mine);
  }
  absl::StatusOr<std::unique_ptr<Transport>> Subgroup(const std::vector<int>& ranks) override {
    auto sub = inner_->Subgroup(ranks);
    if (!sub.ok()) return sub.status();
    return std::unique_ptr<Transport>(
        new RecordingTransport(*std::move(sub), faults_, /*is_subgroup=*/true));
  }

 protected:
  // Not reached: AllToAll hands every all-to-all, whole, to the inner one.
  absl::Status MoveRows(const void* send, const std::vector<int64_t>& send_rows, void* recv,
                        const std::vector<int64_t>& recv_rows, int64_t row_bytes,
                        bool counts_checked) override {
    return inner_->AllToAll(send, send_rows, recv, recv_rows, row_bytes,
                            counts_checked ? AllToAllOptions::Checked() : AllToAllOptions());
  }

 private:
  Transport* inner_;
  std::unique_ptr<Transport> owned_;
  std::shared_ptr<Faults> faults_;
  bool is_subgroup_ = false;
  std::vector<int64_t> exchanges_;
  int all_gathers_ = 0;
  int flagged_ = 0;
};

}  // namespace testing_util
}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_TESTING_RECORDING_TRANSPORT_H_
