// The SequenceBalancer's data movement against the bare collective: 4 CPU
// processes (TCPStore + Gloo on 127.0.0.1) time Route + ReverseRoute and, in
// the same run and interleaved with it, two bare c10d alltoall_base calls
// moving exactly the rows the plan moves (the minimum any route + reverse
// needs), and report the ratio.
//
// Figures only, nothing is asserted about time. Per payload P per rank
// (1 MB and 16 MB of float32 rows of 1024, i.e. 4 KB per token):
//   each rank packs a seeded mix of 1-8 sequences summing to P / 4 KB tokens;
//   one PlanRouting (topology g1n2+g2n1, d_model 1024, gamma 1, local
//   planning; not timed) gives the plan, whose moved-token fraction is shown;
//   ReverseRoute(Route(x)) must give x back bit for bit (else exit 1);
//   then K iterations (after 3 warm-up ones), each running four variants in
//   turn, every variant preceded by a barrier on the Gloo group:
//     (a) 2x alltoall_base with the plan's per-peer row splits (route, then
//         reverse) on preallocated contiguous [rows, 1024] float tensors
//     (b) SequenceBalancer Route + ReverseRoute (their counts were
//         cross-checked once, in PlanRouting; each agrees on every rank's
//         verdict first)
//     (c) that count check alone (Transport::CheckRowCounts of the route's
//         counts: once per step, whatever the number of tensors moved)
//     (d) context: 1x equal-split alltoall_base of the whole P bytes
//     (e) (b) on a balancer with agree_on_errors off (no verdict all-gather
//         before each exchange): what agreed errors cost
//   Each rank times each variant with std::chrono::steady_clock (wall time).
//   The headline is, per iteration, the slowest rank's time (all-gathered at
//   the end), then the median and p90 over iterations; rank 0's own times
//   are shown as well.
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
#include "planner/plan.h"
#include "planner/splitmix64.h"
#include "common/status_macros.h"
#include "transport/local_world.h"
#include "common/sample_stats.h"
#include "transport/c10d_transport.h"

namespace knapformer {
namespace {

constexpr char kUsage[] = "usage: route_bench [--seed 0] [--timeout-seconds 600]\n";


constexpr int kProcs = 4;
constexpr char kTopology[] = "g1n2+g2n1";
constexpr int64_t kDModel = 1024;
constexpr int64_t kRowBytes = kDModel * sizeof(float);
constexpr int kWarmup = 3;
constexpr int kVariants = 5;  // (a) (b) (c) (d) (e)

struct Payload {
  int64_t bytes;  // per rank
  int iterations;
};
const std::vector<Payload> kPayloads = {{int64_t{1} << 20, 30}, {int64_t{16} << 20, 10}};

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
      "%-8s %-6s %-10s | %-15s | %-15s | %-15s | %-7s %-9s | %-15s | %-15s %-7s\n", "payload",
      "moved", "off-rank", "(a) 2x a2a", "(b) route+rev", "(c) count check", "(b)/(a)",
      "(b+c)/(a)", "(d) 1x equal", "(e) no agreement", "(e)/(a)");
  std::cout << absl::StrFormat(
      "%-8s %-6s %-10s | %-7s %-7s | %-7s %-7s | %-7s %-7s | %-7s %-9s | %-7s %-7s | %-7s %-7s "
      "%-7s\n",
      "/rank", "frac", "MB (max)", "median", "p90", "median", "p90", "median", "p90", "median",
      "median", "median", "p90", "median", "p90", "median");
  for (const Row& r : rows) {
    const double* med = slowest ? r.slowest_median : r.rank0_median;
    const double* p90 = slowest ? r.slowest_p90 : r.rank0_p90;
    std::cout << absl::StrFormat(
        "%-8s %-6.3f %-10.3f | %-7.3f %-7.3f | %-7.3f %-7.3f | %-7.3f %-7.3f | %-7.2f %-9.2f | "
        "%-7.3f %-7.3f | %-7.3f %-7.3f %-7.2f\n",
        Mb(r.bytes), r.moved_fraction, r.max_off_rank_mb, med[0] * 1e3, p90[0] * 1e3,
        med[1] * 1e3, p90[1] * 1e3, med[2] * 1e3, p90[2] * 1e3, med[1] / med[0],
        (med[1] + med[2]) / med[0], med[3] * 1e3, p90[3] * 1e3, med[4] * 1e3, p90[4] * 1e3,
        med[4] / med[0]);
  }
}

