// Planning time and peak heap of BalanceGreedy at 32 to 4096 ranks.
//
// Figures only, nothing is asserted. Every case plans one replica spanning the
// whole world (world_size == group size) with 16 mixed-resolution sequences per
// rank, with the defaults, without locality, and as the paper's greedy exactly
// (GreedyRule::kLeastOccupied, refine_rounds = 0, no locality), so the price
// of each phase is visible side by side.
//
// Counters (measured on one extra, untimed call per case):
//   peak_heap_MB  highest live heap above the level before the call, MiB
//   plan_MB       bytes owned by the returned Plan (capacities), MiB
//   chunks        chunks in the plan
//
//   bazel run -c opt //bench:planner_bench [-- --malloc=retain|default]
//
// --malloc=retain (default) runs with the malloc settings of `knapformer
// serve` (common/malloc_policy.h: freed memory stays for the next plan);
// --malloc=default with glibc's own, where the pages of a plan may go back
// to the kernel after every call and fault in again on the next.

#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <utility>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "planner/auto_layout.h"
#include "planner/balancer.h"
#include "planner/data_stream.h"
#include "planner/machine.h"
#include "planner/cost_model.h"
#include "planner/splitmix64.h"
#include "planner/topology.h"
#include "common/malloc_policy.h"

// ---------------------------------------------------------------------------
// Heap accounting. Replacing the global allocation functions is the only way
// to see the planner's transient allocations without instrumenting it. Sizes
// come from malloc_usable_size rather than a header in front of each block, so
// that plain, sized and aligned forms share one bookkeeping and a block freed
// through any delete overload is debited exactly what it was credited.

namespace {

std::atomic<int64_t> live_bytes{0};
std::atomic<int64_t> peak_bytes{0};

void Credit(void* p) {
  if (p == nullptr) return;
  const int64_t size = static_cast<int64_t>(malloc_usable_size(p));
  const int64_t now = live_bytes.fetch_add(size, std::memory_order_relaxed) + size;
  int64_t peak = peak_bytes.load(std::memory_order_relaxed);
  while (now > peak &&
         !peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void Debit(void* p) {
  if (p == nullptr) return;
  live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)),
                       std::memory_order_relaxed);
}

void* Allocate(std::size_t size) {
  // malloc(0) may return nullptr; operator new must not.
  void* p = std::malloc(size == 0 ? 1 : size);
  Credit(p);
  return p;
}

void* AllocateAligned(std::size_t size, std::align_val_t align) {
  void* p = nullptr;
  const std::size_t alignment =
      std::max(static_cast<std::size_t>(align), sizeof(void*));
  if (posix_memalign(&p, alignment, size == 0 ? 1 : size) != 0) return nullptr;
  Credit(p);
  return p;
}

void Release(void* p) {
  Debit(p);
  std::free(p);
}

}  // namespace

