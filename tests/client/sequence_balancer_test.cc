// SequenceBalancer on a real engine: 4 and 8 processes on TCPStore + Gloo.
// Each world runs steps with ordinary, awkward (a rank with no sequences,
// zero-length sequences) and sparse (fewer sequences than GPUs) lengths and
// checks that route -> reverse_route is bit-exact in float, int64 and bf16,
// that every routed chunk holds exactly the tokens the plan names, and that
// multi-head attention through route / pre_attn / attention / post_attn /
// reverse_route equals per-sequence attention without balancing, forward
// and gradients (inputs and all-reduced weights); under topology "auto" the
// same with a layout that changes from step to step.
#include "client/sequence_balancer.h"

#include <cmath>
#include <random>
#include <set>
#include <string>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/varlen_attention.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/planner_server.h"
#include "tests/testing/gloo_world.h"

namespace knapformer {
namespace {

using testing_util::RegisterScenario;
using testing_util::RunWorkers;
using testing_util::Worker;
using testing_util::WorkerRun;

constexpr int kModel = 8;
constexpr int kHeads = 8;  // a multiple of every bag size below
constexpr int kHeadDim = 2;

// This rank's lengths at `step`: 0 ordinary, 1 awkward, 2 sparse.
std::vector<int64_t> Lengths(int rank, int size, uint64_t step) {
  std::mt19937_64 random(rank * 1000 + step);
  std::vector<int64_t> lengths;
  switch (step % 3) {
    case 0:
      for (int i = 0, n = 1 + random() % 4; i < n; ++i) lengths.push_back(1 + random() % 48);
      if (rank == 0) lengths.push_back(150);  // one long sequence to split across a bag
      break;
    case 1:
      if (rank == 1) break;  // no sequences at all
      lengths = {0, static_cast<int64_t>(1 + random() % 30), 0};
      if (rank == size - 1) lengths.push_back(3);  // shorter than a 4- or 8-GPU bag
      break;
    case 2:
      if (rank == 0) lengths = {5, 77};  // two sequences for the whole world
      break;
  }
  return lengths;
}

int64_t Total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

SequenceBalancerOptions Options(const Worker& w) {
  SequenceBalancerOptions options;
  options.job_id = "balancer-test";
  options.topology = w.args.at("topology");
  options.d_model = 512;
  options.gamma = 1.0;
  if (w.args.count("planner")) {
    options.planner.address = w.args.at("planner");
    options.planner.call_deadline = absl::Seconds(30);
  }
  if (w.args.count("mode")) options.planner.mode = ParsePlannerMode(w.args.at("mode")).value();
  return options;
}

// Token ids: (rank, sequence, offset), one row each.
at::Tensor TokenIds(int rank, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> ids;
  for (size_t s = 0; s < lengths.size(); ++s) {
    for (int64_t t = 0; t < lengths[s]; ++t) ids.push_back((int64_t{rank} << 40) | (s << 20) | t);
  }
  return torch::tensor(ids, torch::kLong).reshape({-1, 1});
}

// Route moves exactly the tokens the plan names, and the reverse route puts
// every tensor back bit for bit, gradients included.
void CheckRoundTrip(Worker& w, const SequenceBalancer& balancer,
                    const std::vector<int64_t>& lengths) {
  const int64_t rows = Total(lengths);
  at::Tensor ids = TokenIds(w.rank, lengths);
  auto routed_ids = balancer.Route(ids);
  ASSERT_TRUE(routed_ids.ok()) << routed_ids.status();
  ASSERT_EQ(routed_ids->size(0), Total(balancer.routed_lengths()));
  int64_t row = 0;
  const auto& recvs = balancer.step_plan().plan.route.recvs;
  ASSERT_EQ(recvs.size(), balancer.routed_lengths().size());
  for (const Transfer& chunk : recvs) {
    for (int64_t t = 0; t < chunk.length; ++t, ++row) {
      const int64_t want = (int64_t{chunk.peer} << 40) | (int64_t{chunk.seq_index} << 20) |
                           (chunk.offset + t);
      ASSERT_EQ((*routed_ids)[row][0].item<int64_t>(), want) << "routed row " << row;
    }
  }
  auto back_ids = balancer.ReverseRoute(*routed_ids);
  ASSERT_TRUE(back_ids.ok()) << back_ids.status();
  EXPECT_TRUE(torch::equal(*back_ids, ids));

  at::Tensor features = torch::randn({rows, 3, 5});  // any trailing shape
  auto routed = balancer.Route(features);
  ASSERT_TRUE(routed.ok()) << routed.status();
  auto back = balancer.ReverseRoute(*routed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(torch::equal(*back, features));

  // bf16 (Gloo refuses it; the transport moves bytes), with a gradient that
  // must come back exactly: d/dx sum(reverse(route(x)) * c) = c.
  at::Tensor half = torch::randn({rows, 4}).to(torch::kBFloat16).requires_grad_(true);
  at::Tensor weight = torch::randn({rows, 4}).to(torch::kBFloat16);
  auto routed_half = balancer.Route(half);
  ASSERT_TRUE(routed_half.ok()) << routed_half.status();
  EXPECT_EQ(routed_half->scalar_type(), torch::kBFloat16);
  auto back_half = balancer.ReverseRoute(*routed_half);
  ASSERT_TRUE(back_half.ok()) << back_half.status();
  EXPECT_TRUE(torch::equal(back_half->detach(), half.detach()));
  (*back_half * weight).sum().backward();
  ASSERT_TRUE(half.grad().defined());
  EXPECT_TRUE(torch::equal(half.grad(), weight));

  // Several tensors of different dtypes and shapes in one exchange: each
  // comes back bit for bit with its own dtype, the one that requires grad
  // gets its gradient back exactly, the others get none.
  at::Tensor hidden = torch::randn({rows, 3}, torch::kDouble).requires_grad_(true);
  at::Tensor flags = torch::randint(0, 2, {rows}, torch::kLong).to(torch::kBool);
  at::Tensor hidden_weight = torch::randn({rows, 3}, torch::kDouble);
  auto routed_all = balancer.RouteTensors({hidden, ids, half.detach(), flags});
  ASSERT_TRUE(routed_all.ok()) << routed_all.status();
  ASSERT_EQ(routed_all->size(), 4u);
  EXPECT_TRUE(torch::equal((*routed_all)[1], *routed_ids));
  EXPECT_EQ((*routed_all)[2].scalar_type(), torch::kBFloat16);
  EXPECT_EQ((*routed_all)[3].scalar_type(), torch::kBool);
  EXPECT_EQ((*routed_all)[3].dim(), 1);
  EXPECT_TRUE((*routed_all)[0].requires_grad());
  EXPECT_FALSE((*routed_all)[2].requires_grad());
  EXPECT_EQ(balancer.routed_token_bytes(), 3 * 8 + 8 + 4 * 2 + 1);
  auto back_all = balancer.ReverseRouteTensors(*routed_all);
  ASSERT_TRUE(back_all.ok()) << back_all.status();
  EXPECT_TRUE(torch::equal((*back_all)[0].detach(), hidden.detach()));
  EXPECT_TRUE(torch::equal((*back_all)[1], ids));
  EXPECT_TRUE(torch::equal((*back_all)[2], half.detach()));
  EXPECT_TRUE(torch::equal((*back_all)[3], flags));
  ((*back_all)[0] * hidden_weight).sum().backward();
  ASSERT_TRUE(hidden.grad().defined());
  EXPECT_TRUE(torch::equal(hidden.grad(), hidden_weight));
}

struct AttentionResult {
  at::Tensor out, x_grad, w_qkv_grad, w_out_grad;
};

// One attention layer; `balancer` null = every rank on its own sequences.
AttentionResult Attention(Worker& w, const SequenceBalancer* balancer,
                          const std::vector<int64_t>& lengths, uint64_t seed) {
  torch::manual_seed(seed);  // the same weights on every rank
  at::Tensor w_qkv = torch::randn({kModel, 3 * kHeads * kHeadDim}, torch::kDouble);
  at::Tensor w_out = torch::randn({kHeads * kHeadDim, kModel}, torch::kDouble);
  torch::manual_seed(seed * 100 + w.rank + 1);  // this rank's tokens
  at::Tensor x = torch::randn({Total(lengths), kModel}, torch::kDouble);
  at::Tensor upstream = torch::randn({Total(lengths), kModel}, torch::kDouble);
  w_qkv.requires_grad_(true);
  w_out.requires_grad_(true);
  x.requires_grad_(true);

  at::Tensor h = x;
  if (balancer != nullptr) h = balancer->Route(x).value();
  std::vector<at::Tensor> qkv = torch::matmul(h, w_qkv).reshape({-1, 3, kHeads, kHeadDim}).unbind(1);
  std::vector<int64_t> attention_lengths = lengths;
  if (balancer != nullptr) {
    // q, k and v in one exchange (PreAttnTensors) or one each (PreAttn).
    if (seed % 2 == 0) {
      qkv = balancer->PreAttnTensors(qkv).value();
    } else {
      for (at::Tensor& t : qkv) t = balancer->PreAttn(t).value();
    }
    attention_lengths = balancer->attention_lengths();
  }
  at::Tensor o = VarlenAttention(qkv[0], qkv[1], qkv[2], attention_lengths);
  if (balancer != nullptr) o = balancer->PostAttn(o).value();
  at::Tensor out = torch::matmul(o.reshape({-1, kHeads * kHeadDim}), w_out);
  if (balancer != nullptr) out = balancer->ReverseRoute(out).value();
  (out * upstream).sum().backward();

  // Weight gradients are per rank partial sums: compare their world sums.
  at::Tensor grads[2] = {w_qkv.grad().clone(), w_out.grad().clone()};
  for (at::Tensor& grad : grads) {  // Gloo reduces one tensor per call
    std::vector<at::Tensor> one = {grad};
    w.group->allreduce(one)->wait();
  }
  return {out.detach(), x.grad(), grads[0], grads[1]};
}

void ExpectClose(const at::Tensor& got, const at::Tensor& want, const char* what, int rank) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what << " on rank " << rank;
  EXPECT_TRUE(torch::allclose(got, want, 1e-10, 1e-12))
      << what << " on rank " << rank << ": max difference "
      << (got - want).abs().max().item<double>();
}

void CheckAttention(Worker& w, const SequenceBalancer& balancer,
                    const std::vector<int64_t>& lengths, uint64_t step) {
  AttentionResult balanced = Attention(w, &balancer, lengths, step + 7);
  AttentionResult reference = Attention(w, nullptr, lengths, step + 7);
  ExpectClose(balanced.out, reference.out, "attention output", w.rank);
  ExpectClose(balanced.x_grad, reference.x_grad, "input gradient", w.rank);
  ExpectClose(balanced.w_qkv_grad, reference.w_qkv_grad, "qkv weight gradient", w.rank);
  ExpectClose(balanced.w_out_grad, reference.w_out_grad, "output weight gradient", w.rank);
}

// Steps of every kind of lengths; with a "planner" address, rank 0 asks the
// parent to stop the service after `stop_after` steps.
const bool kBalance = RegisterScenario("balance", [](Worker& w) {
  auto balancer = SequenceBalancer::Create(Options(w), w.transport.get());
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  int steps = 3, stop_after = -1;
  if (w.args.count("steps")) {
    ASSERT_TRUE(absl::SimpleAtoi(w.args.at("steps"), &steps));
  }
  if (w.args.count("stop_after")) {
    ASSERT_TRUE(absl::SimpleAtoi(w.args.at("stop_after"), &stop_after));
  }
  for (int step = 0; step < steps; ++step) {
    if (step == stop_after) {
      if (w.rank == 0) w.store->set("stop_planner", std::vector<uint8_t>{1});
      w.store->wait({"planner_stopped"});
    }
    const std::vector<int64_t> lengths = Lengths(w.rank, w.size, step);
    absl::Status planned = (*balancer)->PlanRouting(lengths);
    ASSERT_TRUE(planned.ok()) << planned;
    EXPECT_EQ((*balancer)->step(), static_cast<uint64_t>(step));
    if (w.args.count("planner")) {
      const PlanSource want =
          stop_after < 0 || step < stop_after ? PlanSource::kService : PlanSource::kLocal;
      EXPECT_EQ((*balancer)->step_plan().source, want) << "step " << step;
    }
    CheckRoundTrip(w, **balancer, lengths);
    CheckAttention(w, **balancer, lengths, step);
  }
});

// Planning ahead: a balancer that prefetches each step while the previous
// one computes gets the plans of one that plans each step when it comes,
// routes and attends exactly, and a step called with other lengths than
// it prefetched fails on every rank, naming the rank and the step.
const bool kPlanAhead = RegisterScenario("plan_ahead", [](Worker& w) {
  SequenceBalancerOptions options = Options(w);
  auto synchronous = SequenceBalancer::Create(options, w.transport.get());
  ASSERT_TRUE(synchronous.ok()) << synchronous.status();
  options.job_id = "balancer-test-ahead";
  auto ahead = SequenceBalancer::Create(options, w.transport.get());
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  const PlanSource source = w.args.count("planner") ? PlanSource::kService : PlanSource::kLocal;
  constexpr int kSteps = 4;
  ASSERT_TRUE((*ahead)->PrefetchRouting(Lengths(w.rank, w.size, 0)).ok());
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<int64_t> lengths = Lengths(w.rank, w.size, step);
    ASSERT_TRUE((*synchronous)->PlanRouting(lengths).ok());
    absl::Status planned = (*ahead)->PlanRouting(lengths);
    ASSERT_TRUE(planned.ok()) << planned;
    // The next step's lengths are known while this one computes.
    ASSERT_TRUE((*ahead)->PrefetchRouting(Lengths(w.rank, w.size, step + 1)).ok());
    const StepPlan& got = (*ahead)->step_plan();
    const StepPlan& want = (*synchronous)->step_plan();
    EXPECT_TRUE(got.prefetched);
    EXPECT_FALSE(want.prefetched);
    EXPECT_EQ(got.source, source);
    EXPECT_EQ(want.source, source);
    EXPECT_EQ((*ahead)->routed_lengths(), (*synchronous)->routed_lengths()) << "step " << step;
    EXPECT_EQ((*ahead)->attention_lengths(), (*synchronous)->attention_lengths());
    EXPECT_EQ(got.workload_after, want.workload_after);
    EXPECT_EQ(got.moved_tokens, want.moved_tokens);
    CheckRoundTrip(w, **ahead, lengths);
    CheckAttention(w, **ahead, lengths, step);
  }
  // Step kSteps was prefetched with Lengths(kSteps); rank 1 now has another
  // sequence.
  std::vector<int64_t> changed = Lengths(w.rank, w.size, kSteps);
  if (w.rank == 1) changed.push_back(9);
  absl::Status refused = (*ahead)->PlanRouting(changed);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()),
              testing::HasSubstr(absl::StrCat("rank 1: step ", kSteps,
                                              ": its lengths differ from those prefetched")));
});

