// knapformer train-sim: N CPU processes (TCPStore + Gloo on 127.0.0.1) train
// a small transformer block stack on the paper's synthetic data streams,
// each step twice on the same weights and tokens: without balancing (every
// rank on its own sequences) and with the SequenceBalancer (plan, route,
// Ulysses attention in multi-GPU bags, reverse route, backward). It prints
// each rank's compute time per step (thread user CPU time, one intra-op thread,
// so that processes sharing cores do not blur it), the measured WIR
// (max/min of those times) and the planner's predicted max/mean, and checks
// that both runs give the same loss and all-reduced gradients. With several
// topologies (--topology auto,g1n4,g4n1) every step is balanced once per
// topology, on the same weights and tokens, and the summary compares their
// slowest-rank compute: auto against the best fixed one, in the same run.
//
//   bazel run -c opt //tools:train_sim -- --procs 4 --steps 5
//   (or: bash scripts/knapformer train-sim ...)

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/environment.h"
#include "client/sequence_balancer.h"
#include "client/varlen_attention.h"
#include "common/args.h"
#include "common/log.h"
#include "common/malloc_policy.h"
#include "common/sample_stats.h"
#include "common/status_macros.h"
#include "launch/local_world.h"
#include "planner/auto_layout.h"
#include "planner/calibration.h"
#include "planner/data_stream.h"
#include "planner/rank_speeds.h"
#include "planner/topology.h"
#include "tools/machine_flags.h"
#include "tools/sim_data.h"
#include "tools/train_sim_report.pb.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

struct SimOptions {
  int procs = 4;
  int steps = 5;
  std::vector<std::string> topologies = {"g1n2+g2n1"};
  Machine machine;
  std::string data = "g2b4i256f1s0,g1b5i512f1s0,g1b1i2048f1s0";
  int scale = 8;
  int d_model = 64;
  int heads = 4;
  int layers = 2;
  double gamma = 1.0;
  bool fit_gamma = true;  // --gamma fit (the default): fitted to timed blocks
  uint64_t seed = 0;
  std::string planner;
  bool plan_ahead = false;
  int first_step = 0;
  int timeout_seconds = 900;
  bool masked = false;  // --data names a masked stream
  // --rank-speeds: "" (one speed), "learned", or a list (declared). With
  // either, each step is balanced by speed and by FLOPs, and compared.
  std::string rank_speeds;
  std::vector<double> declared_speeds;
  // --slow-rank R:F[:FROM-TO]: rank R computes at fraction F of its speed
  // during steps FROM..TO (all steps without a range): its measured times
  // are divided by F, as a GPU at that speed would take.
  int slow_rank = -1;
  double slow_fraction = 1;
  int slow_from = 0;
  int slow_to = std::numeric_limits<int>::max();

  // Rank `rank`'s speed at `step` (1 but on the slow rank in its steps).
  double SpeedAt(int rank, int step) const {
    return rank == slow_rank && step >= slow_from && step <= slow_to ? slow_fraction : 1.0;
  }
};

// The simulation's own machine: CPU processes, float32, one node.
Machine SimulatedMachine(int procs, int layers) {
  Machine simulated;
  simulated.flops_per_second = 0.02e12;
  simulated.intra_node_bytes_per_second = 2e9;
  simulated.inter_node_bytes_per_second = 2e9;
  simulated.gpus_per_node = procs;
  simulated.element_bytes = sizeof(float);
  simulated.blocks_per_route = layers;
  return simulated;
}

const std::vector<OptionSpec>& Options() {
  static const std::vector<OptionSpec> kOptions = [] {
    const SimOptions o;
    std::vector<OptionSpec> options = {
        {"procs", "N", absl::StrCat(o.procs), "CPU processes, one rank each"},
        {"steps", "N", absl::StrCat(o.steps), "training steps"},
        {"topology", "T[,T...]", absl::StrJoin(o.topologies, ","),
         "each step is balanced with each (auto: chosen per step)"},
        {"data", "D", "", "the paper's data codes or scenario (below)"},
        {"scale", "N", absl::StrCat(o.scale), "divides every length (CPU attention)"},
        {"d-model", "D", absl::StrCat(o.d_model), "the model width"},
        {"heads", "N", absl::StrCat(o.heads), "attention heads; must divide --d-model"},
        {"layers", "N", absl::StrCat(o.layers), "transformer blocks"},
        {"gamma", "fit|G", "fit", "attention weight; fit: to blocks every rank times first"},
        {"seed", "S", absl::StrCat(o.seed), "the data stream's seed"},
        {"planner", "TARGET", "$KNAPFORMER_PLANNER_ADDRESS",
         "host:port or gRPC target; none: local"},
        {"first-step", "N", absl::StrCat(o.first_step),
         "the first step's number (a resumed run; step N's data is fixed)"},
        {"timeout-seconds", "S", absl::StrCat(o.timeout_seconds), "the whole run's limit"},
        {"plan-ahead", "0|1", absl::StrCat(o.plan_ahead ? 1 : 0),
         "1: prefetch step N+1's plan while step N computes"},
        {"slow-rank", "R:F[:A-B]", "", "rank R at F of its speed (steps A..B)"},
        {"rank-speeds", "MODE", "", "learned or S,S,...: by speed, beside by FLOPs"},
    };
    for (OptionSpec& option : MachineFlagOptions(SimulatedMachine(o.procs, o.layers))) {
      // These two follow other flags rather than a fixed number.
      if (option.name == "gpus-per-node") option.default_value = "--procs";
      if (option.name == "blocks-per-route") option.default_value = "--layers";
      options.push_back(std::move(option));
    }
    return options;
  }();
  return kOptions;
}

