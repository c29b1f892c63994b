// Attention masks end to end on a real engine: 4 and 8 processes on
// TCPStore + Gloo plan steps whose sequences attend causally, in sliding
// windows or block-causally (spans), locally and through the planner
// service in both modes. Each rank learns the masks of the sequences its
// attention sees (SequenceBalancer::attention_masks), and float64 masked
// attention through route -> pre_attn -> masked attention -> post_attn ->
// reverse_route equals the same attention without balancing, outputs and
// gradients, to 1e-10. Malformed masks fail the step on every rank with
// InvalidArgument naming the rank, the sequence and the field.
#include <random>
#include <string>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/sequence_balancer.h"
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
using ::testing::HasSubstr;

constexpr int kModel = 8;
constexpr int kHeads = 8;
constexpr int kHeadDim = 2;

std::vector<int64_t> Lengths(int rank, int size, uint64_t step) {
  std::mt19937_64 random(rank * 1000 + step);
  std::vector<int64_t> lengths;
  switch (step % 3) {
    case 0:
      for (int i = 0, n = 1 + random() % 4; i < n; ++i) lengths.push_back(1 + random() % 48);
      if (rank == 0) lengths.push_back(150);  // split across a bag
      break;
    case 1:
      if (rank == 1) break;  // no sequences
      lengths = {0, static_cast<int64_t>(1 + random() % 30), 0};
      if (rank == size - 1) lengths.push_back(3);  // shorter than a bag
      break;
    case 2:
      if (rank == 0) lengths = {5, 77};  // two sequences for the world
      break;
  }
  return lengths;
}

// The mask of sequence `i` of `rank` at `step`: every kind, spans of
// random cuts with full and causal parts. Derivable on any rank, so that
// a rank can check the masks the plan hands it.
AttentionMask MaskOf(int rank, uint64_t step, size_t i, int64_t length) {
  std::mt19937_64 random(rank * 7 + step * 131 + i * 17 + 3);
  switch ((rank + step + i) % 4) {
    case 0:
      return AttentionMask::Causal();
    case 1:
      return AttentionMask::Window(1 + static_cast<int64_t>(random() % 12));
    case 2: {
      if (length == 0) return AttentionMask::Full();
      std::vector<MaskSpan> spans;
      for (int64_t left = length; left > 0;) {
        const int64_t n = std::min<int64_t>(left, 1 + static_cast<int64_t>(random() % 20));
        spans.push_back({n, random() % 2 == 0});
        left -= n;
      }
      return AttentionMask::Spans(std::move(spans));
    }
    default:
      return AttentionMask::Full();
  }
}

std::vector<AttentionMask> MasksOf(int rank, uint64_t step, const std::vector<int64_t>& lengths) {
  std::vector<AttentionMask> masks;
  for (size_t i = 0; i < lengths.size(); ++i) masks.push_back(MaskOf(rank, step, i, lengths[i]));
  return masks;
}

int64_t Total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

SequenceBalancerOptions Options(const Worker& w) {
  SequenceBalancerOptions options;
  options.job_id = "masked-test";
  options.topology = w.args.at("topology");
  options.d_model = 512;
  options.gamma = 1.0;
  if (w.args.count("planner")) {
    options.planner.address = w.args.at("planner");
    options.planner.call_deadline = absl::Seconds(30);
    options.planner.require_service = true;
  }
  if (w.args.count("mode")) options.planner.mode = ParsePlannerMode(w.args.at("mode")).value();
  return options;
}

// The masks the plan hands this rank are those of the sequences its
// attention sees, in their order.
void CheckHeldMasks(const Worker& w, const SequenceBalancer& balancer, uint64_t step) {
  const RankPlan& plan = balancer.step_plan().plan;
  const std::vector<AttentionMask>& held = balancer.attention_masks();
  ASSERT_EQ(held.size(), balancer.attention_lengths().size()) << "rank " << w.rank;
  std::vector<std::pair<int32_t, int32_t>> sources;
  if (plan.ulysses.gpus > 1) {
    for (const UlyssesSequence& s : plan.ulysses.sequences) sources.push_back({s.src_rank, s.seq_index});
  } else {
    for (const Transfer& t : plan.route.recvs) sources.push_back({t.peer, t.seq_index});
  }
  ASSERT_EQ(sources.size(), held.size());
  for (size_t k = 0; k < held.size(); ++k) {
    const auto [src, seq] = sources[k];
    const int64_t length = Lengths(src, w.size, step)[seq];
    EXPECT_EQ(held[k], MaskOf(src, step, seq, length))
        << "rank " << w.rank << " sequence " << k << " (" << src << ", " << seq << ")";
  }
}

struct AttentionResult {
  at::Tensor out, x_grad, w_qkv_grad, w_out_grad;
};

