// The SequenceBalancer's data movement against the bare collective: 4 CPU
// processes (TCPStore + Gloo on 127.0.0.1) time Route + ReverseRoute and a
// layer's Ulysses exchanges (PreAttnTensors of q, k, v + PostAttn) and, in
// the same run and interleaved with them, bare c10d alltoall_base calls
// moving exactly the same rows (the minimum any implementation needs), and
// report the ratios; then they count the collectives of each exchange.
//
// Figures only, nothing is asserted about time. Per payload P per rank
// (1 MB and 16 MB of float32 rows of 1024, i.e. 4 KB per token):
//   each rank packs a seeded mix of 1-8 sequences summing to P / 4 KB tokens;
//   one PlanRouting (topology g1n2+g2n1: ranks 2 and 3 form the 2-GPU bag;
//   d_model 1024, gamma 1, local planning; not timed) gives the plan, whose
//   moved-token fraction is shown; ReverseRoute(Route(x)) must give x back
//   and PostAttn(PreAttn(q)) must give q back, bit for bit (else exit 1);
//   then K iterations (after 3 warm-up ones), each running every variant in
//   turn, each preceded by a barrier on the Gloo group:
//     (a) 2x alltoall_base with the plan's per-peer row splits (route, then
//         reverse) on preallocated contiguous [rows, 1024] float tensors
//     (b) Route + ReverseRoute as shipped (agree_on_errors: each call's
//         first exchange agreed once, later ones carry a status byte per
//         rank with their rows; the calls here are all later ones, as in
//         every layer and step of a training run after the first)
//     (c) (b) with agree_on_errors="every_exchange": one verdict all-gather
//         before every exchange (what every exchange paid before)
//     (d) (b) with agree_on_errors off: no agreement at all
//     (e) a layer's bare Ulysses exchanges in the 2-GPU bag: one
//         alltoall_base of q, k and v side by side (each [rows, 8 heads,
//         128] float32, the routed rows; 4 heads to each bag position) and
//         one of the attention output, on preallocated tensors
//     (f) PreAttnTensors({q, k, v}) + PostAttn(o) as shipped
//     (g) (f) with agree_on_errors="every_exchange"
//     (h) a layer's Ulysses exchanges as a hand-written implementation
//         makes them from the same tensors as (f): q, k and v's heads
//         for each bag position copied into one send buffer (a strided
//         copy each), one alltoall_base, the received heads put into
//         attention order (index_select), and the attention output the
//         other way (index_select, alltoall_base, a strided copy back
//         into whole rows); preallocated buffers. (e) skips the copies
//         any implementation needs; (h) makes them.
//   Each rank times each variant with std::chrono::steady_clock (wall time).
//   The headline is, per iteration, the slowest rank's time (all-gathered at
//   the end), then the median and p90 over iterations; rank 0's own times
//   (outside the bag: its layer is no exchange at all) are shown as well.
//   Then a balancer over a counting transport (tests/testing's
//   RecordingTransport) plans two steps of a route, 3 layers and a reverse
//   route, and the collectives of each exchange are printed.
//
//   bazel build -c opt //bench:route_bench
//   bazel-bin/bench/route_bench [--seed 0] [--timeout-seconds 600]
//
// The launcher owns the TCPStore server and starts 4 copies of this binary
// (rank and port in the environment, as tools/train_sim.cc does); it exits
// non-zero if a worker fails or is still running at --timeout-seconds.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/sequence_balancer.h"
#include "common/args.h"
#include "common/log.h"
#include "common/sample_stats.h"
#include "common/status_macros.h"
#include "launch/local_world.h"
#include "planner/plan.h"
#include "planner/splitmix64.h"
#include "tests/testing/recording_transport.h"
#include "transport/c10d_transport.h"