std::string Usage() {
  return FormatUsage(
      "train_sim [options]   (bash scripts/knapformer train-sim [options])",
      "Train a small transformer block stack on N CPU processes (Gloo on 127.0.0.1), each\n"
      "step without balancing and with the SequenceBalancer, and print each rank's compute\n"
      "time, the measured and predicted WIR, where each plan came from and the slowest\n"
      "rank's wait for it; check that both runs give the same loss and gradients. The\n"
      "machine flags price auto's communication; their defaults describe these processes\n"
      "(one CPU thread each, float32), not a GPU node (docs/client.md).\n"
      "--data: codes g{G}b{B}i{R}f{F}s{S},... (default " + SimOptions().data + ")\n"
      "or low-res, mixed-res, joint with --procs 32; or a masked stream (video-blockcausal,\n"
      "interleaved, llm-packed): each step is then planned mask-blind and with the masks,\n"
      "attention always masked (block-sparse), and the two plans' slowest ranks compared.",
      Options());
}

// At most this many topologies per run (a fixed-size record per rank and step).
constexpr int kMaxTopologies = 8;

// --slow-rank and --rank-speeds into `o` (its procs and masked set).
absl::Status ParseSpeedOptions(const Args& args, SimOptions& o) {
  if (args.Has("slow-rank")) {
    const std::string text = args.GetString("slow-rank", "");
    const std::vector<std::string> parts = absl::StrSplit(text, ':');
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slow-rank: '", text, "' ", why, " (R:F or R:F:FROM-TO)"));
    };
    if (parts.size() != 2 && parts.size() != 3) return bad("is not");
    if (!absl::SimpleAtoi(parts[0], &o.slow_rank) || o.slow_rank < 0 ||
        o.slow_rank >= o.procs) {
      return bad(absl::StrCat("names no rank of --procs ", o.procs));
    }
    if (!absl::SimpleAtod(parts[1], &o.slow_fraction) || !(o.slow_fraction >= 0.05) ||
        !(o.slow_fraction <= 1)) {
      return bad("has a fraction outside [0.05, 1]");
    }
    if (parts.size() == 3) {
      const std::vector<std::string> range = absl::StrSplit(parts[2], '-');
      if (range.size() != 2 || !absl::SimpleAtoi(range[0], &o.slow_from) ||
          !absl::SimpleAtoi(range[1], &o.slow_to) || o.slow_from < 0 ||
          o.slow_to < o.slow_from) {
        return bad("has no step range FROM-TO with 0 <= FROM <= TO");
      }
    }
  }
  if (!args.Has("rank-speeds")) return absl::OkStatus();
  o.rank_speeds = args.GetString("rank-speeds", "");
  if (o.masked) {
    return absl::InvalidArgumentError(
        "--rank-speeds: not with a masked stream (one comparison per run: by speed against by "
        "FLOPs, or masked against mask-blind)");
  }
  if (o.rank_speeds != "learned") {
    KF_ASSIGN_OR_RETURN(o.declared_speeds,
                        ParseRankSpeeds(o.rank_speeds, o.procs, "--rank-speeds"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SimOptions> ParseOptions(const std::vector<std::string>& argv) {
  KF_ASSIGN_OR_RETURN(Args args, Args::ParseOptions(argv, Options()));
  SimOptions o;
  KF_ASSIGN_OR_RETURN(int64_t procs, args.GetInt("procs", o.procs, 1, 64));
  KF_ASSIGN_OR_RETURN(int64_t steps, args.GetInt("steps", o.steps, 1, 1000));
  KF_ASSIGN_OR_RETURN(int64_t scale, args.GetInt("scale", o.scale, 1, 1 << 20));
  KF_ASSIGN_OR_RETURN(int64_t d_model, args.GetInt("d-model", o.d_model, 1, 4096));
  KF_ASSIGN_OR_RETURN(int64_t heads, args.GetInt("heads", o.heads, 1, 256));
  KF_ASSIGN_OR_RETURN(int64_t layers, args.GetInt("layers", o.layers, 1, 64));
  KF_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 0, 0, int64_t{1} << 62));
  KF_ASSIGN_OR_RETURN(int64_t timeout, args.GetInt("timeout-seconds", o.timeout_seconds, 1, 86400));
  KF_ASSIGN_OR_RETURN(int64_t first_step, args.GetInt("first-step", 0, 0, 1 << 30));
  o.first_step = static_cast<int>(first_step);
  KF_ASSIGN_OR_RETURN(int64_t plan_ahead, args.GetInt("plan-ahead", 0, 0, 1));
  o.plan_ahead = plan_ahead == 1;
  o.fit_gamma = args.GetString("gamma", "fit") == "fit";
  if (!o.fit_gamma) {
    absl::StatusOr<double> gamma = args.GetDouble("gamma", o.gamma);
    if (!gamma.ok() || *gamma < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gamma: '", args.GetString("gamma", ""), "' is neither fit nor a finite number >= 0"));
    }
    o.gamma = *gamma;
  }
  o.procs = static_cast<int>(procs);
  o.steps = static_cast<int>(steps);
  o.scale = static_cast<int>(scale);
  o.d_model = static_cast<int>(d_model);
  o.heads = static_cast<int>(heads);
  o.layers = static_cast<int>(layers);
  o.seed = static_cast<uint64_t>(seed);
  o.timeout_seconds = static_cast<int>(timeout);
  o.topologies = absl::StrSplit(args.GetString("topology", o.topologies.front()), ',');
  o.data = args.GetString("data", o.data);
  const std::string scenario = ScenarioCodes(o.data);
  if (!scenario.empty()) o.data = scenario;
  o.masked = IsMaskedScenario(o.data);
  o.planner = args.GetString("planner", o.planner);
  if (o.d_model % o.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heads: ", o.heads, " heads do not divide --d-model ", o.d_model));
  }
  // Checked here, once, rather than in every worker.
  KF_RETURN_IF_ERROR(SimData::Create(o.data, o.procs, o.seed, o.scale).status());
  KF_ASSIGN_OR_RETURN(o.machine, ParseMachineFlags(args, SimulatedMachine(o.procs, o.layers)));
  KF_RETURN_IF_ERROR(ParseSpeedOptions(args, o));
  // A masked stream balances every step twice per topology: mask-blind and
  // with the masks.
  const size_t max_topologies =
      o.masked || !o.rank_speeds.empty() ? kMaxTopologies / 2 : kMaxTopologies;
  if (o.topologies.size() > max_topologies) {
    return absl::InvalidArgumentError(absl::StrCat("--topology: ", o.topologies.size(),
                                                   " topologies, at most ", max_topologies,
                                                   o.masked                ? " with a masked stream"
                                                   : !o.rank_speeds.empty() ? " with --rank-speeds"
                                                                            : ""));
  }
  for (std::string& spec : o.topologies) {
    // The largest bag this topology may use.
    int max_bag = 1;
    if (AutoLayout::Matches(spec)) {
      auto layout = AutoLayout::Parse(spec);
      if (!layout.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--topology: ", layout.status().message()));
      }
      auto shape = layout->Resolve(o.procs, o.machine);
      if (!shape.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--topology/--procs: ", shape.status().message()));
      }
      spec = layout->SpecOn(*shape);  // as simulate names it
      max_bag = shape->max_bag;
    } else {
      auto topology = Topology::Parse(spec);
      if (!topology.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--topology: ", topology.status().message()));
      }
      auto world = World::Create(*topology, o.procs);
      if (!world.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--topology/--procs: ", world.status().message()));
      }
      spec = topology->spec();
      for (const Bag& bag : topology->bags()) max_bag = std::lcm(max_bag, bag.gpus);
    }
    if (o.heads % max_bag != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--heads: ", o.heads,
                                                     " heads do not split over a bag of ",
                                                     max_bag, " GPUs of --topology ", spec));
    }
  }
  return o;
}

