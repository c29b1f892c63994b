// The NCCL transport's deadline watchdog, on the CPU: work that never ends
// fails once, at its deadline, and calls on_failure exactly once; work that
// ends is retired; an asynchronous error fails the watched work; host waits
// are bounded and return the failure.
#include "transport/deadline_watchdog.h"

#include <atomic>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/time/clock.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

struct Counters {
  std::atomic<int> failures{0};
  std::atomic<int> released{0};
  std::atomic<bool> async_error{false};
};

std::unique_ptr<DeadlineWatchdog> Make(std::shared_ptr<Counters> counters) {
  DeadlineWatchdog::Hooks hooks;
  hooks.poll_error = [counters]() {
    return counters->async_error ? absl::UnavailableError("peer 3 closed its socket")
                                 : absl::OkStatus();
  };
  hooks.on_failure = [counters](const absl::Status&) { ++counters->failures; };
  return std::make_unique<DeadlineWatchdog>(std::move(hooks), absl::Milliseconds(1));
}

bool WaitUntil(const std::function<bool()>& condition, absl::Duration bound) {
  const absl::Time deadline = absl::Now() + bound;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(DeadlineWatchdog, FinishedWorkIsRetiredWithoutFailure) {
  auto counters = std::make_shared<Counters>();
  auto watchdog = Make(counters);
  std::atomic<bool> done{false};
  watchdog->Watch([&]() -> absl::StatusOr<bool> { return done.load(); },
                  [counters] { ++counters->released; }, absl::Now() + absl::Seconds(30), "x");
  EXPECT_EQ(watchdog->pending(), 1u);
  done = true;
  ASSERT_TRUE(WaitUntil([&] { return watchdog->pending() == 0; }, absl::Seconds(10)));
  EXPECT_EQ(counters->released, 1);
  EXPECT_EQ(counters->failures, 0);
  EXPECT_TRUE(watchdog->failure().ok());
}

TEST(DeadlineWatchdog, WorkPastItsDeadlineFailsOnceAndEveryWaitSeesIt) {
  auto counters = std::make_shared<Counters>();
  auto watchdog = Make(counters);
  const absl::Time start = absl::Now();
  for (int i = 0; i < 3; ++i) {  // a hung exchange and two behind it
    watchdog->Watch([]() -> absl::StatusOr<bool> { return false; },
                    [counters] { ++counters->released; }, start + absl::Milliseconds(50),
                    "all-to-all");
  }
  ASSERT_TRUE(WaitUntil([&] { return !watchdog->failure().ok(); }, absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsUnavailable(watchdog->failure()));
  EXPECT_THAT(std::string(watchdog->failure().message()),
              HasSubstr("all-to-all: not done within the transport's timeout"));
  // The failure is recorded before the hook runs (on the watchdog's thread).
  EXPECT_TRUE(WaitUntil([&] { return counters->failures == 1; }, absl::Seconds(10)));
  // A host wait after the failure returns it at once, even for work that
  // would complete.
  absl::Status waited = watchdog->Wait([]() -> absl::StatusOr<bool> { return true; },
                                       absl::Now() + absl::Seconds(30), "count check");
  EXPECT_EQ(waited, watchdog->failure());
  watchdog.reset();
  EXPECT_EQ(counters->released, 3);  // every item released, once
  EXPECT_EQ(counters->failures, 1);
}

TEST(DeadlineWatchdog, AnAsynchronousErrorFailsWatchedWork) {
  auto counters = std::make_shared<Counters>();
  auto watchdog = Make(counters);
  watchdog->Watch([]() -> absl::StatusOr<bool> { return false; }, nullptr,
                  absl::Now() + absl::Hours(1), "all-to-all");
  counters->async_error = true;
  ASSERT_TRUE(WaitUntil([&] { return !watchdog->failure().ok(); }, absl::Seconds(10)));
  EXPECT_THAT(std::string(watchdog->failure().message()), HasSubstr("peer 3 closed its socket"));
  // The failure is recorded before the hook runs (on the watchdog's thread):
  // an ASan run under load checked the count in between and saw 0.
  EXPECT_TRUE(WaitUntil([&] { return counters->failures == 1; }, absl::Seconds(10)));
  watchdog.reset();
  EXPECT_EQ(counters->failures, 1);  // once
}

TEST(DeadlineWatchdog, HostWaitsAreBounded) {
  auto counters = std::make_shared<Counters>();
  auto watchdog = Make(counters);
  std::atomic<int> polls{0};
  EXPECT_TRUE(watchdog
                  ->Wait([&]() -> absl::StatusOr<bool> { return ++polls >= 3; },
                         absl::Now() + absl::Seconds(30), "count check")
                  .ok());
  const absl::Time start = absl::Now();
  absl::Status hung = watchdog->Wait([]() -> absl::StatusOr<bool> { return false; },
                                     start + absl::Milliseconds(30), "count check");
  EXPECT_TRUE(absl::IsUnavailable(hung)) << hung;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(counters->failures, 1);
  // A poll that fails is a failure too (recorded once: the first stays).
  absl::Status later = watchdog->Wait(
      []() -> absl::StatusOr<bool> { return absl::InternalError("cudaEventQuery"); },
      absl::Now() + absl::Seconds(30), "x");
  EXPECT_EQ(later, hung);
  EXPECT_EQ(counters->failures, 1);
}

}  // namespace
}  // namespace knapformer