// Misuse is an error naming the problem, not a crash or a wrong answer.
const bool kErrors = RegisterScenario("errors", [](Worker& w) {
  auto balancer = SequenceBalancer::Create(Options(w), w.transport.get());
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  at::Tensor x = torch::zeros({4, kModel});
  EXPECT_EQ((*balancer)->Route(x).status().code(), absl::StatusCode::kFailedPrecondition);

  const std::vector<int64_t> lengths = {3, 5};
  ASSERT_TRUE((*balancer)->PlanRouting(lengths).ok());
  auto wrong_rows = (*balancer)->Route(torch::zeros({7, kModel}));
  EXPECT_EQ(wrong_rows.status().code(), absl::StatusCode::kInvalidArgument);
  // Every rank passed 7 rows: all return rank 0's reason, the first.
  EXPECT_THAT(std::string(wrong_rows.status().message()),
              testing::HasSubstr("rank 0: route: 7 rows, rank 0 expects 8"));
  auto routed = (*balancer)->Route(torch::ones({8, 6}));
  ASSERT_TRUE(routed.ok());
  // 6 heads do not split over a bag of 4: the same error on every rank.
  auto heads = (*balancer)->PreAttn(routed->reshape({-1, 6, 1}));
  EXPECT_EQ(heads.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(heads.status().message()),
              testing::HasSubstr("6 heads (dimension 1) do not split over the bags of g4n1; "
                                 "heads must be a multiple of 4"));
  // A refused input is the same error on every rank, naming the rank.
  std::vector<int64_t> bad = {3};
  if (w.rank == 2) bad = {-1};
  absl::Status refused = (*balancer)->PlanRouting(bad);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.message()), testing::HasSubstr("ranks[2][0]: sequence length -1"));
});