// The calling thread's CPU time in user mode. Kernel time is left out: it is
// page faults (the heap growing to a step's new peak; see
// KeepAllFreedMemory), which a GPU's caching allocator does not pay and
// which fall on whichever rank and topology first needs the memory.
double ThreadUserSeconds() {
  rusage usage;
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6;
}

struct Block {
  at::Tensor w_qkv, w_out, w_up, w_down;
};

std::vector<Block> InitModel(const SimOptions& o) {
  at::manual_seed(o.seed + 1);  // the same weights on every rank
  const double s = 1.0 / std::sqrt(static_cast<double>(o.d_model));
  std::vector<Block> blocks(o.layers);
  for (Block& b : blocks) {
    b.w_qkv = (at::randn({o.d_model, 3 * o.d_model}) * s).requires_grad_(true);
    b.w_out = (at::randn({o.d_model, o.d_model}) * s).requires_grad_(true);
    b.w_up = (at::randn({o.d_model, 4 * o.d_model}) * s).requires_grad_(true);
    b.w_down = (at::randn({4 * o.d_model, o.d_model}) * s * 0.5).requires_grad_(true);
  }
  return blocks;
}

std::vector<at::Tensor> Parameters(const std::vector<Block>& blocks) {
  std::vector<at::Tensor> params;
  for (const Block& b : blocks) params.insert(params.end(), {b.w_qkv, b.w_out, b.w_up, b.w_down});
  return params;
}

// One transformer block's forward on the rows `h` (sequences of
// `attention_lengths` after Ulysses); `balancer` null = no Ulysses.
at::Tensor BlockForward(const SimOptions& o, const Block& b, const at::Tensor& h,
                        const std::vector<int64_t>& attention_lengths,
                        const std::vector<AttentionMask>& attention_masks,
                        const SequenceBalancer* balancer) {
  const int64_t head_dim = o.d_model / o.heads;
  std::vector<at::Tensor> qkv = at::matmul(h, b.w_qkv).reshape({-1, 3, o.heads, head_dim}).unbind(1);
  if (balancer != nullptr) {
    for (at::Tensor& t : qkv) t = balancer->PreAttn(t).value();
  }
  at::Tensor a = VarlenAttention(qkv[0], qkv[1], qkv[2], attention_lengths, attention_masks);
  if (balancer != nullptr) a = balancer->PostAttn(a).value();
  at::Tensor out = h + at::matmul(a.reshape({-1, o.d_model}), b.w_out);
  return out + at::matmul(at::gelu(at::matmul(out, b.w_up)), b.w_down);
}