namespace knapformer {
namespace {

constexpr char kUsage[] = "usage: route_bench [--seed 0] [--timeout-seconds 600]\n";


constexpr int kProcs = 4;
constexpr char kTopology[] = "g1n2+g2n1";
constexpr int64_t kDModel = 1024;
constexpr int64_t kRowBytes = kDModel * sizeof(float);
constexpr int kWarmup = 3;
constexpr int kVariants = 8;  // (a) .. (h)
constexpr int kHeads = 8;
constexpr int64_t kHeadDim = kDModel / kHeads;
const std::vector<int> kBagRanks = {2, 3};  // g1n2+g2n1 on 4 ranks

struct Payload {
  int64_t bytes;  // per rank
  int iterations;
};
const std::vector<Payload> kPayloads = {{int64_t{1} << 20, 100}, {int64_t{16} << 20, 20}};

struct BenchOptions {
  uint64_t seed = 0;
  int timeout_seconds = 600;
};

absl::StatusOr<BenchOptions> ParseOptions(const std::vector<std::string>& argv) {
  KF_ASSIGN_OR_RETURN(Args args, Args::Parse(argv, {"seed", "timeout-seconds"}));
  BenchOptions o;
  KF_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0, 0, int64_t{1} << 62));
  KF_ASSIGN_OR_RETURN(int64_t timeout,
                      args.GetInt("timeout-seconds", o.timeout_seconds, 1, 86400));
  o.seed = static_cast<uint64_t>(seed);
  o.timeout_seconds = static_cast<int>(timeout);
  return o;
}

// `tokens` split into 1-8 uneven pieces at random cut points (seeded).
std::vector<int64_t> MakeLengths(int64_t tokens, uint64_t seed) {
  SplitMix64 rng(seed);
  const int pieces = 1 + static_cast<int>(rng.Below(8));
  std::vector<int64_t> cuts = {0, tokens};
  for (int i = 1; i < pieces; ++i) cuts.push_back(1 + static_cast<int64_t>(rng.Below(tokens - 1)));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<int64_t> lengths;
  for (size_t i = 1; i < cuts.size(); ++i) lengths.push_back(cuts[i] - cuts[i - 1]);
  return lengths;
}

// Exits the worker with a message (all ranks reach the same checks).
[[noreturn]] void Fail(int rank, const std::string& message) {
  std::cerr << "route_bench: rank " << rank << ": " << message << "\n";
  std::exit(1);
}