// This rank's lengths at `step` of the auto scenario: the data changes
// kind every step, and so does the layout the planner chooses for it.
std::vector<int64_t> AutoLengths(int rank, uint64_t step) {
  std::mt19937_64 random(rank * 7919 + step);
  switch (step % 4) {
    case 0:  // even: single-GPU bags, no Ulysses traffic
      return {64, 64};
    case 1:  // one sequence outweighs everything else
      if (rank == 5) return {2400, 16};
      return {static_cast<int64_t>(8 + random() % 24)};
    case 2:  // two long ones in different nodes, an empty rank, zero lengths
      if (rank == 1) return {};
      if (rank == 2 || rank == 6) return {0, 1200, 3};
      return {0, static_cast<int64_t>(1 + random() % 40)};
    default:  // ragged
      return {static_cast<int64_t>(1 + random() % 200), static_cast<int64_t>(1 + random() % 9)};
  }
}

// topology "auto" on 2 nodes of 4: every step the layout may change; the
// balancer uses the bags each plan names (prepared once in Create), routes
// and attends exactly, and sees more than one layout over the steps.
const bool kAutoLayout = RegisterScenario("auto_layout", [](Worker& w) {
  SequenceBalancerOptions options = Options(w);
  options.machine.gpus_per_node = 4;
  auto balancer = SequenceBalancer::Create(options, w.transport.get());
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  EXPECT_EQ((*balancer)->heads_multiple(), 4);
  EXPECT_EQ((*balancer)->spec().topology(), "auto:max_bag=4");
  const PlanSource source = w.args.count("planner") ? PlanSource::kService : PlanSource::kLocal;
  uint64_t steps = 8;  // two rounds of AutoLengths' four kinds of step
  if (w.args.count("steps")) {
    ASSERT_TRUE(absl::SimpleAtoi(w.args.at("steps"), &steps));
  }
  std::set<std::string> layouts;
  std::set<int> bag_sizes;
  for (uint64_t step = 0; step < steps; ++step) {
    const std::vector<int64_t> lengths = AutoLengths(w.rank, step);
    absl::Status planned = (*balancer)->PlanRouting(lengths);
    ASSERT_TRUE(planned.ok()) << planned;
    const StepPlan& plan = (*balancer)->step_plan();
    EXPECT_EQ(plan.source, source);
    EXPECT_GT(plan.predicted_step_seconds, 0);
    layouts.insert(plan.layout);
    const int gpus = (*balancer)->bag_gpus();
    bag_sizes.insert(gpus);
    // An aligned block within this rank's node.
    EXPECT_EQ((*balancer)->bag_first_rank() % gpus, 0);
    EXPECT_EQ((*balancer)->bag_first_rank() / 4, w.rank / 4);
    EXPECT_EQ(plan.plan.ulysses.gpus, gpus);
    if (step % 4 == 0) {
      EXPECT_EQ(plan.layout, "g1n8") << "step " << step;
    }
    if (step % 4 == 1) {
      EXPECT_NE(plan.layout, "g1n8") << "step " << step;
    }
    CheckRoundTrip(w, **balancer, lengths);
    CheckAttention(w, **balancer, lengths, step);
  }
  EXPECT_GE(layouts.size(), 2u);
  if (w.rank == 5) {
    EXPECT_GE(bag_sizes.size(), 2u);  // its bag grew for its long sequence
  }
});

