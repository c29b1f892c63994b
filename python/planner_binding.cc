// knapformer.plan, the topology's bag layout and the paper's synthetic data
// streams: the planner core from Python, without torch.
#include "python/bindings.h"

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <pybind11/stl.h>

#include "absl/strings/str_cat.h"
#include "planner/advice.h"
#include "planner/auto_layout.h"
#include "planner/balancer.h"
#include "planner/calibration.h"
#include "planner/cost_model.h"
#include "planner/data_stream.h"
#include "planner/lengths_file.h"
#include "planner/mask_json.h"
#include "planner/masked_stream.h"
#include "planner/plan_json.h"
#include "planner/topology.h"
#include "python/machine_arg.h"
#include "python/status_exception.h"

namespace knapformer {
namespace python {
namespace {

namespace py = pybind11;

std::string PlanJson(const std::string& request_json, const std::string& cost_model,
                     bool locality, int64_t max_tokens_per_gpu, int32_t refine_rounds,
                     std::optional<int64_t> rank) {
  CostKind kind = ValueOrThrow(ParseCostKind(cost_model, "cost_model"));
  if (max_tokens_per_gpu < 0) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "max_tokens_per_gpu: must be >= 0 (0 = no cap), got ", max_tokens_per_gpu)));
  }
  if (refine_rounds < 0) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("refine_rounds: must be >= 0, got ", refine_rounds)));
  }
  BalancerOptions options;
  options.locality = locality;
  options.max_tokens_per_gpu = max_tokens_per_gpu;
  options.refine_rounds = refine_rounds;
  py::gil_scoped_release no_gil;  // a large world takes milliseconds
  return ValueOrThrow(PlanRequestToJson(request_json, kind, options, rank));
}

// Rank lists (ascending) of every multi-GPU bag of every replica, in bag
// order: the subgroups a balancer over this world needs. Under "auto", every
// aligned power-of-two block from 2 to the largest bag the machine allows
// (planner/auto_layout.h), smallest first, as SequenceBalancer::Create
// prepares them: any of them may be a step's bag.
std::vector<std::vector<int>> MultiGpuBags(const std::string& topology, int64_t world_size,
                                           const py::dict& machine_fields) {
  const Machine machine = MachineFromDict(machine_fields);
  if (AutoLayout::Matches(topology)) {
    const AutoLayout layout = ValueOrThrow(AutoLayout::Parse(topology));
    const AutoShape shape = ValueOrThrow(layout.Resolve(world_size, machine));
    std::vector<std::vector<int>> bags;
    for (int gpus = 2; gpus <= shape.max_bag; gpus *= 2) {
      for (int first = 0; first + gpus <= world_size; first += gpus) {
        std::vector<int> ranks(gpus);
        for (int p = 0; p < gpus; ++p) ranks[p] = first + p;
        bags.push_back(std::move(ranks));
      }
    }
    return bags;
  }
  Topology parsed = ValueOrThrow(Topology::Parse(topology));
  World world = ValueOrThrow(World::Create(std::move(parsed), world_size));
  std::vector<std::vector<int>> bags;
  for (int32_t replica = 0; replica < world.num_replicas(); ++replica) {
    for (const Bag& bag : world.topology().bags()) {
      if (bag.gpus < 2) continue;
      std::vector<int> ranks;
      for (int32_t p = 0; p < bag.gpus; ++p) ranks.push_back(world.RankOf({replica, bag.id, p}));
      bags.push_back(std::move(ranks));
    }
  }
  return bags;
}

// Ranks in each replica (balancing group) of `topology` over `world_size`
// ranks: the topology's group size, or under "auto" its group (default:
// the world).
int32_t ReplicaSize(const std::string& topology, int64_t world_size,
                    const py::dict& machine_fields) {
  if (AutoLayout::Matches(topology)) {
    const AutoLayout layout = ValueOrThrow(AutoLayout::Parse(topology));
    return ValueOrThrow(layout.Resolve(world_size, MachineFromDict(machine_fields))).group;
  }
  Topology parsed = ValueOrThrow(Topology::Parse(topology));
  return ValueOrThrow(World::Create(std::move(parsed), world_size)).group_size();
}

