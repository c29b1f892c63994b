// A Plan answer from a buggy or hostile service (any bytes), as a rank's
// client takes it: the first byte picks the rank of an 8-rank world
// (g1n2+g2n1+g4n1) and the number of its sequences, the next bytes their
// lengths, the rest is the PlanResponse. The client's checks either refuse
// the plan or derive a layout whose orders are permutations of exactly the
// rows it moves; nothing is read or written out of bounds (ASan), nothing
// overflows (UBSan), and nothing is allocated for what peers are claimed
// to send before they confirm it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "client/route_layout.h"
#include "google/protobuf/stubs/logging.h"
#include "knapformer/v1/planner.pb.h"
#include "planner/topology.h"
#include "proto/plan_proto.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// Peers confirm at most what exists: the fuzzer stands in for them with a
// bound, so that a claim past it (refused by the real exchange) is not
// listed here.
constexpr int64_t kConfirmedRows = 1 << 20;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace knapformer;
  // Invalid UTF-8 in a string field is a parse failure; protobuf's log line
  // about each one would drown the fuzzer's output.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size < 1) return 0;
  static const World* const world =
      new World(*World::Create(*Topology::Parse("g1n2+g2n1+g4n1"), 8));
  const int rank = data[0] & 7;
  const int sequences = std::min<int>(data[0] >> 3, static_cast<int>(size) - 1);
  std::vector<int64_t> lengths;
  for (int i = 0; i < sequences; ++i) lengths.push_back(data[1 + i]);
  v1::PlanResponse response;
  if (!response.ParseFromArray(data + 1 + sequences, static_cast<int>(size - 1 - sequences))) {
    return 0;
  }
  absl::StatusOr<RankPlan> plan = RankPlanFromProto(response.plan(), world->world_size());
  if (!plan.ok()) return 0;
  const RankLocation where = world->Locate(rank);
  const Bag& bag = world->topology().bag(where.bag);
  absl::StatusOr<RouteLayout> layout = DeriveRouteLayout(
      *plan, lengths, rank, world->world_size(), bag.gpus,
      world->RankOf({where.replica, where.bag, 0}));
  if (!layout.ok()) return 0;
  const int64_t input = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  fuzz::Require(layout->input_rows == input, "input rows are the lengths' sum");
  fuzz::Require(static_cast<int64_t>(layout->send_index.size()) == input, "every row is sent");
  fuzz::RequirePermutation(layout->send_index, "the send order is a permutation of the input");
  fuzz::Require(std::accumulate(layout->send_rows.begin(), layout->send_rows.end(), int64_t{0}) ==
                    input,
                "send counts add up to the input");
  fuzz::Require(std::accumulate(layout->recv_rows.begin(), layout->recv_rows.end(), int64_t{0}) ==
                    layout->routed_rows,
                "receive counts add up to the routed rows");
  if (bag.gpus == 1) return 0;
  for (int64_t rows : layout->ulysses_recv_rows) {
    if (rows > kConfirmedRows) return 0;  // the exchange's count check refuses it
  }
  const std::vector<int64_t> index = AttentionIndex(layout->ulysses_recv_rows, plan->ulysses);
  const int64_t received = std::accumulate(layout->ulysses_recv_rows.begin(),
                                           layout->ulysses_recv_rows.end(), int64_t{0});
  fuzz::Require(static_cast<int64_t>(index.size()) == layout->attention_rows &&
                    layout->attention_rows == received,
                "the attention order covers exactly the received rows");
  fuzz::RequirePermutation(index, "the attention order is a permutation");
  return 0;
}