// BackwardOf (what the torch.compile ops' backward runs) gives exactly the
// gradients the eager autograd nodes give, for every call, bf16 and float.
const bool kBackwardOf = RegisterScenario("backward_of", [](Worker& w) {
  auto balancer = SequenceBalancer::Create(Options(w), w.transport.get());
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  SequenceBalancer& b = **balancer;
  using Call = SequenceBalancer::Call;
  for (uint64_t step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<int64_t> lengths = Lengths(w.rank, w.size, step);
    ASSERT_TRUE(b.PlanRouting(lengths).ok());
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      // Each call's eager gradient against BackwardOf of the same weights.
      auto expect_same = [&](Call call, const at::Tensor& input, auto&& forward) {
        at::Tensor x = input.detach().clone().requires_grad_(true);
        absl::StatusOr<at::Tensor> y = forward(x);
        ASSERT_TRUE(y.ok()) << y.status();
        at::manual_seed(7 * w.rank + static_cast<int>(call));
        at::Tensor weight = torch::randn(y->sizes()).to(dtype);
        (*y * weight).sum().backward();
        absl::StatusOr<std::vector<at::Tensor>> grad = b.BackwardOf(call, {weight});
        ASSERT_TRUE(grad.ok()) << grad.status();
        EXPECT_TRUE(torch::equal((*grad)[0], x.grad())) << "call " << static_cast<int>(call);
      };
      const int64_t rows = Total(lengths);
      at::Tensor x = torch::randn({rows, 8, 2}).to(dtype);
      expect_same(Call::kRoute, x, [&](const at::Tensor& t) { return b.Route(t); });
      auto routed = b.Route(x);
      ASSERT_TRUE(routed.ok()) << routed.status();
      expect_same(Call::kReverseRoute, *routed,
                  [&](const at::Tensor& t) { return b.ReverseRoute(t); });
      expect_same(Call::kPreAttn, *routed, [&](const at::Tensor& t) { return b.PreAttn(t); });
      auto attended = b.PreAttn(*routed);
      ASSERT_TRUE(attended.ok()) << attended.status();
      expect_same(Call::kPostAttn, *attended,
                  [&](const at::Tensor& t) { return b.PostAttn(t); });
    }
  }
});

