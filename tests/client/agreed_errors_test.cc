// Agreed errors and backward order of the SequenceBalancer on 4 Gloo
// processes: a mistake or fault on one rank (or one bag) is the same error
// on every rank of the collective's group, at once rather than at a
// timeout, and the next call works; a dead peer is an error on every
// survivor; backward exchanges run in the reverse of the forward order on
// every rank whatever each rank's graph looks like.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "client/sequence_balancer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/gloo_world.h"
#include "tests/testing/recording_transport.h"
#include "transport/local_transport.h"

namespace knapformer {
namespace {

using testing_util::Faults;
using testing_util::RecordingTransport;
using testing_util::RegisterScenario;
using testing_util::RunWorkers;
using testing_util::Worker;
using testing_util::WorkerRun;
using ::testing::HasSubstr;

// An agreed error arrives in two tiny collectives; a rank left waiting
// would wait for Gloo's 60 s timeout.
constexpr auto kAgreementBound = std::chrono::seconds(5);

struct Balanced {
  std::shared_ptr<Faults> faults = std::make_shared<Faults>();
  std::unique_ptr<RecordingTransport> transport;
  std::unique_ptr<SequenceBalancer> balancer;
};

Balanced Make(Worker& w, bool agree_on_errors = true, bool agree_every_exchange = false) {
  Balanced b;
  b.transport = std::make_unique<RecordingTransport>(w.transport.get(), b.faults);
  SequenceBalancerOptions options;
  options.job_id = "agreed-errors-test";
  options.topology = w.args.at("topology");
  options.d_model = 64;
  options.agree_on_errors = agree_on_errors;
  options.agree_every_exchange = agree_every_exchange;
  auto balancer = SequenceBalancer::Create(options, b.transport.get());
  EXPECT_TRUE(balancer.ok()) << balancer.status();
  if (balancer.ok()) b.balancer = *std::move(balancer);
  return b;
}

std::vector<int64_t> Lengths(int rank) { return {3 + rank, 9, 2 * rank + 1}; }
int64_t Rows(int rank) {
  const std::vector<int64_t> l = Lengths(rank);
  return std::accumulate(l.begin(), l.end(), int64_t{0});
}

// Runs `call` and checks that it failed with `code` and `message` within
// the agreement bound.
template <typename Call>
void ExpectAgreedError(Call&& call, absl::StatusCode code, const std::string& message) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = call();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  EXPECT_LT(took, kAgreementBound) << "the error took "
                                   << std::chrono::duration<double>(took).count() << " s";
}

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}