// Samples of sequences timed alone: `seconds[i]` for one sequence of
// `lengths[i]` tokens at width d_model; raises on a bad one.
std::vector<WorkSample> TimedSamples(const std::vector<int64_t>& lengths,
                                     const std::vector<double>& seconds, int64_t d_model) {
  if (lengths.size() != seconds.size()) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "seconds: ", seconds.size(), " timings for ", lengths.size(), " lengths")));
  }
  if (d_model < 1 || d_model > CostModel::kMaxDModel) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("d_model: ", d_model, " is outside [1, ", CostModel::kMaxDModel, "]")));
  }
  std::vector<WorkSample> samples;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1 || lengths[i] > CostModel::kMaxLength) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "lengths[", i, "]: ", lengths[i], " is outside [1, ", CostModel::kMaxLength, "]")));
    }
    samples.push_back(SequenceSample(lengths[i], d_model, seconds[i]));
  }
  return samples;
}

// The calibration fit (planner/calibration.h) of sequences timed alone.
py::dict FitCostModelOf(const std::vector<int64_t>& lengths, const std::vector<double>& seconds,
                        int64_t d_model, std::optional<double> gamma) {
  const std::vector<WorkSample> samples = TimedSamples(lengths, seconds, d_model);
  const CostFit fit =
      ValueOrThrow(gamma.has_value() ? FitCostScale(samples, *gamma) : FitCostModel(samples));
  py::dict result;
  result["k"] = fit.k;
  result["gamma"] = fit.gamma;
  result["samples"] = fit.samples;
  result["rmse_seconds"] = fit.rmse_seconds;
  result["r_squared"] = fit.r_squared;
  result["max_relative_error"] = fit.max_relative_error;
  return result;
}

// The work of a GPU's share: the linear layers on `tokens`, and
// `head_fraction` of the attention of sequences attending `pairs` (query,
// key) pairs each, by the transformer model or (with a table as calibrate
// --table writes it) the measured one, which prices each sequence alone.
double ShareWork(int64_t tokens, const std::vector<double>& pairs, double head_fraction,
                 int64_t d_model, double gamma,
                 const std::optional<std::string>& cost_table_json) {
  std::optional<CostTable> table;
  if (cost_table_json.has_value()) {
    table = ValueOrThrow(ParseCostTable(*cost_table_json, "cost_table"));
  }
  const CostModel cost = ValueOrThrow(
      CostModel::Create(d_model, gamma, table ? CostKind::kMeasured : CostKind::kTransformer,
                        table ? &table->attention : nullptr));
  double attention = 0;
  for (double p : pairs) attention += cost.AttentionOfPairs(p);
  return cost.Linear(tokens) + head_fraction * attention;
}

std::string CostTableJsonOf(const std::vector<int64_t>& lengths,
                            const std::vector<double>& seconds, int64_t d_model, double k,
                            double gamma) {
  const std::vector<WorkSample> samples = TimedSamples(lengths, seconds, d_model);
  CostFit fit;
  fit.k = k;
  fit.gamma = gamma;
  const MeasuredAttention attention =
      ValueOrThrow(MeasuredAttentionFromSamples(samples, fit, d_model));
  return CostTableToJson(CostTable{d_model, k, gamma, attention});
}

void CheckStep(int64_t step) {
  if (step < 0) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat("step: must be >= 0, got ", step)));
  }
}

RankLengths SyntheticLengths(const std::string& data, int64_t world_size, uint64_t seed,
                             int64_t step) {
  const std::string scenario = ScenarioCodes(data);
  std::vector<DataCode> codes = ValueOrThrow(ParseDataCodes(scenario.empty() ? data : scenario));
  DataStream stream = ValueOrThrow(DataStream::Create(std::move(codes), world_size, seed));
  CheckStep(step);
  return stream.Batch(step);
}