// Runs one forward and backward; `balancer` null = no balancing. Attention
// uses the masks of `batch` (none for the paper's streams), whichever way
// the step was planned. Returns the loss (this rank's share of the world's
// mean square output).
at::Tensor Step(const SimOptions& o, const std::vector<Block>& blocks, const at::Tensor& x,
                const SimData::Batch& batch, int rank, int64_t world_tokens,
                const SequenceBalancer* balancer) {
  at::Tensor h = balancer != nullptr ? balancer->Route(x).value() : x;
  const std::vector<int64_t>& attention_lengths =
      balancer != nullptr ? balancer->attention_lengths() : batch.lengths[rank];
  std::vector<AttentionMask> attention_masks;
  if (!batch.masks.empty()) {
    attention_masks = balancer == nullptr ? batch.masks[rank]
                      : !balancer->attention_masks().empty()
                          ? balancer->attention_masks()
                          : HeldMasks(balancer->step_plan().plan, batch.masks);
  }
  for (const Block& b : blocks) {
    h = BlockForward(o, b, h, attention_lengths, attention_masks, balancer);
  }
  at::Tensor out = balancer != nullptr ? balancer->ReverseRoute(h).value() : h;
  at::Tensor loss = (out * out).sum() / static_cast<double>(world_tokens * o.d_model);
  torch::autograd::backward({loss});
  return loss.detach();
}

// The world's summed gradients, flattened; and clears them.
at::Tensor TakeGradients(const std::vector<Block>& blocks, c10d::ProcessGroup& group) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& p : Parameters(blocks)) {
    flat.push_back(p.grad().reshape({-1}).clone());
    p.mutable_grad().zero_();
  }
  std::vector<at::Tensor> all = {at::cat(flat)};
  group.allreduce(all)->wait();
  return all[0];
}

// One block's forward and backward on one sequence of `length` tokens:
// thread user CPU seconds, the least of `repeats` runs (the others were slowed by
// the processes sharing its core).
double TimeBlock(const SimOptions& o, const Block& block, int64_t length, int repeats) {
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < repeats; ++r) {
    at::Tensor x = at::randn({length, o.d_model}).requires_grad_(true);
    const double start = ThreadUserSeconds();
    at::Tensor h = BlockForward(o, block, x, {length}, {}, nullptr);
    torch::autograd::backward({(h * h).sum()});
    best = std::min(best, ThreadUserSeconds() - start);
  }
  for (const at::Tensor& p : {block.w_qkv, block.w_out, block.w_up, block.w_down}) {
    p.mutable_grad().zero_();
  }
  return best;
}

// --gamma fit: every rank times one block at the same lengths (from the
// shortest to the longest sequence of the first step's world batch) while
// the others do the same, as in the run; the cost model's k and gamma are
// fitted to all ranks' times (planner/calibration.h), so every rank gets the
// same fit from the same samples.
absl::StatusOr<CostFit> FitGamma(const SimOptions& o, const Block& block,
                                 const std::vector<int64_t>& world_lengths,
                                 Transport& transport) {
  if (world_lengths.empty()) return absl::InvalidArgumentError("no sequences to time");
  const auto [shortest, longest] =
      std::minmax_element(world_lengths.begin(), world_lengths.end());
  const double low = static_cast<double>(std::max<int64_t>(8, *shortest));
  const double high = std::max(2 * low, static_cast<double>(*longest));
  constexpr int kLengths = 6;
  std::vector<int64_t> lengths;
  for (int i = 0; i < kLengths; ++i) {
    lengths.push_back(std::llround(low * std::pow(high / low, i / (kLengths - 1.0))));
  }
  TimeBlock(o, block, lengths.back(), 1);  // grows the heap to its size once
  tools::BlockTimings mine;
  for (int64_t length : lengths) mine.add_seconds(TimeBlock(o, block, length, 3));
  KF_ASSIGN_OR_RETURN(std::vector<tools::BlockTimings> all, AllGatherMessages(transport, mine));
  std::vector<WorkSample> samples;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].seconds_size() != static_cast<int>(lengths.size())) {
      return absl::InternalError(absl::StrCat("--gamma fit: rank ", r, " sent ",
                                              all[r].seconds_size(), " timings, not ",
                                              lengths.size()));
    }
    for (size_t i = 0; i < lengths.size(); ++i) {
      samples.push_back(SequenceSample(lengths[i], o.d_model, all[r].seconds(i)));
    }
  }
  return FitCostModel(samples);
}

double Mean(const std::vector<double>& values) {
  return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / values.size();
}

// Rank 0's sums over the counted steps, per topology.
struct TopologySummary {
  double sum_max = 0, sum_wir = 0;
  std::vector<double> plan_waits, service_waits, computes;  // the slowest rank's, per step
  // With --rank-speeds: every step's slowest rank over the ideal (the
  // total work at speed 1 over the total speed), warm-up included.
  std::vector<double> over_ideal;
};

