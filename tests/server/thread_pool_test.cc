// The solver pool's timed tasks: not run before their time, run soon after
// it without a thread sleeping, woken early by a task due sooner, and all run
// by the destructor (a delayed answer is never dropped).
#include "server/thread_pool.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

// When each task ran, by task index; InfinitePast while not run.
class RunTimes {
 public:
  explicit RunTimes(int n) : times_(n, absl::InfinitePast()) {}
  std::function<void()> Task(int i) {
    return [this, i] {
      absl::MutexLock lock(&mu_);
      times_[i] = absl::Now();
    };
  }
  absl::Time At(int i) {
    absl::MutexLock lock(&mu_);
    return times_[i];
  }
  bool WaitRan(int i, absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto ran = [this, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return times_[i] != absl::InfinitePast();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&ran), bound);
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Time> times_ ABSL_GUARDED_BY(mu_);
};

// Returns once the pool's thread runs tasks (a sanitizer can delay a new
// thread's start by hundreds of milliseconds).
void AwaitRunning(ThreadPool& pool) {
  RunTimes warm(1);
  pool.Schedule(warm.Task(0));
  ASSERT_TRUE(warm.WaitRan(0, absl::Seconds(30)));
}

TEST(ThreadPool, ATimedTaskRunsAfterItsTimeAndOthersRunMeanwhile) {
  RunTimes runs(2);    // outlives the pool, whose destructor may run tasks
  ThreadPool pool(1);  // one thread: a sleeping timed task would block the other
  AwaitRunning(pool);
  const absl::Time start = absl::Now();
  pool.ScheduleAt(start + absl::Milliseconds(300), runs.Task(0));
  pool.Schedule(runs.Task(1));
  ASSERT_TRUE(runs.WaitRan(1, absl::Seconds(10)));
  EXPECT_LT(runs.At(1) - start, absl::Milliseconds(250)) << "the plain task waited";
  EXPECT_EQ(runs.At(0), absl::InfinitePast()) << "the timed task ran early";
  ASSERT_TRUE(runs.WaitRan(0, absl::Seconds(10)));
  EXPECT_GE(runs.At(0) - start, absl::Milliseconds(300));
}

TEST(ThreadPool, ATaskDueSoonerWakesAThreadWaitingForALaterOne) {
  RunTimes runs(2);
  ThreadPool pool(1);
  AwaitRunning(pool);
  const absl::Time start = absl::Now();
  pool.ScheduleAt(start + absl::Seconds(60), runs.Task(0));
  absl::SleepFor(absl::Milliseconds(50));  // the thread now waits for 60 s
  pool.ScheduleAt(start + absl::Milliseconds(100), runs.Task(1));
  ASSERT_TRUE(runs.WaitRan(1, absl::Seconds(10))) << "still waiting for the 60 s task";
  EXPECT_GE(runs.At(1) - start, absl::Milliseconds(100));
  EXPECT_EQ(runs.At(0), absl::InfinitePast());
}

TEST(ThreadPool, TasksDueTogetherRunInTheOrderScheduled) {
  std::vector<int> order;
  absl::Mutex mu;
  ThreadPool pool(1);
  const absl::Time when = absl::Now() + absl::Milliseconds(50);
  for (int i = 0; i < 5; ++i) {
    pool.ScheduleAt(when, [&, i] {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    });
  }
  absl::SleepFor(absl::Milliseconds(200));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ThreadPool, TheDestructorRunsTimedTasksAtOnce) {
  auto ran = std::make_shared<std::atomic<int>>(0);
  const absl::Time start = absl::Now();
  {
    ThreadPool pool(2);
    for (int i = 0; i < 3; ++i) {
      pool.ScheduleAt(start + absl::Hours(1), [ran] { ++*ran; });
    }
  }
  EXPECT_EQ(*ran, 3);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace knapformer