// A user's lengths file batched as a loader would (planner/lengths_file.h).
LengthsStream MakeLengthsStream(const std::string& text, const std::string& name,
                                int64_t world_size, int64_t samples_per_gpu,
                                int64_t tokens_per_gpu, uint64_t seed, bool shuffle) {
  LengthsFile file = ValueOrThrow(ParseLengthsFile(text, name));
  return ValueOrThrow(LengthsStream::Create(std::move(file), world_size,
                                            {samples_per_gpu, tokens_per_gpu}, seed, shuffle));
}

// (lengths by rank, masks by rank as JSON texts, or None without masks).
py::tuple LengthsAndMasks(const RankLengths& lengths, const RankMasks& masks) {
  if (masks.empty()) return py::make_tuple(lengths, py::none());
  std::vector<std::vector<std::string>> texts(masks.size());
  for (size_t r = 0; r < masks.size(); ++r) {
    for (const AttentionMask& mask : masks[r]) texts[r].push_back(MaskToJson(mask));
  }
  return py::make_tuple(lengths, texts);
}

py::tuple LengthsStreamBatch(LengthsStream& stream, int64_t step) {
  CheckStep(step);
  LengthsStream::Step batch = stream.Batch(step);
  return LengthsAndMasks(batch.lengths, batch.masks);
}

// One step of a masked stream (planner/masked_stream.h), as LengthsStreamBatch.
py::tuple MaskedBatch(const std::string& name, int64_t world_size, uint64_t seed,
                      int64_t step) {
  const MaskedStream stream = ValueOrThrow(MaskedStream::Create(name, world_size, seed));
  CheckStep(step);
  MaskedStream::Step batch = stream.Batch(step);
  return LengthsAndMasks(batch.lengths, batch.masks);
}

// The advice line of rows (topology, cost model, seconds, seconds before
// balancing): planner/advice.h; `unit` "us" or "ms".
std::string TopologyAdviceOf(
    const std::vector<std::tuple<std::string, std::string, double, double>>& rows,
    const std::string& unit, const std::string& seconds_note, const std::string& baseline,
    const std::string& trainer_arguments, const std::string& measured_arguments) {
  AdviceWording wording;
  if (unit == "ms") {
    wording.unit = AdviceWording::Unit::kMilliseconds;
  } else if (unit != "us") {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("unit: 'us' or 'ms', got '", unit, "'")));
  }
  wording.seconds_note = seconds_note;
  wording.baseline = baseline;
  wording.trainer_arguments = trainer_arguments;
  wording.measured_arguments = measured_arguments;
  std::vector<AdviceRow> advice_rows;
  for (const auto& [topology, cost_model, seconds, seconds_before] : rows) {
    advice_rows.push_back({topology, cost_model, seconds, seconds_before});
  }
  return TopologyAdvice(advice_rows, wording);
}

}  // namespace