TEST(SequenceBalancer, BackwardOfEveryCallIsTheEagerBackward) {
  WorkerRun run = RunWorkers("backward_of", 8, {{"topology", "g1n2+g2n1+g4n1"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

void ExpectBalanceRuns(const std::string& topology, int size) {
  WorkerRun run = RunWorkers("balance", size, {{"topology", topology}});
  EXPECT_TRUE(run.ok()) << run.output;
}

TEST(SequenceBalancer, FourSingleGpuBags) { ExpectBalanceRuns("g1n4", 4); }
TEST(SequenceBalancer, FourRanksInTwoBagsOfTwo) { ExpectBalanceRuns("g2n2", 4); }
TEST(SequenceBalancer, EightSingleGpuBags) { ExpectBalanceRuns("g1n8", 8); }
TEST(SequenceBalancer, OneBagOfEight) { ExpectBalanceRuns("g8n1", 8); }
TEST(SequenceBalancer, MixedBagsOfOneTwoAndFour) { ExpectBalanceRuns("g1n2+g2n1+g4n1", 8); }
TEST(SequenceBalancer, TwoReplicas) { ExpectBalanceRuns("g1n2+g2n1", 8); }

TEST(SequenceBalancer, AutoLayoutChangesFromStepToStepPlannedLocally) {
  WorkerRun run = RunWorkers("auto_layout", 8, {{"topology", "auto:max_bag=4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

TEST(SequenceBalancer, ErrorsNameTheProblem) {
  WorkerRun run = RunWorkers("errors", 4, {{"topology", "g4n1"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// A planner service on a free port of 127.0.0.1, without metrics.
absl::StatusOr<std::unique_ptr<PlannerServer>> StartPlanner() {
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "";
  return PlannerServer::Start(options);
}

TEST(SequenceBalancer, PlanningAheadLocallyGivesTheSamePlans) {
  WorkerRun run = RunWorkers("plan_ahead", 4, {{"topology", "g1n2+g2n1"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

TEST(SequenceBalancer, PlanningAheadWithTheServiceGivesTheSamePlansInEitherMode) {
  auto server = StartPlanner();
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* mode : {"group", "per-rank"}) {
    WorkerRun run = RunWorkers("plan_ahead", 4,
                               {{"topology", "g1n2+g2n1"},
                                {"mode", mode},
                                {"planner", absl::StrCat("127.0.0.1:", (*server)->port())}});
    EXPECT_TRUE(run.ok()) << mode << ": " << run.output;
  }
}

// 5 steps, not the local run's 8: one round of AutoLengths' four kinds of
// step and the return to single-GPU bags; what differs from the local run
// is where the plans come from, not what the balancer does with them.
TEST(SequenceBalancer, AutoLayoutFromTheServiceInEitherMode) {
  auto server = StartPlanner();
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* mode : {"group", "per-rank"}) {
    WorkerRun run = RunWorkers("auto_layout", 8,
                               {{"topology", "auto:max_bag=4"},
                                {"steps", "5"},
                                {"mode", mode},
                                {"planner", absl::StrCat("127.0.0.1:", (*server)->port())}});
    EXPECT_TRUE(run.ok()) << mode << ": " << run.output;
  }
}

// The planner service answers the first steps, then stops; every rank
// falls back to local planning at the same step and training goes on.
TEST(SequenceBalancer, PlannerGoesDownMidRun) {
  auto server = StartPlanner();
  ASSERT_TRUE(server.ok()) << server.status();
  WorkerRun run = RunWorkers(
      "balance", 4,
      {{"topology", "g1n2+g2n1"},
       {"planner", absl::StrCat("127.0.0.1:", (*server)->port())},
       {"steps", "5"},
       {"stop_after", "3"}},
      std::chrono::seconds(180), [&](c10d::Store& store) {
        store.wait({"stop_planner"});
        (*server)->Shutdown(absl::Seconds(1));
        store.set("planner_stopped", std::vector<uint8_t>{1});
      });
  EXPECT_TRUE(run.ok()) << run.output;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) { return knapformer::testing_util::TestMain(argc, argv); }