AttentionResult MaskedAttention(Worker& w, const SequenceBalancer* balancer,
                                const std::vector<int64_t>& lengths,
                                const std::vector<AttentionMask>& masks, uint64_t seed) {
  torch::manual_seed(seed);
  at::Tensor w_qkv = torch::randn({kModel, 3 * kHeads * kHeadDim}, torch::kDouble);
  at::Tensor w_out = torch::randn({kHeads * kHeadDim, kModel}, torch::kDouble);
  torch::manual_seed(seed * 100 + w.rank + 1);
  at::Tensor x = torch::randn({Total(lengths), kModel}, torch::kDouble);
  at::Tensor upstream = torch::randn({Total(lengths), kModel}, torch::kDouble);
  w_qkv.requires_grad_(true);
  w_out.requires_grad_(true);
  x.requires_grad_(true);

  at::Tensor h = balancer != nullptr ? balancer->Route(x).value() : x;
  std::vector<at::Tensor> qkv = torch::matmul(h, w_qkv).reshape({-1, 3, kHeads, kHeadDim}).unbind(1);
  std::vector<int64_t> attention_lengths = lengths;
  std::vector<AttentionMask> attention_masks = masks;
  if (balancer != nullptr) {
    qkv = balancer->PreAttnTensors(qkv).value();
    attention_lengths = balancer->attention_lengths();
    attention_masks = balancer->attention_masks();
  }
  at::Tensor o = VarlenAttention(qkv[0], qkv[1], qkv[2], attention_lengths, attention_masks);
  if (balancer != nullptr) o = balancer->PostAttn(o).value();
  at::Tensor out = torch::matmul(o.reshape({-1, kHeads * kHeadDim}), w_out);
  if (balancer != nullptr) out = balancer->ReverseRoute(out).value();
  (out * upstream).sum().backward();
  at::Tensor grads[2] = {w_qkv.grad().clone(), w_out.grad().clone()};
  for (at::Tensor& grad : grads) {
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

const bool kMasked = RegisterScenario("masked", [](Worker& w) {
  auto balancer = SequenceBalancer::Create(Options(w), w.transport.get());
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  const PlanSource source = w.args.count("planner") ? PlanSource::kService : PlanSource::kLocal;
  uint64_t steps = 6;  // two rounds of Lengths' three kinds of step
  if (w.args.count("steps")) {
    ASSERT_TRUE(absl::SimpleAtoi(w.args.at("steps"), &steps));
  }
  for (uint64_t step = 0; step < steps; ++step) {
    const std::vector<int64_t> lengths = Lengths(w.rank, w.size, step);
    const std::vector<AttentionMask> masks = MasksOf(w.rank, step, lengths);
    absl::Status planned = (*balancer)->PlanRouting(lengths, {}, masks);
    ASSERT_TRUE(planned.ok()) << planned;
    EXPECT_EQ((*balancer)->step_plan().source, source);
    CheckHeldMasks(w, **balancer, step);
    // A masked attention gives a different answer than a full one: the
    // masks the plan carries are the ones attention must use.
    AttentionResult balanced = MaskedAttention(w, balancer->get(), lengths, masks, step + 3);
    AttentionResult reference = MaskedAttention(w, nullptr, lengths, masks, step + 3);
    ExpectClose(balanced.out, reference.out, "masked attention output", w.rank);
    ExpectClose(balanced.x_grad, reference.x_grad, "input gradient", w.rank);
    ExpectClose(balanced.w_qkv_grad, reference.w_qkv_grad, "qkv weight gradient", w.rank);
    ExpectClose(balanced.w_out_grad, reference.w_out_grad, "output weight gradient", w.rank);
  }
  // Without masks the next step is planned as before masks: none held.
  ASSERT_TRUE((*balancer)->PlanRouting(Lengths(w.rank, w.size, 0)).ok());
  EXPECT_TRUE((*balancer)->attention_masks().empty());
});

// Every malformed mask fails the step on every rank, naming rank 2, and
// nothing is planned: the next good step works.
const bool kMaskErrors = RegisterScenario("mask_errors", [](Worker& w) {
  auto balancer = SequenceBalancer::Create(Options(w), w.transport.get());
  ASSERT_TRUE(balancer.ok()) << balancer.status();
  const std::vector<int64_t> lengths = {10, 6};
  struct Case {
    std::vector<AttentionMask> bad;  // rank 2's
    const char* message;
  };
  std::vector<MaskSpan> many(AttentionMask::kMaxSpans + 1, MaskSpan{1, false});
  const std::vector<Case> cases = {
      {{AttentionMask::Causal(), AttentionMask::Spans({{2, false}, {3, true}})},
       "attention_masks[1].spans: lengths add up to 5, the sequence has 6 tokens"},
      {{AttentionMask::Window(0), AttentionMask::Causal()},
       "attention_masks[0].window: must be at least 1, got 0"},
      {{AttentionMask::Spans(many), AttentionMask::Causal()},
       "attention_masks[0].spans: 4097 spans exceed the limit of 4096"},
      {{AttentionMask::Causal()}, "attention_masks: 1 masks for 2 sequences"},
      {{}, "rank 2: attention_masks: none for 2 sequences, while rank 0: attention_masks gives"},
  };
  for (const Case& c : cases) {
    std::vector<AttentionMask> masks = {AttentionMask::Causal(), AttentionMask::Full()};
    if (w.rank == 2) masks = c.bad;
    absl::Status refused = (*balancer)->PlanRouting(lengths, {}, masks);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_THAT(std::string(refused.message()), HasSubstr(c.message)) << "rank " << w.rank;
    EXPECT_THAT(std::string(refused.message()), HasSubstr("rank 2")) << "rank " << w.rank;
  }
  // A refusal before the balancer (a binding's) is every rank's error too.
  StepOverrides refused_input;
  if (w.rank == 3) {
    refused_input.refused_input =
        absl::InvalidArgumentError("attn_masks[1]: unknown mask kind 'diagonal'");
  }
  absl::Status refused = (*balancer)->PlanRouting(
      lengths, refused_input, {AttentionMask::Causal(), AttentionMask::Full()});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("attn_masks[1]: unknown mask kind 'diagonal'"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("rank 3"));
  // A bad mask in a prefetched step: the prefetch (group mode, or local
  // planning) or the step's PlanRouting (per-rank) fails on every rank.
  std::vector<AttentionMask> prefetched = {AttentionMask::Causal(), AttentionMask::Full()};
  if (w.rank == 2) prefetched = {AttentionMask::Causal(), AttentionMask::Window(-2)};
  absl::Status ahead = (*balancer)->PrefetchRouting(lengths, {}, prefetched);
  if (ahead.ok()) ahead = (*balancer)->PlanRouting(lengths, {}, prefetched);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kInvalidArgument) << ahead;
  EXPECT_THAT(std::string(ahead.message()),
              HasSubstr("attention_masks[1].window: must be at least 1, got -2"));
  EXPECT_THAT(std::string(ahead.message()), HasSubstr("rank 2"));
  // An unknown kind is refused, not planned as a full mask.
  std::vector<AttentionMask> unknown = {AttentionMask::Causal(), AttentionMask::Full()};
  if (w.rank == 1) unknown[0].kind = static_cast<AttentionMask::Kind>(9);
  absl::Status kind = (*balancer)->PlanRouting(lengths, {}, unknown);
  EXPECT_EQ(kind.code(), absl::StatusCode::kInvalidArgument) << kind;
  EXPECT_THAT(std::string(kind.message()), HasSubstr("attention_masks[0]: unknown mask kind 9"));
  // Nothing was planned by the refused steps; a good one goes through.
  absl::Status planned =
      (*balancer)->PlanRouting(lengths, {}, {AttentionMask::Causal(), AttentionMask::Full()});
  EXPECT_TRUE(planned.ok()) << planned;
});

absl::StatusOr<std::unique_ptr<PlannerServer>> StartPlanner() {
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address = "";
  options.service.limits.rendezvous_timeout = absl::Seconds(2);
  return PlannerServer::Start(options);
}

TEST(MaskedAttention, FourRanksInTwoBagsOfTwoPlannedLocally) {
  WorkerRun run = RunWorkers("masked", 4, {{"topology", "g2n2"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

TEST(MaskedAttention, EightRanksInBagsOfOneTwoAndFourPlannedLocally) {
  WorkerRun run = RunWorkers("masked", 8, {{"topology", "g1n2+g2n1+g4n1"}});
  EXPECT_TRUE(run.ok()) << run.output;
}

// 3 steps, not the local runs' 6: one round of Lengths' three kinds of
// step; what differs from the local runs is where the plans come from.
TEST(MaskedAttention, ThroughTheServiceInEitherMode) {
  auto server = StartPlanner();
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* mode : {"group", "per-rank"}) {
    WorkerRun run = RunWorkers("masked", 8,
                               {{"topology", "g1n4+g4n1"},
                                {"steps", "3"},
                                {"mode", mode},
                                {"planner", absl::StrCat("127.0.0.1:", (*server)->port())}});
    EXPECT_TRUE(run.ok()) << mode << ": " << run.output;
  }
}

TEST(MaskedAttention, MalformedMasksAreEveryRanksErrorLocallyAndThroughTheService) {
  WorkerRun local = RunWorkers("mask_errors", 4, {{"topology", "g1n4"}});
  EXPECT_TRUE(local.ok()) << local.output;
  auto server = StartPlanner();
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* mode : {"group", "per-rank"}) {
    WorkerRun run = RunWorkers("mask_errors", 4,
                               {{"topology", "g2n2"},
                                {"mode", mode},
                                {"planner", absl::StrCat("127.0.0.1:", (*server)->port())}});
    EXPECT_TRUE(run.ok()) << mode << ": " << run.output;
  }
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) { return knapformer::testing_util::TestMain(argc, argv); }