int RunWorker(const SimOptions& o) {
  at::set_num_threads(1);  // thread user CPU time = this rank's compute
  SetLogLevel(LogLevel::kWarning);
  // Page faults are not compute (malloc_policy.h says how much they were).
  if (absl::Status kept = KeepAllFreedMemory(); !kept.ok()) {
    std::cerr << kept << "\n";
    return 1;
  }
  auto world = JoinLocalWorld(std::chrono::seconds(o.timeout_seconds));
  if (!world.ok()) {
    std::cerr << world.status() << "\n";
    return 1;
  }
  const int rank = world->rank;
  c10d::ProcessGroup* group = world->group.get();
  Transport* transport = world->transport.get();

  // ParseOptions checked it.
  const SimData sim = *SimData::Create(o.data, o.procs, o.seed, o.scale);
  std::vector<Block> blocks = InitModel(o);
  double gamma = o.gamma;
  std::string gamma_source = "--gamma";
  if (o.fit_gamma) {
    std::vector<int64_t> world_lengths;
    for (const auto& rank_lengths : sim.At(o.first_step).lengths) {
      for (int64_t l : rank_lengths) world_lengths.push_back(l);
    }
    absl::StatusOr<CostFit> fit = FitGamma(o, blocks.front(), world_lengths, *transport);
    if (fit.ok()) {
      gamma = fit->gamma;
      gamma_source = absl::StrFormat(
          "fitted to %d timed blocks (r^2 %.3f; k = %.3g s per unit, so --tflops %.3g would "
          "price communication as this CPU computes forward and backward)",
          fit->samples, fit->r_squared, fit->k, 2e-12 / fit->k);
    } else if (!absl::IsInvalidArgument(fit.status()) &&
               !absl::IsFailedPrecondition(fit.status())) {  // the exchange failed
      std::cerr << "rank " << rank << ": " << fit.status() << "\n";
      return 1;
    } else {  // the times did not follow the model (noise at tiny lengths)
      gamma_source = absl::StrCat("the default: no fit (", fit.status().message(), ")");
    }
  }
  SequenceBalancerOptions balancer_options;
  balancer_options.job_id = "train-sim";
  balancer_options.d_model = o.d_model;
  balancer_options.gamma = gamma;
  balancer_options.token_bytes = o.d_model * sizeof(float);
  balancer_options.first_step = static_cast<uint64_t>(o.first_step);
  balancer_options.machine = o.machine;
  // The deployment's environment (deploy/k8s), then --planner over it.
  absl::Status environment = ApplyClientEnvironment(
      &balancer_options.planner, &balancer_options.job_id, &balancer_options.group_id);
  if (!environment.ok()) {
    std::cerr << environment << "\n";
    return 2;
  }
  if (o.planner == "none") {  // local planning, whatever the environment names
    balancer_options.planner.address.clear();
  } else if (!o.planner.empty()) {
    balancer_options.planner.address = o.planner;
  }
  // Every step is balanced once per variant: per topology, and with a
  // masked stream twice, mask-blind then with the masks.
  // With --rank-speeds twice, by FLOPs then by speed.
  struct Variant {
    int topology;
    bool masks;
    std::string name;  // a row's label beside its topology
    bool by_speed = false;
  };
  std::vector<Variant> variants;
  for (int t = 0; t < static_cast<int>(o.topologies.size()); ++t) {
    if (o.masked) {
      variants.push_back({t, false, "mask-blind"});
      variants.push_back({t, true, "masked"});
    } else if (!o.rank_speeds.empty()) {
      variants.push_back({t, false, "by FLOPs"});
      variants.push_back({t, false, "by speed", true});
    } else {
      variants.push_back({t, false, "balanced"});
    }
  }
  const int kinds = static_cast<int>(variants.size());
  // One balancer per variant, each its own job at the planner.
  std::vector<std::unique_ptr<SequenceBalancer>> balancers;
  for (int t = 0; t < kinds; ++t) {
    SequenceBalancerOptions options = balancer_options;
    options.topology = o.topologies[variants[t].topology];
    if (kinds > 1) options.job_id = absl::StrCat(balancer_options.job_id, "-", t);
    if (variants[t].by_speed) {
      options.planner.balancer.rank_speeds = o.declared_speeds;
      options.planner.learn_rank_speeds = o.declared_speeds.empty();
    }
    auto balancer = SequenceBalancer::Create(options, transport);
    if (!balancer.ok()) {
      std::cerr << "rank " << rank << ": " << balancer.status() << "\n";
      return 2;
    }
    balancers.push_back(*std::move(balancer));
  }

  if (rank == 0) {
    std::cout << "train-sim: " << o.procs << " processes, topology "
              << absl::StrJoin(o.topologies, ", ") << ", data "
              << o.data << " (lengths / " << o.scale << "), d_model " << o.d_model << ", "
              << o.heads << " heads, " << o.layers << " layers, "
              << absl::StrFormat("gamma %.3g ", gamma) << gamma_source << ", "
              << (balancer_options.planner.address.empty()
                      ? "local planning"
                      : "planner service " + balancer_options.planner.address)
              << (o.plan_ahead ? ", planning one step ahead" : "")
              << "\ncompute = forward + backward user CPU seconds of each rank (one thread); "
                 "WIR = max/min over ranks\n\n";
    std::cout << absl::StrFormat("%-5s %-10s %-28s %-7s %-9s %s\n", "step", "mode",
                                 "per-rank compute (ms)", "WIR", "max (ms)",
                                 "planned max/mean");
  }
  double sum_max_unbalanced = 0, sum_wir_unbalanced = 0;
  double worst_loss = 0, worst_gradient = 0;
  int counted = 0;
  std::vector<TopologySummary> summaries(kinds);
  // This rank's masks of a batch for a variant: none when it plans blind.
  auto masks_for = [&](const Variant& variant, const SimData::Batch& batch) {
    return variant.masks ? batch.masks[rank] : std::vector<AttentionMask>();
  };
  const int end_step = o.first_step + o.steps;
  std::optional<SimData::Batch> next_batch;
  for (int step = o.first_step; step < end_step; ++step) {
    const SimData::Batch batch = next_batch.has_value() ? *std::move(next_batch) : sim.At(step);
    next_batch.reset();
    if (o.plan_ahead && step + 1 < end_step) next_batch = sim.At(step + 1);
    const std::vector<int64_t>& lengths = batch.lengths[rank];
    int64_t world_tokens = 0;
    for (const auto& rank_lengths : batch.lengths) {
      for (int64_t l : rank_lengths) world_tokens += l;
    }
    int64_t tokens = 0;
    for (int64_t l : lengths) tokens += l;
    at::manual_seed(o.seed * 1000003 + step * 1009 + rank);
    at::Tensor x = at::randn({tokens, o.d_model});

    // This rank's speed: its times are a GPU's at that speed.
    const double speed = o.SpeedAt(rank, step);
    double start = ThreadUserSeconds();
    at::Tensor loss_unbalanced = Step(o, blocks, x, batch, rank, world_tokens, nullptr);
    tools::RankStep mine;
    mine.set_unbalanced_seconds((ThreadUserSeconds() - start) / speed);
    at::Tensor grad_unbalanced = TakeGradients(blocks, *group);

    at::Tensor grad_balanced;
    for (int t = 0; t < kinds; ++t) {
      SequenceBalancer& balancer = *balancers[t];
      tools::BalancedStep& result = *mine.add_balanced();
      start = ThreadUserSeconds();
      absl::Status planned = balancer.PlanRouting(lengths, {}, masks_for(variants[t], batch));
      if (planned.ok() && next_batch.has_value()) {
        // The next batch is known now; its plan is asked for while this one computes.
        planned = balancer.PrefetchRouting(next_batch->lengths[rank], {},
                                           masks_for(variants[t], *next_batch));
      }
      if (!planned.ok()) {
        std::cerr << "rank " << rank << ": step " << step << ": " << planned << "\n";
        return 1;
      }
      at::Tensor loss_balanced = Step(o, blocks, x, batch, rank, world_tokens, &balancer);
      result.set_seconds((ThreadUserSeconds() - start) / speed);
      if (variants[t].by_speed) balancer.RecordComputeSeconds(result.seconds());
      grad_balanced = TakeGradients(blocks, *group);
      result.set_plan_wait_seconds(balancer.step_plan().wait_seconds);
      result.set_service_wait_seconds(balancer.step_plan().service_wait_seconds);
      result.set_loss_difference(
          std::abs(loss_balanced.item<double>() - loss_unbalanced.item<double>()) /
          std::max(1e-30, std::abs(loss_unbalanced.item<double>())));
      result.set_gradient_difference(((grad_balanced - grad_unbalanced).abs().max() /
                                      grad_unbalanced.abs().max().clamp_min(1e-30))
                                         .item<double>());
    }
    {  // SGD on the (identical) gradients, so the model trains
      at::NoGradGuard no_grad;
      int64_t offset = 0;
      for (const at::Tensor& p : Parameters(blocks)) {
        p.sub_(grad_balanced.narrow(0, offset, p.numel()).view_as(p) * (0.1 / o.procs));
        offset += p.numel();
      }
    }

    absl::StatusOr<std::vector<tools::RankStep>> all = AllGatherMessages(*transport, mine);
    for (int r = 0; all.ok() && r < static_cast<int>(all->size()); ++r) {
      if ((*all)[r].balanced_size() != kinds) {
        all = absl::InternalError(absl::StrCat("rank ", r, " reported ",
                                               (*all)[r].balanced_size(), " topologies, not ",
                                               kinds));
      }
    }
    if (!all.ok()) {
      std::cerr << "rank " << rank << ": " << all.status() << "\n";
      return 1;
    }
    if (rank != 0) continue;
    const std::vector<tools::RankStep>& ranks = *all;
    double max_u = 0, min_u = 1e30;
    std::vector<std::string> u_ms;
    for (const tools::RankStep& s : ranks) {
      max_u = std::max(max_u, s.unbalanced_seconds());
      min_u = std::min(min_u, s.unbalanced_seconds());
      u_ms.push_back(absl::StrFormat("%.0f", s.unbalanced_seconds() * 1e3));
    }
    std::cout << absl::StrFormat("%-5d %-10s %-28s %-7.2f %-9.0f %s\n", step, "unbalanced",
                                 absl::StrJoin(u_ms, " "), max_u / min_u, max_u * 1e3,
                                 absl::StrFormat("%.3f",
                                                 balancers[0]->step_plan().max_over_mean_before));
    // step 0 warms up allocators and Gloo pairs
    const bool count = step > o.first_step || o.steps == 1;
    if (count) {
      sum_max_unbalanced += max_u;
      sum_wir_unbalanced += max_u / min_u;
      ++counted;
    }
    for (int t = 0; t < kinds; ++t) {
      double max_b = 0, min_b = 1e30, max_plan = 0, max_service = 0;
      double work = 0, total_speed = 0;  // at speed 1, for the ideal
      std::vector<std::string> b_ms;
      for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
        const tools::RankStep& s = ranks[r];
        const tools::BalancedStep& b = s.balanced(t);
        work += b.seconds() * o.SpeedAt(r, step);
        total_speed += o.SpeedAt(r, step);
        max_b = std::max(max_b, b.seconds());
        min_b = std::min(min_b, b.seconds());
        max_plan = std::max(max_plan, b.plan_wait_seconds());
        max_service = std::max(max_service, b.service_wait_seconds());
        b_ms.push_back(absl::StrFormat("%.0f", b.seconds() * 1e3));
        worst_loss = std::max(worst_loss, b.loss_difference());
        worst_gradient = std::max(worst_gradient, b.gradient_difference());
      }
      const StepPlan& plan = balancers[t]->step_plan();
      // With several topologies, each row names its own (auto: the layout it chose).
      const std::string& topology = o.topologies[variants[t].topology];
      const std::string which =
          o.topologies.size() == 1
              ? ""
              : absl::StrCat(" ", topology,
                             AutoLayout::Matches(topology) ? absl::StrCat(" -> ", plan.layout)
                                                           : "");
      const double over_ideal = max_b / (work / total_speed);
      // With speeds: how far the slowest rank is from the ideal, and the
      // speeds the step was planned by.
      std::string ideal_note;
      if (!o.rank_speeds.empty()) {
        ideal_note = absl::StrFormat("; %.2fx the ideal", over_ideal);
        if (!plan.rank_speeds.empty()) {
          absl::StrAppend(&ideal_note, "; ", SpeedsText(plan.rank_speeds));
        }
      }
      std::cout << absl::StrFormat("%-5s %-10s %-28s %-7.2f %-9.0f %s (%s%s, waited %.2f ms)%s%s\n",
                                   "", variants[t].name, absl::StrJoin(b_ms, " "), max_b / min_b,
                                   max_b * 1e3, absl::StrFormat("%.3f", plan.max_over_mean_after),
                                   PlanSourceName(plan.source), plan.prefetched ? ", ahead" : "",
                                   max_plan * 1e3, which, ideal_note);
      summaries[t].over_ideal.push_back(over_ideal);
      if (count) {
        TopologySummary& summary = summaries[t];
        summary.sum_max += max_b;
        summary.sum_wir += max_b / min_b;
        summary.plan_waits.push_back(max_plan);
        summary.service_waits.push_back(max_service);
        summary.computes.push_back(max_b);
      }
    }
    std::cout.flush();  // a test follows the run step by step
  }
  if (rank == 0) {
    const std::string steps =
        o.steps > 1 ? absl::StrCat(o.first_step + 1, "..", o.first_step + o.steps - 1)
                    : std::to_string(o.first_step);
    for (int t = 0; t < kinds; ++t) {
      const TopologySummary& summary = summaries[t];
      const std::string which =
          kinds == 1 ? ""
          : o.masked ? absl::StrCat(" [", o.topologies[variants[t].topology], " ",
                                    variants[t].name, "]")
                     : absl::StrCat(" [", o.topologies[variants[t].topology], "]");
      std::cout << absl::StrFormat(
          "\nmean over steps %s%s: max per-rank compute %.0f ms unbalanced, %.0f ms balanced "
          "(%.2fx); WIR %.2f -> %.2f\n",
          steps, which, sum_max_unbalanced / counted * 1e3, summary.sum_max / counted * 1e3,
          sum_max_unbalanced / summary.sum_max, sum_wir_unbalanced / counted,
          summary.sum_wir / counted);
      std::cout << absl::StrFormat(
          "waiting for the plan (slowest rank): p50 %.2f ms, p99 %.2f ms; balanced step compute "
          "p50 %.0f ms%s\n",
          Percentile(summary.plan_waits, 0.5) * 1e3, Percentile(summary.plan_waits, 0.99) * 1e3,
          Percentile(summary.computes, 0.5) * 1e3,
          o.plan_ahead ? " (planning one step ahead)" : "");
      if (!balancer_options.planner.address.empty()) {
        std::cout << absl::StrFormat(
            "of which blocked on the service's answer: p50 %.2f ms, p99 %.2f ms; the rest is "
            "the collectives that agree on the plan\n",
            Percentile(summary.service_waits, 0.5) * 1e3,
            Percentile(summary.service_waits, 0.99) * 1e3);
      }
    }
    // auto against the best fixed topology measured in this run (with a
    // masked stream, their plans made with the masks).
    auto topology_of = [&](int t) -> const std::string& {
      return o.topologies[variants[t].topology];
    };
    int best_fixed = -1;
    for (int t = 0; t < kinds; ++t) {
      if (AutoLayout::Matches(topology_of(t)) || variants[t].masks != o.masked) continue;
      if (best_fixed < 0 || summaries[t].sum_max < summaries[best_fixed].sum_max) best_fixed = t;
    }
    for (int t = 0; t < kinds && best_fixed >= 0; ++t) {
      if (!AutoLayout::Matches(topology_of(t)) || variants[t].masks != o.masked) continue;
      std::cout << absl::StrFormat(
          "%s vs the best fixed topology %s: max per-rank compute %.0f ms vs %.0f ms "
          "(%.3fx)\n",
          topology_of(t), topology_of(best_fixed), summaries[t].sum_max / counted * 1e3,
          summaries[best_fixed].sum_max / counted * 1e3,
          summaries[t].sum_max / summaries[best_fixed].sum_max);
    }
    // By speed against by FLOPs: the same weights and tokens, only the plan
    // differs; the steps' slowest ranks over the ideal, from the first.
    for (int t = 0; t + 1 < kinds && !o.rank_speeds.empty(); t += 2) {
      std::cout << absl::StrFormat(
          "by speed vs by FLOPs [%s]: max per-rank compute %.0f ms vs %.0f ms (%.3fx); "
          "slowest rank over the ideal %.3f vs %.3f\n",
          topology_of(t), summaries[t + 1].sum_max / counted * 1e3,
          summaries[t].sum_max / counted * 1e3, summaries[t].sum_max / summaries[t + 1].sum_max,
          Mean(summaries[t + 1].over_ideal), Mean(summaries[t].over_ideal));
      std::vector<std::string> by_step;
      for (double v : summaries[t + 1].over_ideal) by_step.push_back(absl::StrFormat("%.2f", v));
      std::cout << "by speed, slowest rank over the ideal per step: " << absl::StrJoin(by_step, " ")
                << "\n";
      // The two phases: a slow rank learned (from its 10th step
      // slow), and the same rank recovered (from the 10th step after).
      // In 64 bits: slow_to is INT_MAX without a range.
      auto phase = [&](int variant, int64_t from, int64_t to) {
        std::vector<double> values;
        for (int64_t step = std::max<int64_t>(from, o.first_step); step <= to && step < end_step;
             ++step) {
          values.push_back(summaries[variant].over_ideal[step - o.first_step]);
        }
        return values;
      };
      constexpr int64_t kSettle = 10;
      if (o.slow_rank >= 0) {
        const int64_t settled = int64_t{o.slow_from} + kSettle;
        const std::vector<double> slow_speed = phase(t + 1, settled, o.slow_to);
        const std::vector<double> slow_flops = phase(t, settled, o.slow_to);
        if (!slow_speed.empty()) {
          std::cout << absl::StrFormat(
              "rank %d at %.2f, steps %d..%d: slowest rank over the ideal %.3f by speed, %.3f by "
              "FLOPs (%.2fx faster)\n",
              o.slow_rank, o.slow_fraction, std::max<int64_t>(settled, o.first_step),
              std::min(o.slow_to, end_step - 1), Mean(slow_speed), Mean(slow_flops),
              Mean(slow_flops) / Mean(slow_speed));
        }
        const int64_t recovered = int64_t{o.slow_to} + kSettle;
        const std::vector<double> back_speed = phase(t + 1, recovered, end_step);
        const std::vector<double> back_flops = phase(t, recovered, end_step);
        if (!back_speed.empty()) {
          std::cout << absl::StrFormat(
              "recovered, steps %d..%d: slowest rank over the ideal %.3f by speed, %.3f by FLOPs "
              "(%.3fx)\n",
              recovered, end_step - 1, Mean(back_speed), Mean(back_flops),
              Mean(back_speed) / Mean(back_flops));
        }
      }
    }
    // Planned with the masks against planned blind: the same attention, the
    // same weights and tokens, only the plan differs.
    for (int t = 0; t + 1 < kinds && o.masked; t += 2) {
      std::cout << absl::StrFormat(
          "masked vs mask-blind [%s]: max per-rank compute %.0f ms vs %.0f ms (%.3fx); WIR "
          "%.2f vs %.2f\n",
          topology_of(t), summaries[t + 1].sum_max / counted * 1e3,
          summaries[t].sum_max / counted * 1e3, summaries[t + 1].sum_max / summaries[t].sum_max,
          summaries[t + 1].sum_wir / counted, summaries[t].sum_wir / counted);
    }
    std::cout << absl::StrFormat(
        "balanced vs unbalanced: largest relative loss difference %.2e, gradient %.2e\n",
        worst_loss, worst_gradient);
    // float32 sums in a different order differ by rounding only.
    if (worst_loss > 1e-4 || worst_gradient > 1e-3) {
      std::cout << "FAILED: balancing changed the loss or the gradients\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if ((!args.empty() && args[0] == "help") || knapformer::Args::WantsHelp(args)) {
    std::cout << knapformer::Usage();
    return 0;
  }
  auto options = knapformer::ParseOptions(args);
  if (!options.ok()) {
    // One line, as the planner CLI's errors: the usage is a --help away.
    std::cerr << "train-sim: " << options.status().message() << "\n";
    return 2;
  }
  return knapformer::RunAsLocalWorld("train-sim", options->procs, args,
                                     absl::Seconds(options->timeout_seconds),
                                     [&] { return knapformer::RunWorker(*options); });
}
