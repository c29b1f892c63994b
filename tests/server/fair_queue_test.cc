// The solver queue's order: round-robin between tenants, then between a
// tenant's jobs, in order within a job, and a job that arrives late is
// served within one turn of the others.
#include "server/fair_queue.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace knapformer {
namespace {

// Pushes a task of `job` (its own tenant unless `tenant` is given) that
// appends `name` to `order`.
void PushNamed(FairQueue* queue, const std::string& job, const std::string& name,
               std::vector<std::string>* order, const std::string& tenant = "") {
  queue->Push(tenant.empty() ? job : tenant, job, [order, name] { order->push_back(name); });
}

// Runs every queued task; their names in the order run.
void RunAll(FairQueue* queue) {
  while (std::function<void()> task = queue->Pop()) task();
}

TEST(FairQueueTest, EmptyQueueGivesNoTask) {
  FairQueue queue;
  EXPECT_EQ(queue.Pop(), nullptr);
  EXPECT_EQ(queue.size(), 0);
}

TEST(FairQueueTest, AFloodingJobDelaysAnotherByOneTurn) {
  FairQueue queue;
  std::vector<std::string> order;
  for (int i = 0; i < 5; ++i) PushNamed(&queue, "flood", "flood" + std::to_string(i), &order);
  PushNamed(&queue, "quiet", "quiet0", &order);
  EXPECT_EQ(queue.size(), 6);
  RunAll(&queue);
  EXPECT_EQ(order, (std::vector<std::string>{"flood0", "quiet0", "flood1", "flood2", "flood3",
                                             "flood4"}));
  EXPECT_EQ(queue.size(), 0);
}

TEST(FairQueueTest, JobsTakeTurnsInOrderWithinEach) {
  FairQueue queue;
  std::vector<std::string> order;
  PushNamed(&queue, "b", "b0", &order);
  PushNamed(&queue, "b", "b1", &order);
  PushNamed(&queue, "a", "a0", &order);
  PushNamed(&queue, "c", "c0", &order);
  PushNamed(&queue, "a", "a1", &order);
  RunAll(&queue);
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "b0", "c0", "a1", "b1"}));
}

// The turn continues after the job served last, also across pushes made
// between pops: a job already served waits for the others.
TEST(FairQueueTest, TheTurnOutlivesAnEmptyQueue) {
  FairQueue queue;
  std::vector<std::string> order;
  PushNamed(&queue, "a", "a0", &order);
  PushNamed(&queue, "b", "b0", &order);
  queue.Pop()();  // a0
  PushNamed(&queue, "a", "a1", &order);
  queue.Pop()();  // b0: after a
  queue.Pop()();  // a1
  EXPECT_EQ(queue.Pop(), nullptr);
  PushNamed(&queue, "a", "a2", &order);
  PushNamed(&queue, "c", "c0", &order);
  RunAll(&queue);  // a served last: c first
  EXPECT_EQ(order, (std::vector<std::string>{"a0", "b0", "a1", "c0", "a2"}));
}

// One tenant's two job ids get one turn between them, not two: the other
// tenant's steps come every other task.
TEST(FairQueueTest, ATenantsJobsShareItsTurn) {
  FairQueue queue;
  std::vector<std::string> order;
  for (int i = 0; i < 3; ++i) {
    PushNamed(&queue, "a/1", "a1-" + std::to_string(i), &order, "a/");
    PushNamed(&queue, "a/2", "a2-" + std::to_string(i), &order, "a/");
  }
  PushNamed(&queue, "b/1", "b0", &order, "b/");
  PushNamed(&queue, "b/1", "b1", &order, "b/");
  RunAll(&queue);
  EXPECT_EQ(order, (std::vector<std::string>{"a1-0", "b0", "a2-0", "b1", "a1-1", "a2-1", "a1-2",
                                             "a2-2"}));
}

}  // namespace
}  // namespace knapformer