void BindPlanner(py::module_& m) {
  py::class_<LengthsStream>(m, "_LengthsStream")
      .def(py::init(&MakeLengthsStream), py::arg("text"), py::arg("name"),
           py::arg("world_size"), py::arg("samples_per_gpu"), py::arg("tokens_per_gpu"),
           py::arg("seed"), py::arg("shuffle"))
      .def("batch", &LengthsStreamBatch, py::arg("step"))
      .def_property_readonly("samples",
                             [](const LengthsStream& s) { return s.file().samples.size(); })
      .def_property_readonly("masked", [](const LengthsStream& s) { return s.file().masked; })
      .def_property_readonly("samples_over_budget", &LengthsStream::samples_over_budget);
  m.def("_plan_json", &PlanJson, py::arg("request_json"), py::arg("cost_model"),
        py::arg("locality"), py::arg("max_tokens_per_gpu"), py::arg("refine_rounds"),
        py::arg("rank"));
  m.def("multi_gpu_bags", &MultiGpuBags, py::arg("topology"), py::arg("world_size"),
        py::arg("machine") = py::dict(),
        "Rank lists of every multi-GPU bag of every replica of `topology` over "
        "`world_size` ranks, in bag order; under auto, every aligned block a step "
        "may use (`machine`: a dict of planner Machine fields).");
  m.def("replica_size", &ReplicaSize, py::arg("topology"), py::arg("world_size"),
        py::arg("machine") = py::dict(),
        "Ranks in each replica (balancing group) of `topology` over `world_size` ranks.");
  m.def("fit_cost_model", &FitCostModelOf, py::arg("lengths"), py::arg("seconds"),
        py::arg("d_model"), py::arg("gamma") = py::none(),
        "The calibration fit seconds ~= k * (24*l*d^2 + gamma*4*l^2*d) of sequences "
        "timed alone (relative least squares; k alone with `gamma` given): a dict of k, "
        "gamma, samples, rmse_seconds, r_squared, max_relative_error.");
  m.def("cost_table_json", &CostTableJsonOf, py::arg("lengths"), py::arg("seconds"),
        py::arg("d_model"), py::arg("k"), py::arg("gamma"),
        "The measured cost model's table (JSON, what calibrate --table writes) of sequences "
        "timed alone, with the fit's k (seconds per unit) and gamma.");
  m.def("share_work", &ShareWork, py::arg("tokens"), py::arg("pairs"), py::arg("head_fraction"),
        py::arg("d_model"), py::arg("gamma"), py::arg("cost_table_json") = py::none(),
        "The cost model's work of a GPU's share: 24*tokens*d^2 plus head_fraction of "
        "the attention of sequences of `pairs` (query, key) pairs each, gamma*4*pairs*d "
        "or by the measured table given.");
  m.def("homogeneous_specs", &HomogeneousSpecs, py::arg("world_size"), py::arg("max_bag"),
        "The one-size layouts of a world (planner/topology.h): g1nW, g2nW/2, ... for "
        "every power of two up to max_bag that divides the world.");
  m.def("topology_advice", &TopologyAdviceOf, py::arg("rows"), py::arg("unit") = "us",
        py::arg("seconds_note") = "", py::arg("baseline") = "without balancing",
        py::arg("trainer_arguments") = "", py::arg("measured_arguments") = "",
        "The line that says which topology to use (planner/advice.h): of rows "
        "(topology, cost model, seconds of a block on the slowest GPU, the same "
        "without balancing), the fastest, or auto within 1% of it; --cost-model named "
        "when the rows hold more than one; times in `unit` (us or ms); with "
        "trainer_arguments, ending with the SequenceBalancer call that plans so "
        "(measured_arguments: a measured row's table). '' for no rows or a fastest of "
        "no time.");
  m.def(
      "scenario_codes", [](const std::string& name) { return ScenarioCodes(name); },
      py::arg("name"), "The data codes of one of the paper's scenarios; '' for another name.");
  m.def("synthetic_lengths", &SyntheticLengths, py::arg("data"), py::arg("world_size"),
        py::arg("seed"), py::arg("step"),
        "Sequence lengths of every rank at `step` of the paper's synthetic data "
        "stream: a scenario name (low-res, mixed-res, joint) or data codes "
        "g{G}b{B}i{R}f{F}s{S},...");
  m.def("masked_scenario_names", &MaskedScenarioNames,
        "The masked streams: video-blockcausal, interleaved, llm-packed.");
  m.def("masked_batch", &MaskedBatch, py::arg("name"), py::arg("world_size"), py::arg("seed"),
        py::arg("step"),
        "Every rank's lengths and masks (JSON texts) at `step` of a masked stream.");
}

}  // namespace python
}  // namespace knapformer