// Route -> reverse route is exact after the errors.
void ExpectExactRoundTrip(SequenceBalancer& balancer, int rank) {
  at::Tensor x = torch::randn({Rows(rank), 8});
  auto routed = balancer.Route(x);
  ASSERT_TRUE(routed.ok()) << routed.status();
  auto back = balancer.ReverseRoute(*routed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(torch::equal(*back, x));
}

// g2n2 on 4 ranks: bags {0,1} and {2,3}. Each balancer's first step,
// another rank errs in each call's first exchange (mid-step mistakes:
// mid_step_mistakes below).
const bool kOneRank = RegisterScenario("one_rank_errs", [](Worker& w) {
  for (int culprit = 0; culprit < w.size; ++culprit) {
    SCOPED_TRACE("culprit rank " + std::to_string(culprit));
    // A fresh balancer: the device fault below claims a device this process
    // has not, where no scratch rows could be allocated.
    Balanced b = Make(w);
    ASSERT_TRUE(b.balancer);
    SequenceBalancer& balancer = *b.balancer;
    const bool me = w.rank == culprit;
    ASSERT_TRUE(balancer.PlanRouting(Lengths(w.rank)).ok());
    const std::string who = "rank " + std::to_string(culprit) + ": ";

    // Route: too few rows on one rank.
    ExpectAgreedError(
        [&] { return StatusOf(balancer.Route(torch::zeros({Rows(w.rank) - (me ? 1 : 0), 8}))); },
        absl::StatusCode::kInvalidArgument, who + "route: ");

    // Route: a tensor on a device the transport does not move.
    b.faults->claimed_cuda_device = me ? 0 : -1;
    ExpectAgreedError([&] { return StatusOf(balancer.Route(torch::zeros({Rows(w.rank), 8}))); },
                      absl::StatusCode::kInvalidArgument,
                      who + "route: is on cpu, but rank " + std::to_string(culprit) +
                          "'s transport moves cuda:0 memory");
    b.faults->claimed_cuda_device = -1;

    // Route: another dtype on one rank (a row size no peer matches).
    at::Tensor features = torch::randn({Rows(w.rank), 8});
    ExpectAgreedError(
        [&] { return StatusOf(balancer.Route(me ? features.to(torch::kDouble) : features)); },
        absl::StatusCode::kInvalidArgument,
        culprit == 0 ? "route at step 0: the tensor's dtype is Double on rank 0 but Float on "
                       "rank 1"
                     : "route at step 0: the tensor's dtype is Float on rank 0 but Double on rank " +
                           std::to_string(culprit));

    auto routed = balancer.Route(features);
    ASSERT_TRUE(routed.ok()) << routed.status();
    const int64_t routed_rows = routed->size(0);

    // PreAttn is the bag's collective: the culprit's bag fails together,
    // the other bag goes on; then the culprit's bag retries.
    const bool culprit_bag = w.rank / 2 == culprit / 2;
    at::Tensor heads = routed->reshape({routed_rows, 4, 2});
    at::Tensor bad = me ? heads.narrow(0, 0, routed_rows > 0 ? routed_rows - 1 : 0)
                              .reshape({-1, 4, 2})
                        : heads;
    if (me && routed_rows == 0) bad = torch::zeros({1, 4, 2});
    auto pre = balancer.PreAttn(bad);
    if (culprit_bag) {
      EXPECT_EQ(pre.status().code(), absl::StatusCode::kInvalidArgument) << pre.status();
      EXPECT_THAT(std::string(pre.status().message()),
                  HasSubstr("rank " + std::to_string(culprit) + ": pre_attn: "));
      pre = balancer.PreAttn(heads);
    }
    ASSERT_TRUE(pre.ok()) << pre.status();
    auto post = balancer.PostAttn(*pre);
    ASSERT_TRUE(post.ok()) << post.status();
    EXPECT_TRUE(torch::equal(post->reshape({routed_rows, 8}), *routed));

    // ReverseRoute: wrong rows on one rank.
    ExpectAgreedError(
        [&] {
          return StatusOf(balancer.ReverseRoute(me ? torch::zeros({routed_rows + 1, 8}) : *routed));
        },
        absl::StatusCode::kInvalidArgument, who + "reverse_route: ");
    auto back = balancer.ReverseRoute(*routed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal(*back, features));
  }
});

TEST(AgreedErrors, OneRanksMistakeIsEveryRanksErrorAndTheNextCallWorks) {
  WorkerRun run = RunWorkers("one_rank_errs", 4, {{"topology", "g2n2"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// g1n2+g2n1 on 4 ranks: ranks 2 and 3 form the only 2-GPU bag. Its count
// check fails (in both members, as a real mismatch would): ranks 0 and 1
// never see the bag's check, yet must fail the step too.
const bool kBagCheck = RegisterScenario("bag_check_fails", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  if (w.rank >= 2) b.faults->failing_subgroup_checks = 1;
  ExpectAgreedError([&] { return b.balancer->PlanRouting(Lengths(w.rank)); },
                    absl::StatusCode::kInvalidArgument, "rank 2: injected count mismatch");
  EXPECT_EQ(b.balancer->Route(torch::zeros({Rows(w.rank), 8})).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b.balancer->PlanRouting(Lengths(w.rank)).ok());
  ExpectExactRoundTrip(*b.balancer, w.rank);
});

TEST(AgreedErrors, ABagsFailedCheckFailsTheStepOnEveryRank) {
  WorkerRun run = RunWorkers("bag_check_fails", 4, {{"topology", "g1n2+g2n1"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// Two routed tensors, each rank's loss uses them differently: every rank
// runs the backward exchanges in the reverse of the forward order (told
// apart by their row sizes), and the gradients are exact. In the second
// step: the first one also moves a scratch exchange of the first route's
// shape when the second route's tensors turn out to differ
// (row_exchange.h), and the second step expects them.
const bool kBackwardOrder = RegisterScenario("backward_order", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  for (int step = 0; step < 2; ++step) {
  SCOPED_TRACE("step " + std::to_string(step));
  const size_t earlier = b.transport->exchanges().size();
  ASSERT_TRUE(b.balancer->PlanRouting(Lengths(w.rank)).ok());
  at::Tensor a = torch::randn({Rows(w.rank), 4}).requires_grad_(true);  // 16-byte rows
  at::Tensor c = torch::randn({Rows(w.rank), 2}).requires_grad_(true);  // 8-byte rows
  auto ya = b.balancer->Route(a);
  auto yc = b.balancer->Route(c);
  ASSERT_TRUE(ya.ok() && yc.ok());
  // The later exchange's node waits on the earlier one's: a structure no
  // scheduler can reorder.
  bool chained = false;
  for (const torch::autograd::Edge& edge : yc->grad_fn()->next_edges()) {
    chained = chained || edge.function == ya->grad_fn();
  }
  EXPECT_TRUE(chained) << "the second exchange's backward does not follow the first's";
  at::Tensor wa = torch::randn(ya->sizes()), wc = torch::randn(yc->sizes());
  at::Tensor loss = w.rank % 2 == 0
                        ? (*ya * wa).sum() + ((*yc * wc) * 1.0).sum() * 1.0
                        : ((*ya * wa) * 1.0).sum() * 1.0 + (*yc * wc).sum();
  loss.backward();
  const std::vector<int64_t> exchanges(b.transport->exchanges().begin() + earlier,
                                       b.transport->exchanges().end());
  const std::vector<int64_t> expected =
      step == 0 ? std::vector<int64_t>{16, 16, 8, 8, 16} : std::vector<int64_t>{16, 8, 8, 16};
  EXPECT_EQ(exchanges, expected);
  // d loss / d a = wa routed back to a's rows.
  auto wa_back = b.balancer->ReverseRoute(wa);
  auto wc_back = b.balancer->ReverseRoute(wc);
  ASSERT_TRUE(wa_back.ok() && wc_back.ok());
  EXPECT_TRUE(torch::equal(a.grad(), *wa_back));
  EXPECT_TRUE(torch::equal(c.grad(), *wc_back));

  // A second graph in the same step, after that backward: a new chain, not
  // a link into the graph whose backward already ran (and was freed).
  at::Tensor d = torch::randn({Rows(w.rank), 2}).requires_grad_(true);
  auto yd = b.balancer->Route(d);
  ASSERT_TRUE(yd.ok()) << yd.status();
  for (const torch::autograd::Edge& edge : yd->grad_fn()->next_edges()) {
    EXPECT_NE(edge.function, yc->grad_fn()) << "linked into a graph already backpropagated";
  }
  (*yd * 3).sum().backward();
  EXPECT_TRUE(torch::equal(d.grad(), torch::full_like(d, 3)));
  }
});

TEST(BackwardOrder, ExchangesRunInReverseForwardOrderOnEveryRank) {
  WorkerRun run = RunWorkers("backward_order", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// Mistakes that show only mid-step, after each call's first exchange was
// agreed, on 4 ranks in two bags of two (g2n2): at "layer 5" one rank passes
// another dtype to pre_attn, too many rows to post_attn, another trailing
// shape to route; every rank of the call's group gets the same error at
// once (it names the world rank, the call, the field and both values), the
// other bag goes on, and every later call and the next step are exact.
const bool kMidStep = RegisterScenario("mid_step_mistakes", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  SequenceBalancer& balancer = *b.balancer;
  const int culprit = 3;  // bag {2, 3}
  const bool me = w.rank == culprit;
  const bool culprit_bag = w.rank / 2 == culprit / 2;
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_TRUE(balancer.PlanRouting(Lengths(w.rank)).ok());
    at::Tensor x = torch::randn({Rows(w.rank), 8});
    auto routed = balancer.Route(x);
    ASSERT_TRUE(routed.ok()) << routed.status();
    const int64_t rows = routed->size(0);
    at::Tensor heads = routed->reshape({rows, 4, 2});
    for (int layer = 0; layer < 8; ++layer) {
      SCOPED_TRACE("layer " + std::to_string(layer));
      const int gathers = b.faults->subgroup_all_gathers;
      if (step == 0 && layer == 5) {
        auto pre = balancer.PreAttn(me ? heads.to(torch::kDouble) : heads);
        if (culprit_bag) {
          EXPECT_EQ(pre.status().code(), absl::StatusCode::kInvalidArgument) << pre.status();
          EXPECT_THAT(std::string(pre.status().message()),
                      HasSubstr("pre_attn at step 0: the tensor's dtype is Float on rank 2 but "
                                "Double on rank 3"));
        } else {
          EXPECT_TRUE(pre.ok()) << pre.status();
        }
        pre = balancer.PreAttn(heads);
        ASSERT_TRUE(pre.ok()) << pre.status();
        auto post = balancer.PostAttn(me ? torch::cat({*pre, *pre}) : *pre);
        if (culprit_bag) {
          EXPECT_EQ(post.status().code(), absl::StatusCode::kInvalidArgument) << post.status();
          EXPECT_THAT(std::string(post.status().message()), HasSubstr("rank 3: post_attn: "));
        }
        continue;
      }
      auto pre = balancer.PreAttn(heads);
      ASSERT_TRUE(pre.ok()) << pre.status();
      auto post = balancer.PostAttn(*pre);
      ASSERT_TRUE(post.ok()) << post.status();
      EXPECT_TRUE(torch::equal(*post, heads));
      // After the first layer, a layer's exchanges meet nobody but the data.
      if (layer > 0) EXPECT_EQ(b.faults->subgroup_all_gathers, gathers);
    }
    if (step == 0) {
      ExpectAgreedError(
          [&] { return StatusOf(balancer.Route(me ? torch::randn({Rows(w.rank), 4, 2}) : x)); },
          absl::StatusCode::kInvalidArgument,
          "route at step 0: the tensor's shape after dimension 0 is [8] on rank 0 but [4, 2] on "
          "rank 3");
    }
    auto back = balancer.ReverseRoute(*routed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal(*back, x));
  }
});

TEST(AgreedErrors, AMidStepMistakeOnOneRankIsEveryRanksErrorAndTheNextStepIsExact) {
  WorkerRun run = RunWorkers("mid_step_mistakes", 4, {{"topology", "g2n2"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// Rows of 32 KiB (a float and a double tensor side by side): a peer's rows
// over 256 KiB travel by tensor, from where they lie, with the flag in a
// message of its own, and smaller ones packed with the flag, in the same
// exchange. Both ways and their gradients are exact, and a mistake on one
// rank at a later route (its stand-in from scratch sends the same mix of
// messages) is every rank's error at once, the next route exact.
std::vector<int64_t> WideLengths(int rank) { return {30 + 7 * rank, 3, 11 + 2 * rank, 1}; }

const bool kWideRows = RegisterScenario("wide_rows", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  SequenceBalancer& balancer = *b.balancer;
  const std::vector<int64_t> lengths = WideLengths(w.rank);
  const int64_t rows = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  ASSERT_TRUE(balancer.PlanRouting(lengths).ok());
  // Both kinds of message occur somewhere in the world's route.
  constexpr int64_t kRowBytes = 4096 * 4 + 2048 * 8;
  std::vector<int64_t> to_peer(w.size, 0);
  for (const auto& transfer : balancer.step_plan().plan.route.sends) {
    if (transfer.peer != w.rank) to_peer[transfer.peer] += transfer.length;
  }
  int kinds = 0;
  for (int64_t r : to_peer) {
    if (r * kRowBytes > (256 << 10)) kinds |= 1;
    if (r > 0 && r * kRowBytes <= (256 << 10)) kinds |= 2;
  }
  auto all = b.transport->AllGatherBytes(std::to_string(kinds));
  ASSERT_TRUE(all.ok()) << all.status();
  int seen = 0;
  for (const std::string& k : *all) seen |= std::stoi(k);
  EXPECT_EQ(seen, 3) << "the plan moves no large or no small message: pick other lengths";

  const int culprit = 1;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    at::Tensor x = torch::randn({rows, 4096}).requires_grad_(true);
    at::Tensor y = torch::randn({rows, 2048}, torch::kDouble);
    if (round == 1) {
      ExpectAgreedError(
          [&] {
            return StatusOf(balancer.RouteTensors(
                {x, w.rank == culprit ? y.to(torch::kFloat) : y}));
          },
          absl::StatusCode::kInvalidArgument, "rank 1");
      continue;
    }
    auto routed = balancer.RouteTensors({x, y});
    ASSERT_TRUE(routed.ok()) << routed.status();
    auto back = balancer.ReverseRouteTensors(*routed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal((*back)[0], x));
    EXPECT_TRUE(torch::equal((*back)[1], y));
    const at::Tensor weights = torch::randn({rows, 4096});
    ((*back)[0] * weights).sum().backward();
    EXPECT_TRUE(torch::equal(x.grad(), weights));
  }
});

TEST(AgreedErrors, LargeAndSmallMessagesInOneExchangeAreExactAndAgreeOnMistakes) {
  WorkerRun run = RunWorkers("wide_rows", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// The packed path (transports that move contiguous buffers only, as NCCL's
// do), on Gloo with its segments hidden: several tensors of other dtypes in
// their own columns, head groups split and merged in the packing pass, a
// mid-step mistake every rank's error, and everything exact, gradients too.
const bool kPackedPath = RegisterScenario("packed_path", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  b.faults->hide_segments = true;
  SequenceBalancer& balancer = *b.balancer;
  const bool culprit_bag = w.rank >= 2;  // bags {0, 1} and {2, 3}
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_TRUE(balancer.PlanRouting(Lengths(w.rank)).ok());
    at::Tensor x = torch::randn({Rows(w.rank), 8}).requires_grad_(true);
    at::Tensor ids = torch::arange(Rows(w.rank), torch::kLong) + 1000 * w.rank;
    auto routed = balancer.RouteTensors({x, ids});
    ASSERT_TRUE(routed.ok()) << routed.status();
    const int64_t rows = (*routed)[0].size(0);
    // 32, 64 and 8 bytes a row, half of each to a bag position: 4-byte words.
    at::Tensor q = (*routed)[0].reshape({rows, 4, 2});
    at::Tensor k = q.to(torch::kDouble) * 2;
    at::Tensor v = (*routed)[1].remainder(30000).to(torch::kShort).reshape({rows, 1, 1})
                       .expand({rows, 4, 1}).contiguous();
    at::Tensor loss = torch::zeros({});
    at::Tensor expected_grad = torch::zeros({rows, 4, 2});
    for (int layer = 0; layer < 3; ++layer) {
      SCOPED_TRACE("layer " + std::to_string(layer));
      if (step == 0 && layer == 1) {
        auto wrong = balancer.PreAttnTensors({q, w.rank == 3 ? k.to(torch::kFloat) : k, v});
        if (culprit_bag) {
          EXPECT_THAT(std::string(wrong.status().message()),
                      HasSubstr("pre_attn at step 0: tensor 1's dtype is Double on rank 2 but "
                                "Float on rank 3"));
        } else {
          EXPECT_TRUE(wrong.ok()) << wrong.status();
        }
      }
      auto pre = balancer.PreAttnTensors({q, k, v});
      ASSERT_TRUE(pre.ok()) << pre.status();
      auto post = balancer.PostAttnTensors(*pre);
      ASSERT_TRUE(post.ok()) << post.status();
      EXPECT_TRUE(torch::equal((*post)[0], q));
      EXPECT_TRUE(torch::equal((*post)[1], k));
      EXPECT_TRUE(torch::equal((*post)[2], v));
      // Whole weights: the gradient's sums are exact in any order.
      const at::Tensor wq = torch::randint(-8, 8, {rows, 4, 2});
      const at::Tensor wk = torch::randint(-8, 8, {rows, 4, 2}, torch::kDouble);
      loss = loss + ((*post)[0] * wq).sum() + ((*post)[1] * wk).sum().to(torch::kFloat);
      expected_grad = expected_grad + wq + (wk * 2).to(torch::kFloat);
    }
    auto back = balancer.ReverseRouteTensors(*routed);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal((*back)[0], x));
    EXPECT_TRUE(torch::equal((*back)[1], ids));
    loss.backward();
    at::Tensor want;
    {
      torch::NoGradGuard no_grad;
      auto reversed = balancer.ReverseRoute(expected_grad.reshape({rows, 8}));
      ASSERT_TRUE(reversed.ok()) << reversed.status();
      want = *reversed;
    }
    EXPECT_TRUE(torch::equal(x.grad(), want)) << (x.grad() - want).abs().max();
  }
});

TEST(AgreedErrors, ThePackedPathIsExactAndAgreesOnMistakes) {
  WorkerRun run = RunWorkers("packed_path", 4, {{"topology", "g2n2"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// Every rank changing a call's tensors alike mid-step is no mistake: the
// new signature becomes the call's, and the rows are exact.
const bool kAlike = RegisterScenario("alike_change", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  ASSERT_TRUE(b.balancer->PlanRouting(Lengths(w.rank)).ok());
  at::Tensor x = torch::randn({Rows(w.rank), 8});
  at::Tensor positions = torch::arange(Rows(w.rank), torch::kLong).unsqueeze(1) + 1000 * w.rank;
  for (int i = 0; i < 3; ++i) {
    auto rx = b.balancer->Route(x);
    auto rp = b.balancer->Route(positions);
    ASSERT_TRUE(rx.ok() && rp.ok()) << rx.status() << rp.status();
    auto bx = b.balancer->ReverseRoute(*rx);
    auto bp = b.balancer->ReverseRoute(*rp);
    ASSERT_TRUE(bx.ok() && bp.ok()) << bx.status() << bp.status();
    EXPECT_TRUE(torch::equal(*bx, x));
    EXPECT_TRUE(torch::equal(*bp, positions));
  }
});

TEST(AgreedErrors, EveryRankChangingItsTensorsAlikeIsNoMistake) {
  WorkerRun run = RunWorkers("alike_change", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// A rank that routes before planning while its peers plan: every rank
// names the calls instead of misreading each other's bytes, and then the
// step plans and routes exactly.
const bool kUnplanned = RegisterScenario("unplanned_route", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  const std::string expected =
      "rank 1 is in an exchange (route, reverse_route, pre_attn or post_attn) without a plan "
      "while rank 0 is in Plan";
  if (w.rank == 1) {
    ExpectAgreedError([&] { return StatusOf(b.balancer->Route(torch::zeros({Rows(w.rank), 8}))); },
                      absl::StatusCode::kFailedPrecondition, expected);
  } else {
    ExpectAgreedError([&] { return b.balancer->PlanRouting(Lengths(w.rank)); },
                      absl::StatusCode::kFailedPrecondition, expected);
  }
  ASSERT_TRUE(b.balancer->PlanRouting(Lengths(w.rank)).ok());
  ExpectExactRoundTrip(*b.balancer, w.rank);
});

TEST(AgreedErrors, ARouteBeforeItsPlanNamesTheCallsOnEveryRank) {
  WorkerRun run = RunWorkers("unplanned_route", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// A peer that exits between steps: every survivor's next collective fails
// within Gloo's timeout (at once: the peer's sockets close), and every
// later call fails fast.
const bool kDeadPeer = RegisterScenario("dead_peer", [](Worker& w) {
  Balanced b = Make(w);
  ASSERT_TRUE(b.balancer);
  ASSERT_TRUE(b.balancer->PlanRouting(Lengths(w.rank)).ok());
  ExpectExactRoundTrip(*b.balancer, w.rank);
  if (w.rank == 3) std::_Exit(0);
  const auto start = std::chrono::steady_clock::now();
  absl::Status first = b.balancer->Route(torch::zeros({Rows(w.rank), 8})).status();
  EXPECT_FALSE(first.ok());
  EXPECT_TRUE(absl::IsUnavailable(first) || absl::IsDeadlineExceeded(first)) << first;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60)) << first;
  const auto again = std::chrono::steady_clock::now();
  absl::Status later = b.balancer->PlanRouting(Lengths(w.rank));
  EXPECT_TRUE(absl::IsUnavailable(later)) << later;
  EXPECT_THAT(std::string(later.message()), HasSubstr("unusable after an earlier failure"));
  EXPECT_LT(std::chrono::steady_clock::now() - again, std::chrono::seconds(1));
});

// What agreement costs: one all-gather for the first exchange of each call,
// none for the later ones (their flags travel in their rows' messages), in this step
// and the next ones, which expect what the first agreed; one per exchange
// when debugging, none when off (PlanRouting agrees either way).
const bool kAgreementCost = RegisterScenario("agreement_cost", [](Worker& w) {
  enum Mode { kOncePerStep, kEveryExchange, kOff };
  for (Mode mode : {kOncePerStep, kEveryExchange, kOff}) {
    SCOPED_TRACE("mode " + std::to_string(mode));
    Balanced b = Make(w, mode != kOff, mode == kEveryExchange);
    ASSERT_TRUE(b.balancer);
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(b.balancer->PlanRouting(Lengths(w.rank)).ok());
      const int before = b.transport->all_gathers();
      const size_t exchanges_before = b.transport->exchanges().size();
      const int first = mode == kOff || (mode == kOncePerStep && step > 0) ? 0 : 2;
      ExpectExactRoundTrip(*b.balancer, w.rank);  // the first route and reverse of the step
      EXPECT_EQ(b.transport->all_gathers() - before, first);
      for (int layer = 0; layer < 3; ++layer) ExpectExactRoundTrip(*b.balancer, w.rank);
      EXPECT_EQ(b.transport->all_gathers() - before, mode == kEveryExchange ? 8 : first);
      // Flags travel inside the exchanges' own messages: 8 data exchanges
      // and no other call.
      EXPECT_EQ(b.transport->exchanges().size() - exchanges_before, 8u);
      EXPECT_EQ(b.transport->flagged(), 0);
    }
    // Off, a mistake is this rank's own error (every rank makes it here, so
    // nobody waits).
    absl::Status wrong = b.balancer->Route(torch::zeros({Rows(w.rank) + 1, 8})).status();
    EXPECT_THAT(std::string(wrong.message()),
                HasSubstr(mode != kOff ? "rank 0: route: "
                                       : "route: " + std::to_string(Rows(w.rank) + 1)));
  }
});

TEST(AgreedErrors, OneAllGatherPerCallAndStepOnePerExchangeWhenDebuggingNoneWhenOff) {
  WorkerRun run = RunWorkers("agreement_cost", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// A group of one rank over a transport that moves contiguous buffers only
// (as NCCL's do): every exchange is one copy of its own rows, with no data
// call to the transport at all; after each call's first exchange, no call
// at all; outputs and gradients exact.
TEST(OneRank, ExchangesAreLocalCopiesWithoutTransportCalls) {
  auto group = LocalTransport::CreateGroup(1);
  auto faults = std::make_shared<Faults>();
  faults->hide_segments = true;
  RecordingTransport transport(group[0].get(), faults);
  SequenceBalancerOptions options;
  options.job_id = "one-rank";
  options.topology = "g1n1";
  options.d_model = 64;
  auto balancer = SequenceBalancer::Create(options, &transport);
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE((*balancer)->PlanRouting({5, 0, 9, 2}).ok());
    const int gathers = transport.all_gathers();
    at::Tensor x = torch::randn({16, 4, 2}).requires_grad_(true);
    auto routed = (*balancer)->Route(x);
    ASSERT_TRUE(routed.ok()) << routed.status();
    auto pre = (*balancer)->PreAttn(*routed);
    ASSERT_TRUE(pre.ok()) << pre.status();
    auto post = (*balancer)->PostAttn(*pre * 2);
    ASSERT_TRUE(post.ok()) << post.status();
    auto back = (*balancer)->ReverseRoute(*post);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(torch::equal(*back, x * 2));
    at::Tensor weight = torch::randn({16, 4, 2});
    (*back * weight).sum().backward();
    EXPECT_TRUE(torch::equal(x.grad(), weight * 2));
    EXPECT_TRUE(transport.exchanges().empty()) << "a data call to the transport";
    // Each call's first exchange agreed (routes: 2), none in the next step.
    EXPECT_EQ(transport.all_gathers() - gathers, step == 0 ? 2 : 0);
  }
}

TEST(DeadPeer, EverySurvivorFailsAndThenFailsFast) {
  WorkerRun run = RunWorkers("dead_peer", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) { return knapformer::testing_util::TestMain(argc, argv); }