// True on every rank if `bad` is true on any.
bool AnyRank(c10d::ProcessGroup& group, bool bad) {
  std::vector<at::Tensor> flag = {at::full({1}, bad ? 1 : 0, at::kInt)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  group.allreduce(flag, max)->wait();
  return flag[0].item<int>() != 0;
}

// One payload's figures, as rank 0 prints them.
struct Row {
  int64_t bytes = 0, tokens = 0;
  int iterations = 0;
  double moved_fraction = 0;
  double max_off_rank_mb = 0;  // largest off-rank MB one rank sends in the route
  double max_before = 1, max_after = 1;
  std::vector<int> pieces;  // sequences per rank
  // [variant]: over iterations, of the slowest rank / of rank 0 alone.
  double slowest_median[kVariants], slowest_p90[kVariants];
  double rank0_median[kVariants], rank0_p90[kVariants];
};

std::string Mb(int64_t bytes) {
  return absl::StrFormat("%g MB", static_cast<double>(bytes) / (1 << 20));
}

void PrintTable(const std::vector<Row>& rows, bool slowest) {
  std::cout << absl::StrFormat(
      "%-8s %-6s %-9s | %-13s | %-13s %-6s | %-13s %-6s | %-13s %-6s | %-13s | %-13s %-6s | "
      "%-13s %-6s | %-14s %-6s\n",
      "payload", "moved", "off-rank", "(a) 2x a2a", "(b) route+rev", "(b)/(a)", "(c) every",
      "(c)/(a)", "(d) off", "(d)/(a)", "(e) bare layer", "(f) layer", "(f)/(e)", "(g) every",
      "(g)/(e)", "(h) hand layer", "(f)/(h)");
  std::cout << absl::StrFormat(
      "%-8s %-6s %-9s | %-6s %-6s | %-6s %-6s %-6s | %-6s %-6s %-6s | %-6s %-6s %-6s | %-6s "
      "%-6s | %-6s %-6s %-6s | %-6s %-6s %-6s | %-6s %-7s %-6s\n",
      "/rank", "frac", "MB (max)", "median", "p90", "median", "p90", "median", "median", "p90",
      "median", "median", "p90", "median", "median", "p90", "median", "p90", "median", "median",
      "p90", "median", "median", "p90", "median");
  for (const Row& r : rows) {
    const double* med = slowest ? r.slowest_median : r.rank0_median;
    const double* p90 = slowest ? r.slowest_p90 : r.rank0_p90;
    auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
    std::cout << absl::StrFormat(
        "%-8s %-6.3f %-9.3f | %-6.3f %-6.3f | %-6.3f %-6.3f %-6.2f | %-6.3f %-6.3f %-6.2f | "
        "%-6.3f %-6.3f %-6.2f | %-6.3f %-6.3f | %-6.3f %-6.3f %-6.2f | %-6.3f %-6.3f %-6.2f | "
        "%-6.3f %-7.3f %-6.2f\n",
        Mb(r.bytes), r.moved_fraction, r.max_off_rank_mb, med[0] * 1e3, p90[0] * 1e3,
        med[1] * 1e3, p90[1] * 1e3, ratio(med[1], med[0]), med[2] * 1e3, p90[2] * 1e3,
        ratio(med[2], med[0]), med[3] * 1e3, p90[3] * 1e3, ratio(med[3], med[0]), med[4] * 1e3,
        p90[4] * 1e3, med[5] * 1e3, p90[5] * 1e3, ratio(med[5], med[4]), med[6] * 1e3,
        p90[6] * 1e3, ratio(med[6], med[4]), med[7] * 1e3, p90[7] * 1e3,
        ratio(med[5], med[7]));
  }
}

std::vector<int64_t> RowSplits(const std::vector<Transfer>& transfers) {
  std::vector<int64_t> rows(kProcs, 0);
  for (const Transfer& t : transfers) rows[t.peer] += t.length;
  return rows;
}

// What the counting transport saw, summed over the world and its bags.
struct Counts {
  int all_gathers = 0, exchanges = 0;
};
Counts CountsOf(const testing_util::RecordingTransport& t, const testing_util::Faults& f) {
  return {t.all_gathers() + f.subgroup_all_gathers,
          static_cast<int>(t.exchanges().size()) + f.subgroup_exchanges};
}

// Two steps of one route, 3 layers of q, k, v and a reverse route over a
// counting transport: the collectives each exchange makes, as rank 0 prints
// them (the bag's ranks count their subgroup's too).
void CountCollectives(C10dTransport* transport, const std::vector<int64_t>& lengths, int rank) {
  auto faults = std::make_shared<testing_util::Faults>();
  testing_util::RecordingTransport counting(transport, faults);
  SequenceBalancerOptions options;
  options.job_id = "route-bench-count";
  options.topology = kTopology;
  options.d_model = kDModel;
  auto balancer = SequenceBalancer::Create(options, &counting);
  if (!balancer.ok()) Fail(rank, absl::StrCat("balancer: ", balancer.status().ToString()));
  std::vector<std::string> lines;
  for (int step = 0; step < 2; ++step) {
    absl::Status planned = (*balancer)->PlanRouting(lengths);
    if (!planned.ok()) Fail(rank, absl::StrCat("plan: ", planned.ToString()));
    const Counts before = CountsOf(counting, *faults);
    const int64_t tokens = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    auto routed = (*balancer)->Route(at::randn({tokens, kDModel}));
    if (!routed.ok()) Fail(rank, routed.status().ToString());
    const at::Tensor q = routed->view({-1, kHeads, kHeadDim});
    for (int layer = 0; layer < 3; ++layer) {
      auto pre = (*balancer)->PreAttnTensors({q, q.clone(), q.clone()});
      if (!pre.ok()) Fail(rank, pre.status().ToString());
      auto post = (*balancer)->PostAttn((*pre)[0]);
      if (!post.ok()) Fail(rank, post.status().ToString());
    }
    auto back = (*balancer)->ReverseRoute(*routed);
    if (!back.ok()) Fail(rank, back.status().ToString());
    const Counts after = CountsOf(counting, *faults);
    lines.push_back(absl::StrFormat(
        "  step %d, rank %d: %d data exchanges, %d agreement all-gathers", step, rank,
        after.exchanges - before.exchanges, after.all_gathers - before.all_gathers));
  }
  // Rank 0 (a single-GPU bag: routes only) and rank 2 (in the bag) print.
  if (rank == 0 || rank == 2) {
    for (const std::string& line : lines) std::cout << line << "\n";
  }
}

int RunWorker(const BenchOptions& o) {
  at::set_num_threads(1);
  SetLogLevel(LogLevel::kWarning);
  auto world = JoinLocalWorld(std::chrono::seconds(o.timeout_seconds));
  if (!world.ok()) {
    std::cerr << "route_bench: " << world.status() << "\n";
    return 1;
  }
  const int rank = world->rank;
  c10d::ProcessGroup* group = world->group.get();
  C10dTransport* transport = world->transport.get();
  const bool in_bag = rank >= kBagRanks.front();

  // (b)/(f) as shipped, (c)/(g) agreeing before every exchange, (d) off.
  SequenceBalancer* balancers[3];
  std::vector<std::unique_ptr<SequenceBalancer>> owned;
  for (int mode = 0; mode < 3; ++mode) {
    SequenceBalancerOptions balancer_options;
    balancer_options.job_id = "route-bench";
    balancer_options.topology = kTopology;
    balancer_options.d_model = kDModel;
    balancer_options.gamma = 1.0;
    balancer_options.token_bytes = kRowBytes;
    balancer_options.agree_every_exchange = mode == 1;
    balancer_options.agree_on_errors = mode != 2;
    auto created = SequenceBalancer::Create(balancer_options, transport);
    if (!created.ok()) Fail(rank, absl::StrCat("balancer: ", created.status().ToString()));
    owned.push_back(*std::move(created));
    balancers[mode] = owned.back().get();
  }
  // The bag's own group, for the bare Ulysses exchanges.
  std::unique_ptr<Transport> bag;
  if (in_bag) {
    auto made = transport->Subgroup(kBagRanks);
    if (!made.ok()) Fail(rank, absl::StrCat("bag: ", made.status().ToString()));
    bag = *std::move(made);
  }
  c10d::ProcessGroup* bag_group =
      in_bag ? static_cast<C10dTransport*>(bag.get())->group().get() : nullptr;

  std::vector<Row> rows;
  std::vector<int64_t> last_lengths;
  for (size_t payload_index = 0; payload_index < kPayloads.size(); ++payload_index) {
    const Payload& payload = kPayloads[payload_index];
    const int64_t tokens = payload.bytes / kRowBytes;
    const int k = payload.iterations;
    const std::vector<int64_t> lengths =
        MakeLengths(tokens, o.seed * 1000003 + payload_index * 1009 + rank);
    last_lengths = lengths;

    // Planning is not measured: once per payload.
    for (SequenceBalancer* balancer : balancers) {
      absl::Status planned = balancer->PlanRouting(lengths);
      if (!planned.ok()) Fail(rank, absl::StrCat("plan: ", planned.ToString()));
    }
    const StepPlan& plan = balancers[0]->step_plan();
    const std::vector<int64_t> send_splits = RowSplits(plan.plan.route.sends);
    const std::vector<int64_t> recv_splits = RowSplits(plan.plan.route.recvs);
    int64_t routed_rows = 0;
    for (int64_t r : recv_splits) routed_rows += r;

    at::manual_seed(o.seed * 7919 + payload_index * 131 + rank);
    const at::Tensor x = at::randn({tokens, kDModel});

    // Correctness, once per payload: the round trips are exact, and the
    // first exchange of each call (the agreed one) is out of the way.
    bool bad = false;
    std::string why;
    at::Tensor q;
    for (SequenceBalancer* balancer : balancers) {
      auto routed = balancer->Route(x);
      if (!routed.ok()) Fail(rank, absl::StrCat("route: ", routed.status().ToString()));
      q = routed->view({routed_rows, kHeads, kHeadDim});
      auto pre = balancer->PreAttnTensors({q, q.clone(), q.clone()});
      if (!pre.ok()) Fail(rank, absl::StrCat("pre_attn: ", pre.status().ToString()));
      auto post = balancer->PostAttn((*pre)[0]);
      if (!post.ok()) Fail(rank, absl::StrCat("post_attn: ", post.status().ToString()));
      auto back = balancer->ReverseRoute(*routed);
      if (!back.ok()) Fail(rank, absl::StrCat("reverse route: ", back.status().ToString()));
      if (!at::equal(*back, x)) {
        bad = true;
        why = "ReverseRoute(Route(x)) is not x bit for bit";
      }
      if (!at::equal(*post, q)) {
        bad = true;
        why = "PostAttn(PreAttn(q)) is not q bit for bit";
      }
    }
    if (AnyRank(*group, bad)) {
      Fail(rank, bad ? why + " on this rank" : "a round trip is not exact on another rank");
    }
    const at::Tensor k_in = q.clone(), v_in = q.clone();
    at::Tensor attention_out;  // PreAttn's shape, for PostAttn
    {
      auto pre = balancers[0]->PreAttn(q);
      if (!pre.ok()) Fail(rank, pre.status().ToString());
      attention_out = pre->clone();
    }

    // Preallocated buffers of the bare collectives.
    at::Tensor a_send = x.clone();
    at::Tensor a_mid = at::empty({routed_rows, kDModel});
    at::Tensor a_back = at::empty({tokens, kDModel});
    // The bag: every routed row goes to both positions with half the heads;
    // each position's routed rows come back from it (their counts: one
    // all-gather, not timed).
    std::vector<int64_t> bag_send, bag_recv;
    at::Tensor qkv_send, qkv_recv, o_send, o_recv;
    at::Tensor attention_source, attention_inverse, h_send, h_recv, h_o_send, h_merged;
    std::vector<at::Tensor> h_out;
    if (in_bag) {
      auto counts = bag->AllGatherBytes(std::to_string(routed_rows));
      if (!counts.ok()) Fail(rank, counts.status().ToString());
      for (const std::string& c : *counts) {
        bag_send.push_back(routed_rows);
        bag_recv.push_back(std::stoll(c));
      }
      const int64_t heads_here = kHeads / static_cast<int64_t>(kBagRanks.size());
      const int64_t sent = routed_rows * static_cast<int64_t>(kBagRanks.size());
      const int64_t received = bag_recv[0] + bag_recv[1];
      qkv_send = at::randn({sent, 3 * heads_here * kHeadDim});
      qkv_recv = at::empty({received, 3 * heads_here * kHeadDim});
      o_send = at::randn({received, heads_here * kHeadDim});
      o_recv = at::empty({sent, heads_here * kHeadDim});
      // (h): the row of the receive buffer (sender-major) that each row of
      // PreAttn's attention order comes from, found by sending each row's
      // bag position and index through PreAttn once (with the balancer
      // that does not agree, so that the timed ones' books are untouched).
      const int64_t position = rank - kBagRanks.front();
      const at::Tensor tag = (at::arange(routed_rows, at::kDouble) + position * 1e9)
                                 .view({routed_rows, 1, 1})
                                 .expand({routed_rows, 2, 1})
                                 .contiguous();
      auto tagged = balancers[2]->PreAttn(tag);
      if (!tagged.ok()) Fail(rank, tagged.status().ToString());
      const at::Tensor v = tagged->view({-1});
      const at::Tensor sender = at::floor(v / 1e9);
      const at::Tensor offset = at::where(sender > 0, static_cast<double>(bag_recv[0]), 0.0);
      attention_source = (offset + v - sender * 1e9).to(at::kLong);
      attention_inverse = at::empty_like(attention_source);
      attention_inverse.index_put_({attention_source}, at::arange(received, at::kLong));
      h_send = at::empty({sent, 3 * heads_here * kHeadDim});
      h_recv = at::empty({received, 3 * heads_here * kHeadDim});
      for (int i = 0; i < 3; ++i) h_out.push_back(at::empty({received, heads_here * kHeadDim}));
      h_o_send = at::empty({received, heads_here * kHeadDim});
      h_merged = at::empty({routed_rows, kHeads * kHeadDim});
    }
    auto route_and_back = [&](const SequenceBalancer& b) {
      auto routed = b.Route(x);
      if (!routed.ok()) Fail(rank, absl::StrCat("route: ", routed.status().ToString()));
      auto back = b.ReverseRoute(*routed);
      if (!back.ok()) Fail(rank, absl::StrCat("reverse route: ", back.status().ToString()));
    };
    auto layer = [&](const SequenceBalancer& b) {
      auto pre = b.PreAttnTensors({q, k_in, v_in});
      if (!pre.ok()) Fail(rank, absl::StrCat("pre_attn: ", pre.status().ToString()));
      auto post = b.PostAttn(attention_out);
      if (!post.ok()) Fail(rank, absl::StrCat("post_attn: ", post.status().ToString()));
    };
    auto run = [&](int variant) {
      switch (variant) {
        case 0: {  // alltoall_base moves out of its split vectors: pass copies
          std::vector<int64_t> out = recv_splits, in = send_splits;
          group->alltoall_base(a_mid, a_send, out, in)->wait();
          std::vector<int64_t> out2 = send_splits, in2 = recv_splits;
          group->alltoall_base(a_back, a_mid, out2, in2)->wait();
          break;
        }
        case 1:
        case 2:
        case 3:
          route_and_back(*balancers[variant - 1]);
          break;
        case 4:
          if (in_bag) {
            std::vector<int64_t> out = bag_recv, in = bag_send;
            bag_group->alltoall_base(qkv_recv, qkv_send, out, in)->wait();
            std::vector<int64_t> out2 = bag_send, in2 = bag_recv;
            bag_group->alltoall_base(o_recv, o_send, out2, in2)->wait();
          }
          break;
        case 5:
          layer(*balancers[0]);
          break;
        case 6:
          layer(*balancers[1]);
          break;
        case 7:
          if (in_bag) {
            const int64_t slice = kHeads / 2 * kHeadDim;  // one position's heads of a row
            const at::Tensor send = h_send.view({2, routed_rows, 3, slice});
            const at::Tensor inputs[] = {q, k_in, v_in};
            for (int i = 0; i < 3; ++i) {
              send.select(2, i).copy_(inputs[i].view({routed_rows, 2, slice}).transpose(0, 1));
            }
            std::vector<int64_t> out = bag_recv, in = bag_send;
            bag_group->alltoall_base(h_recv, h_send, out, in)->wait();
            const at::Tensor received = h_recv.view({-1, 3, slice});
            for (int i = 0; i < 3; ++i) {
              at::index_select_out(h_out[i], received.select(1, i), 0, attention_source);
            }
            at::index_select_out(h_o_send, attention_out.view({-1, slice}), 0, attention_inverse);
            std::vector<int64_t> out2 = bag_send, in2 = bag_recv;
            bag_group->alltoall_base(o_recv, h_o_send, out2, in2)->wait();
            h_merged.view({routed_rows, 2, slice})
                .transpose(0, 1)
                .copy_(o_recv.view({2, routed_rows, slice}));
          }
          break;
      }
    };

    // (h) computes what (f) does: checked once.
    run(7);
    if (in_bag) {
      auto pre = balancers[0]->PreAttnTensors({q, k_in, v_in});
      auto post = balancers[0]->PostAttn(attention_out);
      if (!pre.ok() || !post.ok()) Fail(rank, "the layer failed");
      bool same = at::equal(post->view({routed_rows, -1}), h_merged);
      for (int i = 0; i < 3; ++i) {
        same = same && at::equal((*pre)[i].view({-1, h_out[i].size(1)}), h_out[i]);
      }
      if (!same) Fail(rank, "(h), the hand-written layer, differs from PreAttn/PostAttn");
    }

    // seconds[variant * k + iteration]; the variants interleave within each
    // iteration so that drift (other load, frequency) hits them alike.
    at::Tensor seconds = at::zeros({kVariants * k}, at::kDouble);
    double* s = seconds.data_ptr<double>();
    for (int it = -kWarmup; it < k; ++it) {
      for (int v = 0; v < kVariants; ++v) {
        group->barrier()->wait();
        const auto start = std::chrono::steady_clock::now();
        run(v);
        const auto end = std::chrono::steady_clock::now();
        if (it >= 0) s[v * k + it] = std::chrono::duration<double>(end - start).count();
      }
    }

    // All ranks' times, and their off-rank route rows.
    int64_t off_rank_rows = 0;
    for (int p = 0; p < kProcs; ++p) {
      if (p != rank) off_rank_rows += send_splits[p];
    }
    at::Tensor mine = at::cat({seconds, at::full({2}, 0.0, at::kDouble)});
    mine[kVariants * k] = static_cast<double>(off_rank_rows);
    mine[kVariants * k + 1] = static_cast<double>(lengths.size());
    std::vector<std::vector<at::Tensor>> all(1);
    for (int p = 0; p < kProcs; ++p) all[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> input = {mine};
    group->allgather(all, input)->wait();
    if (rank != 0) continue;

    Row row;
    row.bytes = payload.bytes;
    row.tokens = tokens;
    row.iterations = k;
    row.moved_fraction = plan.total_tokens > 0 ? static_cast<double>(plan.moved_tokens) /
                                                     static_cast<double>(plan.total_tokens)
                                               : 0;
    row.max_before = plan.max_over_mean_before;
    row.max_after = plan.max_over_mean_after;
    for (int p = 0; p < kProcs; ++p) {
      const double* q = all[0][p].data_ptr<double>();
      row.max_off_rank_mb =
          std::max(row.max_off_rank_mb, q[kVariants * k] * kRowBytes / (1 << 20));
      row.pieces.push_back(static_cast<int>(q[kVariants * k + 1]));
    }
    for (int v = 0; v < kVariants; ++v) {
      std::vector<double> slowest(k, 0), own(k, 0);
      for (int it = 0; it < k; ++it) {
        own[it] = s[v * k + it];
        for (int p = 0; p < kProcs; ++p) {
          slowest[it] = std::max(slowest[it], all[0][p].data_ptr<double>()[v * k + it]);
        }
      }
      row.slowest_median[v] = Median(slowest);
      row.slowest_p90[v] = Percentile(slowest, 0.9);
      row.rank0_median[v] = Median(own);
      row.rank0_p90[v] = Percentile(own, 0.9);
    }
    rows.push_back(row);
  }

  if (rank == 0) {
    std::cout << "route_bench: SequenceBalancer exchanges vs. bare c10d alltoall_base moving the "
                 "same rows\n"
              << kProcs << " Gloo processes over TCPStore on 127.0.0.1, sharing this machine's "
              << std::thread::hardware_concurrency() << " cores (one intra-op thread each); "
              << "CPU tensors, float32 rows of " << kDModel << " (" << kRowBytes / 1024
              << " KB/token); q, k, v: [rows, " << kHeads << ", " << kHeadDim << "]\n"
              << "topology " << kTopology << " (ranks 2, 3: the 2-GPU bag), d_model " << kDModel
              << ", gamma 1, local planning (one plan per payload, not timed); each rank packs "
                 "1-8 random-length sequences (seed "
              << o.seed << ")\n"
              << "time = steady_clock wall time of one variant on one rank, each variant after "
                 "a barrier; variants interleaved per iteration; "
              << kWarmup << " warm-up iterations\n"
              << "  (a) 2x alltoall_base with the plan's per-peer row splits (route + reverse), "
                 "preallocated buffers: the minimum\n"
              << "  (b) Route + ReverseRoute as shipped (each call agreed at its first exchange; "
                 "these later ones carry a status byte per rank with their rows)\n"
              << "  (c) (b) with agree_on_errors=\"every_exchange\" (a verdict all-gather before "
                 "each exchange)\n"
              << "  (d) (b) with agree_on_errors off\n"
              << "  (e) a layer's bare Ulysses exchanges in the bag: 1 alltoall_base of q, k, v "
                 "side by side + 1 of the attention output, preallocated\n"
              << "  (f) PreAttnTensors({q, k, v}) + PostAttn(o) as shipped\n"
              << "  (g) (f) with agree_on_errors=\"every_exchange\"\n"
              << "  (h) (f) written by hand: q, k, v's heads per position copied into one send "
                 "buffer, 1 alltoall_base, index_select into attention order; the output "
                 "back the same way (what (e) leaves out and any implementation must do)\n"
              << "moved frac = tokens leaving their rank / all tokens (the plan's); off-rank MB = "
                 "largest route volume one rank sends to others\n"
              << "ReverseRoute(Route(x)) == x and PostAttn(PreAttn(q)) == q bit for bit: checked "
                 "on every rank, every payload, every variant\n";
    for (const Row& r : rows) {
      std::cout << absl::StrFormat(
          "  %s/rank = %d tokens/rank, sequences per rank %s, %d iterations; planned max/mean "
          "workload %.3f -> %.3f\n",
          Mb(r.bytes), r.tokens, absl::StrJoin(r.pieces, ","), r.iterations, r.max_before,
          r.max_after);
    }
    std::cout << "\nHeadline: per iteration the slowest of the " << kProcs
              << " ranks, then median / p90 (nearest rank) over iterations, ms\n";
    PrintTable(rows, /*slowest=*/true);
    std::cout << "\nRank 0 alone (outside the bag: its layer moves nothing): median / p90 over "
                 "iterations, ms\n";
    PrintTable(rows, /*slowest=*/false);
    std::cout << "\nratios = median / median; a figure, not a test: nothing about time is "
                 "asserted\n"
              << "\nCollectives per step of a route, 3 layers (pre_attn of q, k, v + post_attn) "
                 "and a reverse route, as shipped (a counting transport; PlanRouting's own "
                 "not included):\n";
  }
  std::cout.flush();
  group->barrier()->wait();
  CountCollectives(transport, last_lengths, rank);
  return 0;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "help" || args[0] == "--help")) {
    std::cout << knapformer::kUsage;
    return 0;
  }
  auto options = knapformer::ParseOptions(args);
  if (!options.ok()) {
    std::cerr << "route_bench: " << options.status().message() << "\n" << knapformer::kUsage;
    return 2;
  }
  return knapformer::RunAsLocalWorld("route_bench", knapformer::kProcs, args,
                                     absl::Seconds(options->timeout_seconds),
                                     [&] { return knapformer::RunWorker(*options); });
}