void* operator new(std::size_t size) {
  void* p = Allocate(size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t size) {
  void* p = Allocate(size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return Allocate(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
  return Allocate(size);
}
void* operator new(std::size_t size, std::align_val_t align) {
  void* p = AllocateAligned(size, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t size, std::align_val_t align) {
  void* p = AllocateAligned(size, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new(std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  return AllocateAligned(size, align);
}
void* operator new[](std::size_t size, std::align_val_t align, const std::nothrow_t&) noexcept {
  return AllocateAligned(size, align);
}

void operator delete(void* p) noexcept { Release(p); }
void operator delete[](void* p) noexcept { Release(p); }
void operator delete(void* p, std::size_t) noexcept { Release(p); }
void operator delete[](void* p, std::size_t) noexcept { Release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { Release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { Release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { Release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  Release(p);
}

// ---------------------------------------------------------------------------

namespace knapformer {
namespace {

constexpr int64_t kSequencesPerRank = 16;
constexpr int64_t kDModel = 3072;
constexpr double kGamma = 0.49;
constexpr uint64_t kSeed = 0x6b6e6170666f726dULL;  // "knapform"
// Short enough for the whole run to stay well under a minute on 2 cores.
// Passed as a default flag rather than MinTime() so it does not end up in the
// benchmark names; a --benchmark_min_time given on the command line wins.
constexpr char kDefaultMinTimeFlag[] = "--benchmark_min_time=0.2";
constexpr double kMiB = 1024.0 * 1024.0;

constexpr int64_t kRankCounts[] = {32, 256, 1024, 4096};
// Where the default planner also runs under a binding token cap.
constexpr int64_t kCappedRanks = 4096;
// The default; without locality; the paper's greedy (its rule, no
// refinement, no locality).
// const, not constexpr: BalancerOptions holds a vector (rank_speeds).
struct Variant {
  GreedyRule greedy;
  int32_t refine_rounds;
  bool locality;
};
const Variant kVariants[] = {
    {BalancerOptions().greedy, BalancerOptions().refine_rounds, true},
    {BalancerOptions().greedy, BalancerOptions().refine_rounds, false},
    {GreedyRule::kLeastOccupied, 0, false},
};

// Visual token counts of the four resolutions a mixed-resolution batch draws
// from (256^2 .. 2048^2 pixels at 16x16 patches).
constexpr int64_t kVisualTokens[] = {256, 1024, 4096, 16384};
constexpr int64_t kMaxTextTokens = 392;

RankLengths MixedResolutionLengths(int64_t ranks) {
  SplitMix64 rng(kSeed);
  RankLengths lengths(ranks);
  for (auto& rank : lengths) {
    rank.reserve(kSequencesPerRank);
    for (int64_t i = 0; i < kSequencesPerRank; ++i) {
      const int64_t visual = kVisualTokens[rng.Below(std::size(kVisualTokens))];
      const double aspect = 0.96 + 0.08 * rng.Uniform();
      const int64_t text = static_cast<int64_t>(rng.Below(kMaxTextTokens + 1));
      rank.push_back(static_cast<int64_t>(static_cast<double>(visual) * aspect) + text);
    }
  }
  return lengths;
}

// The three topology families at n ranks, named by their shape so the output
// lines stay comparable across sizes; the exact spec goes in the label.
struct Family {
  const char* name;
  std::string (*spec)(int64_t n);
};

const Family kFamilies[] = {
    {"g1nN", [](int64_t n) { return absl::StrCat("g1n", n); }},
    {"mixed",
     [](int64_t n) { return absl::StrCat("g1n", n / 4, "+g2n", n / 8, "+g4n", n / 8); }},
    {"g8nN", [](int64_t n) { return absl::StrCat("g8n", n / 8); }},
};

// Everything a case needs, built once at registration so neither the timed
// loop nor the memory probe pays for input generation.
struct Case {
  World world;
  CostModel cost;
  RankLengths lengths;
  BalancerOptions options;
  std::string label;
};

double PlanBytes(const Plan& plan) {
  auto bytes = [](const auto& v) {
    using Element = typename std::decay_t<decltype(v)>::value_type;
    return static_cast<double>(v.capacity() * sizeof(Element));
  };
  return static_cast<double>(sizeof(Plan)) + static_cast<double>(plan.topology.capacity()) +
         bytes(plan.sequences) + bytes(plan.chunks) + bytes(plan.workload_before) +
         bytes(plan.workload_after) + bytes(plan.rank_first_sequence) +
         bytes(plan.bag_sequences) +
         bytes(plan.bag_begin) + bytes(plan.bag_first_rank) + bytes(plan.bag_gpus);
}

void BM_Plan(benchmark::State& state, const Case* c) {
  for (auto _ : state) {
    absl::StatusOr<Plan> plan = BalanceGreedy(c->world, c->cost, c->lengths, c->options);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(plan);
  }

  // Measured outside the timed loop: the probe's atomics would otherwise
  // inflate the timings. The baseline excludes the input and whatever the
  // benchmark library holds.
  const int64_t baseline = live_bytes.load(std::memory_order_relaxed);
  peak_bytes.store(baseline, std::memory_order_relaxed);
  absl::StatusOr<Plan> plan = BalanceGreedy(c->world, c->cost, c->lengths, c->options);
  const int64_t peak = peak_bytes.load(std::memory_order_relaxed) - baseline;
  if (!plan.ok()) {
    state.SkipWithError(std::string(plan.status().message()).c_str());
    return;
  }
  state.counters["peak_heap_MB"] = static_cast<double>(peak) / kMiB;
  state.counters["plan_MB"] = PlanBytes(*plan) / kMiB;
  state.counters["chunks"] = static_cast<double>(plan->chunks.size());
  state.counters["moved_pct"] =
      100.0 * static_cast<double>(plan->MovedTokens()) / static_cast<double>(plan->TotalTokens());
  state.SetLabel(c->label);
}

// The auto layout (planner/auto_layout.h): one group of every rank, or
// groups of 32; 8 GPUs per node, the default machine.
struct AutoCase {
  AutoLayout layout;
  int64_t ranks;
  CostModel cost;
  CommPrices prices;
  RankLengths lengths;
};

void BM_PlanAuto(benchmark::State& state, const AutoCase* c) {
  for (auto _ : state) {
    absl::StatusOr<AutoPlan> plan =
        BalanceAuto(c->layout, c->ranks, c->cost, c->prices, c->lengths);
    if (!plan.ok()) {
      state.SkipWithError(std::string(plan.status().message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(plan);
  }
  absl::StatusOr<AutoPlan> plan = BalanceAuto(c->layout, c->ranks, c->cost, c->prices, c->lengths);
  if (!plan.ok()) return;
  state.counters["candidates"] = plan->candidates;
  state.counters["solved"] = plan->solved;
  state.counters["chunks"] = static_cast<double>(plan->plan.chunks.size());
  const std::string& chosen = plan->plan.topology;
  state.SetLabel(absl::StrCat(c->layout.spec(), " -> ",
                              chosen.size() > 40 ? chosen.substr(0, 40) + "..." : chosen));
}

// Registers every (family, ranks, variant) case; the cases live until exit.
bool RegisterAll(std::vector<std::unique_ptr<Case>>& cases) {
  absl::StatusOr<CostModel> cost = CostModel::Create(kDModel, kGamma);
  if (!cost.ok()) {
    std::fprintf(stderr, "cost model: %s\n", std::string(cost.status().message()).c_str());
    return false;
  }
  for (const Family& family : kFamilies) {
    for (const int64_t ranks : kRankCounts) {
      const std::string spec = family.spec(ranks);
      absl::StatusOr<Topology> topology = Topology::Parse(spec);
      if (!topology.ok()) {
        std::fprintf(stderr, "%s: %s\n", spec.c_str(),
                     std::string(topology.status().message()).c_str());
        return false;
      }
      absl::StatusOr<World> world = World::Create(*topology, ranks);
      if (!world.ok()) {
        std::fprintf(stderr, "%s: %s\n", spec.c_str(),
                     std::string(world.status().message()).c_str());
        return false;
      }
      const RankLengths lengths = MixedResolutionLengths(ranks);
      if (ranks == kCappedRanks) {
        // A binding token cap: a fifth of the way from the tokens every GPU
        // would hold if spread evenly (no cap below can be met) up to the
        // uncapped plan's most loaded GPU.
        absl::StatusOr<Plan> free = BalanceGreedy(*world, *cost, lengths);
        if (!free.ok()) {
          std::fprintf(stderr, "%s: %s\n", spec.c_str(),
                       std::string(free.status().message()).c_str());
          return false;
        }
        const std::vector<int64_t> tokens = free->TokensPerRank();
        const int64_t peak = *std::max_element(tokens.begin(), tokens.end());
        const int64_t floor = (free->TotalTokens() + ranks - 1) / ranks;
        BalancerOptions options;
        options.max_tokens_per_gpu = floor + (peak - floor) / 5;
        cases.push_back(std::make_unique<Case>(Case{
            *world, *cost, lengths, options,
            absl::StrCat(topology->spec(), " cap ", options.max_tokens_per_gpu, " (uncapped peak ",
                         peak, ", even ", floor, ")")}));
        benchmark::RegisterBenchmark(absl::StrCat("BM_PlanCapped/", family.name).c_str(),
                                     BM_Plan, cases.back().get())
            ->Arg(ranks)
            ->Unit(benchmark::kMicrosecond);
      }
      for (const auto& [greedy, refine, locality] : kVariants) {
        BalancerOptions options;
        options.greedy = greedy;
        options.refine_rounds = refine;
        options.locality = locality;
        cases.push_back(std::make_unique<Case>(
            Case{*world, *cost, lengths, options, topology->spec()}));
        benchmark::RegisterBenchmark(absl::StrCat("BM_Plan/", family.name).c_str(), BM_Plan,
                                     cases.back().get())
            ->Args({ranks, refine, locality})
            ->ArgNames({"", "refine", "locality"})
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  static std::vector<std::unique_ptr<AutoCase>> auto_cases;
  const CommPrices prices = *CommPrices::Create(Machine(), *cost);
  // This file's mixed resolutions, and the paper's joint image and video
  // scenario (which needs 4- and 8-GPU bags) repeated over the ranks, with
  // a fixed g4 layout on the same joint data as the baseline.
  const std::vector<DataCode> joint = *ParseDataCodes(ScenarioCodes("joint"));
  for (const int64_t ranks : kRankCounts) {
    const RankLengths joint_lengths = DataStream::Create(joint, ranks, 1)->Batch(0);
    for (const bool use_joint : {false, true}) {
      for (const int32_t group : {0, 32}) {
        AutoLayout layout;
        layout.group = group;
        auto_cases.push_back(std::make_unique<AutoCase>(
            AutoCase{layout, ranks, *cost, prices,
                     use_joint ? joint_lengths : MixedResolutionLengths(ranks)}));
        benchmark::RegisterBenchmark(
            absl::StrCat("BM_PlanAuto/", use_joint ? "joint/" : "mixed/",
                         group == 0 ? "world" : "group32")
                .c_str(),
            BM_PlanAuto, auto_cases.back().get())
            ->Arg(ranks)
            ->Unit(benchmark::kMicrosecond);
      }
    }
    const std::string g4 = absl::StrCat("g4n", ranks / 4);
    cases.push_back(std::make_unique<Case>(Case{*World::Create(*Topology::Parse(g4), ranks),
                                                *cost, joint_lengths, BalancerOptions(), g4}));
    benchmark::RegisterBenchmark("BM_Plan/joint/g4nN", BM_Plan, cases.back().get())
        ->Arg(ranks)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  // The default goes right after argv[0]: flags are parsed in order and the
  // last one wins, so the user's own --benchmark_min_time overrides it.
  std::vector<char*> args(argv, argv + argc + 1);  // keeps argv's trailing nullptr
  std::string min_time = knapformer::kDefaultMinTimeFlag;
  args.insert(args.begin() + 1, min_time.data());
  // --malloc retain (the default: what `knapformer serve` runs with) or
  // default (glibc's own thresholds, as in a process that does not choose).
  std::string malloc_policy = "retain";
  for (auto it = args.begin() + 1; *it != nullptr;) {
    const std::string arg = *it;
    if (arg.rfind("--malloc=", 0) == 0) {
      malloc_policy = arg.substr(9);
      it = args.erase(it);
    } else {
      ++it;
    }
  }
  if (malloc_policy == "retain") {
    if (absl::Status retained = knapformer::RetainFreedMemory(); !retained.ok()) {
      std::fprintf(stderr, "--malloc=retain: %s\n", std::string(retained.message()).c_str());
      return 1;
    }
  } else if (malloc_policy != "default") {
    std::fprintf(stderr, "--malloc: must be retain or default, got '%s'\n",
                 malloc_policy.c_str());
    return 1;
  }
  benchmark::AddCustomContext("malloc", malloc_policy);
  int args_count = static_cast<int>(args.size()) - 1;
  benchmark::Initialize(&args_count, args.data());
  if (benchmark::ReportUnrecognizedArguments(args_count, args.data())) return 1;
  std::vector<std::unique_ptr<knapformer::Case>> cases;
  if (!knapformer::RegisterAll(cases)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