std::vector<int64_t> RowSplits(const std::vector<Transfer>& transfers) {
  std::vector<int64_t> rows(kProcs, 0);
  for (const Transfer& t : transfers) rows[t.peer] += t.length;
  return rows;
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

  SequenceBalancerOptions balancer_options;
  balancer_options.job_id = "route-bench";
  balancer_options.topology = kTopology;
  balancer_options.d_model = kDModel;
  balancer_options.gamma = 1.0;
  balancer_options.token_bytes = kRowBytes;
  auto created = SequenceBalancer::Create(balancer_options, transport);
  if (!created.ok()) Fail(rank, absl::StrCat("balancer: ", created.status().ToString()));
  balancer_options.agree_on_errors = false;
  auto unagreed = SequenceBalancer::Create(balancer_options, transport);
  if (!unagreed.ok()) Fail(rank, absl::StrCat("balancer: ", unagreed.status().ToString()));
  SequenceBalancer* const balancers[2] = {created->get(), unagreed->get()};

  std::vector<Row> rows;
  for (size_t payload_index = 0; payload_index < kPayloads.size(); ++payload_index) {
    const Payload& payload = kPayloads[payload_index];
    const int64_t tokens = payload.bytes / kRowBytes;
    const int k = payload.iterations;
    const std::vector<int64_t> lengths =
        MakeLengths(tokens, o.seed * 1000003 + payload_index * 1009 + rank);

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

    // Correctness, once per payload.
    bool bad = false;
    std::string why;
    for (SequenceBalancer* balancer : balancers) {
      auto routed = balancer->Route(x);
      if (!routed.ok()) Fail(rank, absl::StrCat("route: ", routed.status().ToString()));
      auto back = balancer->ReverseRoute(*routed);
      if (!back.ok()) Fail(rank, absl::StrCat("reverse route: ", back.status().ToString()));
      if (!at::equal(*back, x)) {
        bad = true;
        why = "ReverseRoute(Route(x)) is not x bit for bit";
      }
    }
    if (AnyRank(*group, bad)) {
      Fail(rank, bad ? why + " on this rank" : "ReverseRoute(Route(x)) != x on another rank");
    }

    // Preallocated buffers of the bare collectives.
    at::Tensor a_send = x.clone();
    at::Tensor a_mid = at::empty({routed_rows, kDModel});
    at::Tensor a_back = at::empty({tokens, kDModel});
    at::Tensor d_out = at::empty({tokens, kDModel});
    auto route_and_back = [&](const SequenceBalancer& b) {
      auto routed = b.Route(x);
      if (!routed.ok()) Fail(rank, absl::StrCat("route: ", routed.status().ToString()));
      auto back = b.ReverseRoute(*routed);
      if (!back.ok()) Fail(rank, absl::StrCat("reverse route: ", back.status().ToString()));
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
        case 2: {
          absl::Status checked = transport->CheckRowCounts(send_splits, recv_splits);
          if (!checked.ok()) Fail(rank, absl::StrCat("count check: ", checked.ToString()));
          break;
        }
        case 1:
          route_and_back(*balancers[0]);
          break;
        case 4:
          route_and_back(*balancers[1]);
          break;
        case 3: {
          std::vector<int64_t> equal;  // empty = equal splits
          std::vector<int64_t> equal2;
          group->alltoall_base(d_out, a_send, equal, equal2)->wait();
          break;
        }
      }
    };

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
    std::cout << "route_bench: SequenceBalancer Route + ReverseRoute vs. bare c10d alltoall_base "
                 "moving the same rows\n"
              << kProcs << " Gloo processes over TCPStore on 127.0.0.1, sharing this machine's "
              << std::thread::hardware_concurrency() << " cores (one intra-op thread each); "
              << "CPU tensors, float32 rows of " << kDModel << " (" << kRowBytes / 1024
              << " KB/token)\n"
              << "topology " << kTopology << ", d_model " << kDModel
              << ", gamma 1, local planning (one plan per payload, not timed); each rank packs "
                 "1-8 random-length sequences (seed "
              << o.seed << ")\n"
              << "time = steady_clock wall time of one variant on one rank, each variant after "
                 "a barrier; variants interleaved per iteration; "
              << kWarmup << " warm-up iterations\n"
              << "  (a) 2x alltoall_base with the plan's per-peer row splits (route + reverse), "
                 "preallocated buffers: the minimum\n"
              << "  (b) Route + ReverseRoute (counts cross-checked once per step, in PlanRouting; "
                 "each exchange first agrees on every rank's verdict: one small all-gather)\n"
              << "  (c) that per-step count check alone (CheckRowCounts: a small all-to-all + "
                 "all-gather)\n"
              << "  (d) context: 1x equal-split alltoall_base of the whole payload (P/" << kProcs
              << " to each rank)\n"
              << "  (e) (b) with agree_on_errors off: no verdict all-gather per exchange\n"
              << "moved frac = tokens leaving their rank / all tokens (the plan's); off-rank MB = "
                 "largest route volume one rank sends to others\n"
              << "ReverseRoute(Route(x)) == x bit for bit: checked on every rank, every payload\n";
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
    std::cout << "\nRank 0 alone: median / p90 over iterations, ms\n";
    PrintTable(rows, /*slowest=*/false);
    std::cout << "\nratios = median / median; a figure, not a test: nothing about time is "
                 "asserted\n";
  }
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
