// knapformer._C.SequenceBalancer: client/sequence_balancer.h over the
// trainer's torch.distributed process group. The Python class of the same
// name (knapformer/sequence_balancer.py) makes the bag subgroups and shapes
// the results like the reference implementation's.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "client/environment.h"
#include "client/sequence_balancer.h"
#include "client/settings_agreement.h"
#include "planner/balance_stats.h"
#include "planner/attention_mask.h"
#include "planner/cost_model.h"
#include "planner/plan_json.h"
#include "planner/rank_speeds.h"
#include "planner/mask_json.h"
#include "planner/plan.h"
#include "planner/topology.h"
#include "proto/plan_proto.h"
#include "python/bindings.h"
#include "python/machine_arg.h"
#include "python/status_exception.h"
#include "transport/c10d_transport.h"
#include "transport/tensor_hub_transport.h"

namespace knapformer {
namespace python {
namespace {

namespace py = pybind11;
using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using BagGroups = std::map<std::vector<int>, ProcessGroupPtr>;

struct BalancerArgs {
  std::string device = "cpu";
  std::string topology;
  double gamma = 1.0;
  std::optional<std::string> planner_address;
  std::optional<std::string> job_id;
  std::optional<std::string> group_id;
  int32_t d_model = 0;  // 0: plan_routing's token_dim
  int64_t max_tokens_per_gpu = 0;
  std::string cost_model = "transformer";
  // The measured model's table as calibrate --table writes it (JSON text).
  std::optional<std::string> cost_table_json;
  std::optional<bool> locality;
  std::optional<double> planner_deadline_s;
  std::optional<std::string> planner_mode;
  std::optional<bool> require_planner;  // unset: KNAPFORMER_REQUIRE_PLANNER
  std::optional<bool> log_steps;        // unset: KNAPFORMER_LOG_STEPS
  // Unset: KNAPFORMER_PLANNER_TOKEN, KNAPFORMER_PLANNER_TLS_CA, _CERT, _KEY.
  std::optional<std::string> planner_token;
  std::optional<bool> planner_mesh_tls;
  std::optional<std::string> planner_tls_ca;
  std::optional<std::string> planner_tls_cert;
  std::optional<std::string> planner_tls_key;
  uint64_t first_step = 0;
  bool use_fitted_gamma = false;
  bool agree_on_errors = true;
  bool agree_every_exchange = false;
  Machine machine;  // set from a dict (python/machine_arg.h)
  // rank_speeds= (planner/rank_speeds.h): declared, or learned online.
  std::vector<double> rank_speeds;
  bool learn_rank_speeds = false;
};

// An integer through __index__ (Python ints, numpy integers, 0-d integer
// tensors; not bool), as a status naming `what` when it is not one; with
// `overflow` set when it does not fit 64 bits. Leaves no Python error set.
absl::StatusOr<int64_t> IntegerFrom(const py::handle& value, const std::string& what,
                                    bool* overflow) {
  PyObject* index = py::isinstance<py::bool_>(value) ? nullptr : PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", std::string(py::repr(value)), " is not an integer"));
  }
  int overflowed = 0;
  const long long result = PyLong_AsLongLongAndOverflow(index, &overflowed);
  Py_DECREF(index);
  *overflow = overflowed != 0;
  return static_cast<int64_t>(result);
}

// A Python list/tuple of ints or a 1-D integer tensor, as lengths. Never
// throws: whatever the object does (a failing __index__ or __len__), the
// rank gets a status and still joins the step.
absl::StatusOr<std::vector<int64_t>> LengthsFrom(const py::handle& object) {
  try {
    if (THPVariable_Check(object.ptr())) {
      const at::Tensor& t = THPVariable_Unpack(object.ptr());
      if (t.dim() != 1 || at::isFloatingType(t.scalar_type()) ||
          at::isComplexType(t.scalar_type()) || t.scalar_type() == at::kBool) {
        return absl::InvalidArgumentError(absl::StrCat(
            "local_seq_lens: needs a 1-D integer tensor, got ", t.dim(), "-D ",
            c10::toString(t.scalar_type())));
      }
      at::Tensor longs = t.to(at::kCPU, at::kLong).contiguous();
      const int64_t* data = longs.data_ptr<int64_t>();
      return std::vector<int64_t>(data, data + longs.numel());
    }
    if (!py::isinstance<py::sequence>(object) || py::isinstance<py::str>(object)) {
      return absl::InvalidArgumentError(
          absl::StrCat("local_seq_lens: needs a list of ints or a 1-D integer tensor, got ",
                       std::string(py::str(object.get_type().attr("__name__")))));
    }
    std::vector<int64_t> lengths;
    py::sequence items = py::reinterpret_borrow<py::sequence>(object);
    for (size_t i = 0; i < items.size(); ++i) {
      py::object item = items[i];
      const std::string what = absl::StrCat("local_seq_lens[", i, "]");
      bool overflow = false;
      absl::StatusOr<int64_t> value = IntegerFrom(item, what, &overflow);
      if (!value.ok()) return value.status();
      if (overflow) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", std::string(py::repr(item)),
                                                       " is outside [0, ", CostModel::kMaxLength,
                                                       "]"));
      }
      lengths.push_back(*value);
    }
    return lengths;
  } catch (const py::error_already_set& e) {
    return absl::InvalidArgumentError(absl::StrCat("local_seq_lens: ", e.what()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("local_seq_lens: ", e.what()));
  }
}

// plan_routing's token_dim as the cost model's d_model; a status for
// anything else (the rank still joins the step).
absl::StatusOr<int32_t> TokenDimFrom(const py::handle& token_dim) {
  if (token_dim.is_none()) {
    return absl::InvalidArgumentError(
        "plan_routing: token_dim is required (the cost model's d_model) unless the "
        "SequenceBalancer was given d_model");
  }
  bool overflow = false;
  absl::StatusOr<int64_t> value = IntegerFrom(token_dim, "token_dim", &overflow);
  if (!value.ok()) return value.status();
  if (overflow || *value < 1 || *value > CostModel::kMaxDModel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_dim: ", std::string(py::repr(token_dim)), " is outside [1, ", CostModel::kMaxDModel,
        "] (it is the cost model's d_model; pass d_model= to the SequenceBalancer to fix it)"));
  }
  return static_cast<int32_t>(*value);
}

// What get_routing_plan_summary reports: taken when a step is planned, so a
// later step that fails does not mix into it.
struct PlannedStep {
  uint64_t step = 0;
  std::string source;
  std::string topology;
  int32_t d_model = 0;
  double gamma = 0;
  int64_t spec_token_bytes = 0;
  std::vector<double> workload_before, workload_after;
  int64_t total_tokens = 0, moved_tokens = 0;
  std::vector<int64_t> seq_lens, chunk_lens, attention_seq_lens;
  std::string layout;  // the bags it was planned on (auto: the chosen ones)
  double predicted_step_seconds = 0;
  std::vector<double> rank_speeds;  // StepPlan::rank_speeds
  std::shared_ptr<const Plan> whole;  // null in per-rank mode (StepPlan::whole)
  std::optional<CostModel> cost;      // the spec's, for per-sequence workloads
  int64_t local_steps = 0;            // StepPlan::local_steps, local_reason
  std::string local_reason;
  std::string gamma_note;             // StepPlan::gamma_note, gamma_used
  double gamma_used = 0;
  // JSON text of this rank's attn_masks and of the masks of the sequences
  // its attention sees; unset in a step without masks.
  std::optional<std::string> input_masks;
  std::optional<std::string> attention_masks;
  std::optional<MeasuredAttention> fitted_table;  // StepPlan::fitted_table
};

// Ranks per replica of a plan's layout ("g1n2+g2n1", or one spec per
// replica joined by ';', all of one group size).
int32_t ReplicaSize(const Plan& plan) {
  const std::string& layout = plan.topology;
  absl::StatusOr<Topology> first = Topology::Parse(layout.substr(0, layout.find(';')));
  return first.ok() ? first->group_size() : plan.world_size;
}

// The whole step's plan as flat lists, from which the Python layer builds
// the reference implementation's tables (knapformer/_reference_tables.py).
py::dict TablesOf(const Plan& plan, const std::optional<CostModel>& cost) {
  std::vector<int32_t> seq_src_rank, seq_index, seq_bag;
  std::vector<int64_t> seq_length;
  std::vector<double> seq_workload;
  for (const PlacedSequence& s : plan.sequences) {
    seq_src_rank.push_back(s.src_rank);
    seq_index.push_back(s.seq_index);
    seq_length.push_back(s.length);
    seq_bag.push_back(s.bag);
    seq_workload.push_back(
        cost.has_value() ? cost->Workload(s.length, MaskOf(&plan.masks, s.src_rank, s.seq_index))
                         : 0.0);
  }
  std::vector<int32_t> chunk_src_rank, chunk_seq_index, chunk_dst_rank;
  std::vector<int64_t> chunk_offset, chunk_length;
  for (const Chunk& c : plan.chunks) {
    chunk_src_rank.push_back(c.src_rank);
    chunk_seq_index.push_back(c.seq_index);
    chunk_offset.push_back(c.offset);
    chunk_length.push_back(c.length);
    chunk_dst_rank.push_back(c.dst_rank);
  }
  py::dict tables;
  tables["world_size"] = plan.world_size;
  tables["replica_size"] = ReplicaSize(plan);
  tables["layout"] = plan.topology;
  tables["seq_src_rank"] = seq_src_rank;
  tables["seq_index"] = seq_index;
  tables["seq_length"] = seq_length;
  tables["seq_bag"] = seq_bag;
  tables["seq_workload"] = seq_workload;
  tables["chunk_src_rank"] = chunk_src_rank;
  tables["chunk_seq_index"] = chunk_seq_index;
  tables["chunk_offset"] = chunk_offset;
  tables["chunk_length"] = chunk_length;
  tables["chunk_dst_rank"] = chunk_dst_rank;
  tables["bag_first_rank"] = plan.bag_first_rank;
  tables["bag_gpus"] = plan.bag_gpus;
  tables["workload_before"] = plan.workload_before;
  tables["workload_after"] = plan.workload_after;
  return tables;
}

// A process group joins its worker threads when destroyed, and a worker may
// be freeing a tensor that has a Python object, which takes the GIL: with
// the GIL held here, both wait forever (seen at exit after
// destroy_process_group, when the balancer held the last references).
// Transports are therefore destroyed without it, as torch's own
// ProcessGroup bindings do.
void DeleteWithoutGil(Transport* transport) {
  if (HoldsReleasableGil()) {
    py::gil_scoped_release no_gil;
    delete transport;
  } else {
    delete transport;
  }
}

// The bags' groups, made in Python (dist.new_group), handed to the transport
// as its subgroup factory.
SubgroupFactory FactoryOf(BagGroups groups, const std::string& what) {
  return [groups = std::move(groups), what](const std::vector<int>& ranks,
                                            int) -> ProcessGroupPtr {
    auto it = groups.find(ranks);
    if (it == groups.end()) {
      throw std::runtime_error(absl::StrCat("no ", what, " was made for this bag's ranks"));
    }
    return it->second;
  };
}

// The balancer's options from the Python arguments and the environment
// (ApplyClientEnvironment; an argument given wins); raises on a bad one.
SequenceBalancerOptions OptionsOf(const BalancerArgs& args) {
  CostKind kind = ValueOrThrow(ParseCostKind(args.cost_model, "cost_model"));
  SequenceBalancerOptions options;
  std::string job_id = "default", group_id;
  ThrowIfError(ApplyClientEnvironment(&options.planner, &job_id, &group_id));
  if (args.planner_address.has_value()) options.planner.address = *args.planner_address;
  if (args.require_planner.has_value()) options.planner.require_service = *args.require_planner;
  if (args.log_steps.has_value()) options.planner.log_steps = *args.log_steps;
  if (args.planner_token.has_value()) options.planner.token = *args.planner_token;
  if (args.planner_mesh_tls.has_value()) options.planner.mesh_tls = *args.planner_mesh_tls;
  if (args.planner_tls_ca.has_value()) options.planner.tls.ca_file = *args.planner_tls_ca;
  if (args.planner_tls_cert.has_value()) options.planner.tls.cert_file = *args.planner_tls_cert;
  if (args.planner_tls_key.has_value()) options.planner.tls.key_file = *args.planner_tls_key;
  if (args.job_id.has_value()) job_id = *args.job_id;
  if (args.group_id.has_value()) group_id = *args.group_id;
  if (args.planner_deadline_s.has_value()) {
    if (!(*args.planner_deadline_s > 0)) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "planner_deadline: must be > 0 seconds, got ", *args.planner_deadline_s)));
    }
    options.planner.call_deadline = absl::Seconds(*args.planner_deadline_s);
  }
  if (args.planner_mode.has_value()) {
    options.planner.mode = ValueOrThrow(ParsePlannerMode(*args.planner_mode));
  }
  if (args.max_tokens_per_gpu < 0) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
        "max_tokens_per_gpu: must be >= 0 (0 = no cap), got ", args.max_tokens_per_gpu)));
  }
  options.job_id = job_id;
  options.group_id = group_id;
  options.topology = args.topology;
  options.cost_model = kind;
  options.d_model = args.d_model;
  if (args.cost_table_json.has_value()) {
    CostTable table = ValueOrThrow(ParseCostTable(*args.cost_table_json, "cost_table"));
    if (args.d_model != 0 && args.d_model != table.d_model) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "d_model: ", args.d_model, ", but cost_table was measured at d_model ", table.d_model)));
    }
    options.d_model = static_cast<int32_t>(table.d_model);
    options.measured_attention = std::move(table.attention);
  }
  options.gamma = args.gamma;
  options.max_tokens_per_gpu = args.max_tokens_per_gpu;
  options.first_step = args.first_step;
  options.use_fitted_gamma = args.use_fitted_gamma;
  options.agree_on_errors = args.agree_on_errors;
  options.agree_every_exchange = args.agree_every_exchange;
  options.locality = args.locality;
  options.machine = args.machine;
  options.planner.balancer.rank_speeds = args.rank_speeds;
  options.planner.learn_rank_speeds = args.learn_rank_speeds;
  return options;
}

class BalancerBinding {
 public:
  // `host_group` (None, or a Gloo group over the same ranks) and
  // `host_bag_groups` carry the small host-side collectives of an NCCL
  // group: count checks and error agreement without a GPU round trip.
  BalancerBinding(ProcessGroupPtr group, BagGroups bag_groups, BalancerArgs args,
                  const py::object& host_group, BagGroups host_bag_groups)
      : device_(ValueOrThrow(ParseDevice(args.device))) {
    SequenceBalancerOptions options = OptionsOf(args);
    fixed_d_model_ = args.d_model != 0;

    C10dTransportOptions transport;
    transport.device = device_;
    transport.new_subgroup = FactoryOf(std::move(bag_groups), "process group");
    if (!host_group.is_none()) {
      transport.host_group = host_group.cast<ProcessGroupPtr>();
      transport.new_host_subgroup = FactoryOf(std::move(host_bag_groups), "host process group");
    }
    py::gil_scoped_release no_gil;
    world_ = std::shared_ptr<Transport>(
        ValueOrThrow(C10dTransport::Create(std::move(group), std::move(transport))).release(),
        DeleteWithoutGil);
    balancer_ = ValueOrThrow(SequenceBalancer::Create(std::move(options), world_));
  }

  // A balancer over a transport made in C++ (TensorHubTransport's ranks,
  // for the GPU check). Collective: every rank's is made at once, on
  // threads of their own, by OverTensorHub.
  BalancerBinding(std::shared_ptr<Transport> world, const BalancerArgs& args)
      : device_(ValueOrThrow(ParseDevice(args.device))), world_(std::move(world)) {
    fixed_d_model_ = args.d_model != 0;
    balancer_ = ValueOrThrow(SequenceBalancer::Create(OptionsOf(args), world_));
  }

  // The bag transports (and the world's, unless autograd nodes still hold
  // it) go with the balancer: without the GIL, see DeleteWithoutGil.
  ~BalancerBinding() {
    if (HoldsReleasableGil()) {
      py::gil_scoped_release no_gil;
      balancer_.reset();
      world_.reset();
    }
  }

  // Collective. A rank whose lengths or token_dim cannot be read still
  // joins the step, with a length or d_model no planner accepts, so every
  // rank fails it together; that rank raises the precise reason.
  void PlanRouting(const py::handle& local_seq_lens, const py::handle& token_dim,
                   const std::optional<std::string>& masks_json, const std::string& masks_error) {
    lengths_cache_.clear();
    const std::optional<std::string> input_masks = CallWithStepInput(
        local_seq_lens, token_dim, masks_json, masks_error, &SequenceBalancer::PlanRouting);
    const StepPlan& plan = balancer_->step_plan();
    const v1::StepSpec& spec = balancer_->spec();
    planned_ = PlannedStep{balancer_->step(),
                           PlanSourceName(plan.source),
                           spec.topology(),
                           spec.d_model(),
                           spec.gamma(),
                           spec.token_bytes(),
                           plan.workload_before,
                           plan.workload_after,
                           plan.total_tokens,
                           plan.moved_tokens,
                           balancer_->input_lengths(),
                           balancer_->routed_lengths(),
                           balancer_->attention_lengths(),
                           plan.layout,
                           plan.predicted_step_seconds,
                           plan.rank_speeds,
                           plan.whole,
                           std::nullopt,
                           plan.local_steps,
                           plan.local_reason,
                           plan.gamma_note,
                           plan.gamma_used > 0 ? plan.gamma_used : spec.gamma(),
                           input_masks,
                           balancer_->attention_masks().empty() && input_masks.has_value()
                               ? std::optional<std::string>("[]")
                               : MasksJson(balancer_->attention_masks()),
                           plan.fitted_table};
    absl::StatusOr<CostModel> cost = CostModelFromSpec(spec);
    if (cost.ok()) planned_->cost = *cost;
  }

  // The next step's lengths, while this one computes (PrefetchRouting).
  void PrefetchRouting(const py::handle& local_seq_lens, const py::handle& token_dim,
                       const std::optional<std::string>& masks_json,
                       const std::string& masks_error) {
    CallWithStepInput(local_seq_lens, token_dim, masks_json, masks_error,
                      &SequenceBalancer::PrefetchRouting);
  }

  // The masks of the sequences attention sees on this rank, as JSON text
  // (knapformer/sequence_balancer.py reads it); None in a step without.
  py::object AttentionMasks() const {
    if (!planned_.has_value()) {
      ThrowIfError(absl::FailedPreconditionError(
          "get_attention_masks: no step has been planned yet; call plan_routing first"));
    }
    if (!planned_->attention_masks.has_value()) return py::none();
    return py::str(*planned_->attention_masks);
  }

  std::vector<at::Tensor> Route(const std::vector<at::Tensor>& xs) const {
    return Call(xs, &SequenceBalancer::RouteTensors);
  }
  std::vector<at::Tensor> ReverseRoute(const std::vector<at::Tensor>& ys) const {
    return Call(ys, &SequenceBalancer::ReverseRouteTensors);
  }
  std::vector<at::Tensor> PreAttn(const std::vector<at::Tensor>& xs) const {
    return Call(xs, &SequenceBalancer::PreAttnTensors);
  }
  std::vector<at::Tensor> PostAttn(const std::vector<at::Tensor>& ys) const {
    return Call(ys, &SequenceBalancer::PostAttnTensors);
  }

  // Collective: the backward of `call` of this step for the gradients of
  // its outputs (SequenceBalancer::BackwardOf), for the compiled ops.
  std::vector<at::Tensor> Backward(const std::string& call,
                                   const std::vector<at::Tensor>& grads) const {
    const SequenceBalancer::Call which = CallNamed(call);
    absl::StatusOr<std::vector<at::Tensor>> result;
    {
      py::gil_scoped_release no_gil;
      result = balancer_->BackwardOf(which, grads);
    }
    return ValueOrThrow(std::move(result));
  }

  // Collective, in place of `call` on a rank whose Python arguments were
  // refused before reaching C++: every rank of the call's group raises
  // (this rank's `message` as ValueError, unless a lower rank failed too).
  void Refuse(const std::string& call, const std::string& message) const {
    const SequenceBalancer::Call which = CallNamed(call);
    absl::Status agreed;
    {
      py::gil_scoped_release no_gil;
      agreed = balancer_->RefuseCall(which, absl::InvalidArgumentError(message));
    }
    ThrowIfError(agreed);
  }

  // A tensor call by its Python name; raises ValueError for another name.
  static SequenceBalancer::Call CallNamed(const std::string& call) {
    static const std::map<std::string, SequenceBalancer::Call> kCalls = {
        {"route", SequenceBalancer::Call::kRoute},
        {"reverse_route", SequenceBalancer::Call::kReverseRoute},
        {"pre_attn", SequenceBalancer::Call::kPreAttn},
        {"post_attn", SequenceBalancer::Call::kPostAttn}};
    auto it = kCalls.find(call);
    if (it == kCalls.end()) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat("call: no call '", call, "'")));
    }
    return it->second;
  }

  // int32 lengths on `device`: "chunk" (routed_lengths), "sequence" (this
  // rank's own) or "attention". Uploaded once per step and device (from
  // pinned memory, without waiting, to a GPU); every caller gets a copy of
  // its own, so that one editing its lengths in place changes no other
  // call's (route, post_attn and the compiled ops all hand them out).
  at::Tensor Lengths(const std::string& which, const std::string& device_name) {
    const c10::Device device = ValueOrThrow(ParseDevice(device_name));
    const std::string key = absl::StrCat(which, "@", device.str());
    auto it = lengths_cache_.find(key);
    if (it != lengths_cache_.end()) return it->second.clone();
    const std::vector<int64_t>* values = which == "chunk"       ? &balancer_->routed_lengths()
                                         : which == "sequence"  ? &balancer_->input_lengths()
                                         : which == "attention" ? &balancer_->attention_lengths()
                                                                : nullptr;
    if (values == nullptr) ThrowIfError(absl::InvalidArgumentError("which: unknown lengths"));
    at::Tensor lengths = at::tensor(*values, at::kLong).to(at::kInt);
    if (device.is_cuda()) lengths = lengths.pin_memory().to(device, /*non_blocking=*/true);
    lengths_cache_.emplace(key, lengths);
    return lengths.clone();
  }

  py::dict Summary() const {
    if (!planned_.has_value()) {
      ThrowIfError(absl::FailedPreconditionError(
          "get_routing_plan_summary: no step has been planned yet; call plan_routing first"));
    }
    const PlannedStep& p = *planned_;
    // By time against the ideal where the step was planned by speed.
    BalanceStats before = ComputeBalanceStats(p.workload_before);
    BalanceStats after = ComputeBalanceStats(p.workload_after);
    if (!p.rank_speeds.empty() && p.whole != nullptr) {
      const PlanBalance timed = BalanceOf(*p.whole, p.rank_speeds);
      before = timed.before;
      after = timed.after;
    }
    // What this step's route moved per token, once it has run.
    const int64_t token_bytes = balancer_->step() == p.step && balancer_->routed_token_bytes() > 0
                                    ? balancer_->routed_token_bytes()
                                    : p.spec_token_bytes;
    py::dict summary;
    summary["step"] = p.step;
    summary["source"] = p.source;
    summary["rank"] = world_->rank();
    summary["world_size"] = world_->size();
    summary["topology"] = p.topology;
    summary["bag_gpus"] = balancer_->bag_gpus();
    summary["d_model"] = p.d_model;
    summary["gamma"] = p.gamma;
    summary["workload_before"] = p.workload_before;
    summary["workload_after"] = p.workload_after;
    summary["wir_before"] = before.wir;
    summary["wir_after"] = after.wir;
    summary["max_over_mean_before"] = before.max_over_mean;
    summary["max_over_mean_after"] = after.max_over_mean;
    summary["total_tokens"] = p.total_tokens;
    summary["moved_tokens"] = p.moved_tokens;
    summary["token_bytes"] = token_bytes;
    summary["moved_bytes"] = MovedBytes(p.moved_tokens, token_bytes);
    summary["seq_lens"] = p.seq_lens;
    summary["chunk_lens"] = p.chunk_lens;
    summary["attention_seq_lens"] = p.attention_seq_lens;
    summary["layout"] = p.layout;
    summary["predicted_step_seconds"] = p.predicted_step_seconds;
    // The speeds the step was planned with (mean 1); all 1 without.
    summary["rank_speeds"] =
        p.rank_speeds.empty() ? std::vector<double>(world_->size(), 1.0) : p.rank_speeds;
    summary["local_steps"] = p.local_steps;
    summary["local_reason"] = p.local_reason;
    summary["gamma_note"] = p.gamma_note;
    summary["gamma_used"] = p.gamma_used;
    // As cost_table= takes it (calibrate --table's form), so a run can keep
    // it and start the next from it.
    py::object fitted = py::none();
    if (p.fitted_table.has_value()) {
      py::dict attention;
      attention["pairs"] = p.fitted_table->pairs();
      attention["work"] = p.fitted_table->work();
      py::dict table;
      table["cost_model"] = "measured";
      table["d_model"] = p.d_model;
      table["measured_attention"] = attention;
      fitted = table;
    }
    summary["fitted_cost_table"] = fitted;
    // JSON text, read into lists by the Python layer; None without masks.
    summary["attn_masks"] = p.input_masks.has_value() ? py::object(py::str(*p.input_masks))
                                                      : py::object(py::none());
    summary["attention_masks"] = p.attention_masks.has_value()
                                     ? py::object(py::str(*p.attention_masks))
                                     : py::object(py::none());
    return summary;
  }

  // The last planned step's whole plan as flat lists (TablesOf), or None
  // where this rank has only its slice (per-rank planner mode).
  py::object Tables() const {
    if (!planned_.has_value()) {
      ThrowIfError(absl::FailedPreconditionError(
          "no step has been planned yet; call plan_routing first"));
    }
    if (planned_->whole == nullptr) return py::none();
    return TablesOf(*planned_->whole, planned_->cost);
  }

  // For bench/python_route_bench.py: Route + ReverseRoute called from C++,
  // as a C++ trainer calls them, timed in C++ (seconds).
  double TimeRouteAndReverseInCpp(const at::Tensor& x) const {
    absl::StatusOr<at::Tensor> back;
    std::chrono::steady_clock::time_point start, end;
    {
      py::gil_scoped_release no_gil;
      start = std::chrono::steady_clock::now();
      absl::StatusOr<at::Tensor> routed = balancer_->Route(x);
      back = routed.ok() ? balancer_->ReverseRoute(*routed) : routed;
      end = std::chrono::steady_clock::now();
    }
    ThrowIfError(back.status());
    return std::chrono::duration<double>(end - start).count();
  }

  bool planned() const { return planned_.has_value(); }
  int64_t planned_total_tokens() const { return planned_.has_value() ? planned_->total_tokens : 0; }
  int32_t planned_d_model() const { return planned_.has_value() ? planned_->d_model : 0; }
  void RecordComputeSeconds(double seconds) { balancer_->RecordComputeSeconds(seconds); }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int bag_gpus() const { return balancer_->bag_gpus(); }
  int heads_multiple() const { return balancer_->heads_multiple(); }
  uint64_t step() const { return balancer_->step(); }
  std::string source() const { return PlanSourceName(balancer_->step_plan().source); }

  static absl::StatusOr<c10::Device> ParseDevice(const std::string& name) {
    try {
      return c10::Device(name);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("device: '", name, "' is not a device"));
    }
  }

 private:

  // One of the balancer's tensor calls (which checks the tensors' device
  // against the transport's, on every rank alike), with the GIL let go
  // while the collectives run.
  using TensorCall = absl::StatusOr<std::vector<at::Tensor>> (SequenceBalancer::*)(
      const std::vector<at::Tensor>&) const;
  std::vector<at::Tensor> Call(const std::vector<at::Tensor>& xs, TensorCall call) const {
    absl::StatusOr<std::vector<at::Tensor>> result;
    {
      py::gil_scoped_release no_gil;
      result = (balancer_.get()->*call)(xs);
    }
    return ValueOrThrow(std::move(result));
  }

  c10::Device device_;
  bool fixed_d_model_ = false;
  std::optional<PlannedStep> planned_;
  std::shared_ptr<Transport> world_;
  // Calls `step_call` (PlanRouting or PrefetchRouting) with a step's
  // Python arguments, then raises what was wrong with them. A bad input
  // still takes part (as a length no planner accepts), so that the step
  // fails on every rank, not a hang.
  // A step's masks (attn_masks) from the JSON text the Python layer made
  // of them, checked against the lengths; the refusal names attn_masks[i].
  static absl::StatusOr<std::vector<AttentionMask>> MasksFrom(
      const std::optional<std::string>& masks_json, const std::string& masks_error,
      const absl::StatusOr<std::vector<int64_t>>& lengths) {
    if (!masks_error.empty()) return absl::InvalidArgumentError(masks_error);
    if (!masks_json.has_value()) return std::vector<AttentionMask>();
    absl::StatusOr<std::vector<AttentionMask>> masks = ParseMaskListJson(*masks_json, "attn_masks");
    if (!masks.ok() || !lengths.ok()) return masks;
    if (masks->empty() && !lengths->empty()) {  // [] says "masks", not "none"
      return absl::InvalidArgumentError(absl::StrCat(
          "attn_masks: 0 masks for ", lengths->size(),
          " sequences (give one per sequence, or none at all)"));
    }
    absl::Status fits = CheckMaskList(*lengths, *masks, "attn_masks");
    if (!fits.ok()) return fits;
    return masks;
  }

  static std::optional<std::string> MasksJson(const std::vector<AttentionMask>& masks) {
    if (masks.empty()) return std::nullopt;
    std::string text = "[";
    for (size_t i = 0; i < masks.size(); ++i) {
      absl::StrAppend(&text, i > 0 ? "," : "", MaskToJson(masks[i]));
    }
    return text + "]";
  }

  using StepCall = absl::Status (SequenceBalancer::*)(const std::vector<int64_t>&,
                                                      const StepOverrides&,
                                                      const std::vector<AttentionMask>&);
  // Returns the masks given, as JSON text (unset: none).
  std::optional<std::string> CallWithStepInput(const py::handle& local_seq_lens,
                                               const py::handle& token_dim,
                                               const std::optional<std::string>& masks_json,
                                               const std::string& masks_error,
                                               StepCall step_call) {
    absl::StatusOr<std::vector<int64_t>> lengths = LengthsFrom(local_seq_lens);
    absl::StatusOr<int32_t> d_model = fixed_d_model_ ? absl::StatusOr<int32_t>(0)
                                                     : TokenDimFrom(token_dim);
    absl::StatusOr<std::vector<AttentionMask>> masks = MasksFrom(masks_json, masks_error, lengths);
    StepOverrides overrides;
    overrides.d_model = d_model.ok() ? *d_model : -1;
    if (lengths.ok() && d_model.ok() && !masks.ok()) overrides.refused_input = masks.status();
    absl::Status status;
    {
      py::gil_scoped_release no_gil;
      status = (balancer_.get()->*step_call)(
          lengths.ok() ? *lengths : std::vector<int64_t>{-1}, overrides,
          masks.ok() ? *masks : std::vector<AttentionMask>());
    }
    ThrowIfError(lengths.status());
    ThrowIfError(d_model.status());
    // Refused masks: every rank's error names this rank; raise the same.
    if (!overrides.refused_input.ok() && !status.ok()) ThrowIfError(status);
    ThrowIfError(masks.status());
    ThrowIfError(status);
    if (!masks_json.has_value()) return std::nullopt;
    return MasksJson(*masks).value_or("[]");
  }

  std::unique_ptr<SequenceBalancer> balancer_;
  std::map<std::string, at::Tensor> lengths_cache_;
};

// `size` balancers in this process, one per rank of a TensorHubTransport on
// `args.device` (each made on a thread of its own: making one agrees with
// its peers). Raises the lowest rank's error.
std::vector<std::unique_ptr<BalancerBinding>> OverTensorHub(int size, const BalancerArgs& args,
                                                             double timeout_seconds) {
  if (size < 1 || size > 1024) {
    ThrowIfError(
        absl::InvalidArgumentError(absl::StrCat("size: needs 1 to 1024 ranks, got ", size)));
  }
  if (!(timeout_seconds > 0)) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat("timeout_seconds: needs a time > 0, got ", timeout_seconds)));
  }
  const c10::Device device = ValueOrThrow(BalancerBinding::ParseDevice(args.device));
  std::vector<std::unique_ptr<TensorHubTransport>> group =
      TensorHubTransport::CreateGroup(size, device, absl::Seconds(timeout_seconds));
  std::vector<std::unique_ptr<BalancerBinding>> balancers(size);
  std::vector<std::string> errors(size);
  {
    py::gil_scoped_release no_gil;
    std::vector<std::thread> threads;
    for (int r = 0; r < size; ++r) {
      threads.emplace_back([&, r] {
        try {
          balancers[r] = std::make_unique<BalancerBinding>(
              std::shared_ptr<Transport>(std::move(group[r])), args);
        } catch (const std::exception& e) {
          errors[r] = absl::StrCat("rank ", r, ": ", e.what());
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (const std::string& error : errors) {
    if (!error.empty()) ThrowIfError(absl::InvalidArgumentError(error));
  }
  return balancers;
}

}  // namespace

void BindBalancer(py::module_& m) {
  py::class_<BalancerArgs>(m, "_BalancerArgs")
      .def(py::init<>())
      .def_readwrite("device", &BalancerArgs::device)
      .def_readwrite("topology", &BalancerArgs::topology)
      .def_readwrite("gamma", &BalancerArgs::gamma)
      .def_readwrite("planner_address", &BalancerArgs::planner_address)
      .def_readwrite("job_id", &BalancerArgs::job_id)
      .def_readwrite("group_id", &BalancerArgs::group_id)
      .def_readwrite("d_model", &BalancerArgs::d_model)
      .def_readwrite("max_tokens_per_gpu", &BalancerArgs::max_tokens_per_gpu)
      .def_readwrite("rank_speeds", &BalancerArgs::rank_speeds)
      .def_readwrite("learn_rank_speeds", &BalancerArgs::learn_rank_speeds)
      .def_readwrite("cost_model", &BalancerArgs::cost_model)
      .def_readwrite("cost_table_json", &BalancerArgs::cost_table_json)
      .def_readwrite("locality", &BalancerArgs::locality)
      .def_readwrite("planner_deadline_s", &BalancerArgs::planner_deadline_s)
      .def_readwrite("planner_mode", &BalancerArgs::planner_mode)
      .def_readwrite("require_planner", &BalancerArgs::require_planner)
      .def_readwrite("log_steps", &BalancerArgs::log_steps)
      .def_readwrite("planner_token", &BalancerArgs::planner_token)
      .def_readwrite("planner_mesh_tls", &BalancerArgs::planner_mesh_tls)
      .def_readwrite("planner_tls_ca", &BalancerArgs::planner_tls_ca)
      .def_readwrite("planner_tls_cert", &BalancerArgs::planner_tls_cert)
      .def_readwrite("planner_tls_key", &BalancerArgs::planner_tls_key)
      .def_readwrite("first_step", &BalancerArgs::first_step)
      .def_readwrite("use_fitted_gamma", &BalancerArgs::use_fitted_gamma)
      .def_readwrite("agree_on_errors", &BalancerArgs::agree_on_errors)
      .def_readwrite("agree_every_exchange", &BalancerArgs::agree_every_exchange)
      .def_property(
          "machine", [](const BalancerArgs& args) { return MachineToDict(args.machine); },
          [](BalancerArgs& args, const py::dict& fields) { args.machine = MachineFromDict(fields); });

  m.def(
      "_encoded_settings",
      [](const BalancerArgs& args) {
        return py::bytes(EncodeSettings(SharedSettingsOf(OptionsOf(args))));
      },
      py::arg("args"),
      "This rank's report of the settings every rank's balancer must share, encoded; raises "
      "on a bad argument.");
  m.def(
      "_encoded_refusal",
      [](const std::string& why) {
        return py::bytes(EncodeSettingsRefusal(absl::InvalidArgumentError(why)));
      },
      py::arg("why"), "This rank's report that it refused its own arguments, encoded.");
  m.def(
      "_check_settings_agree",
      [](const std::vector<std::string>& encoded) { ThrowIfError(CheckSettingsAgree(encoded)); },
      py::arg("encoded"),
      "Every rank's reports, judged alike on every rank: raises ValueError naming the first "
      "rank that refused its arguments, else (FAILED_PRECONDITION) naming the setting and the "
      "ranks unless every rank's settings are the same.");

  py::class_<BalancerBinding>(m, "_SequenceBalancer")
      .def(py::init<ProcessGroupPtr, BagGroups, BalancerArgs, py::object, BagGroups>(),
           py::arg("process_group"), py::arg("bag_groups"), py::arg("args"),
           py::arg("host_group") = py::none(), py::arg("host_bag_groups") = BagGroups())
      .def("plan_routing", &BalancerBinding::PlanRouting, py::arg("local_seq_lens"),
           py::arg("token_dim"), py::arg("masks_json") = std::nullopt,
           py::arg("masks_error") = "")
      .def("prefetch_routing", &BalancerBinding::PrefetchRouting, py::arg("local_seq_lens"),
           py::arg("token_dim"), py::arg("masks_json") = std::nullopt,
           py::arg("masks_error") = "")
      .def("attention_masks", &BalancerBinding::AttentionMasks)
      .def("route", &BalancerBinding::Route, py::arg("tensors"))
      .def("reverse_route", &BalancerBinding::ReverseRoute, py::arg("tensors"))
      .def("pre_attn", &BalancerBinding::PreAttn, py::arg("tensors"))
      .def("post_attn", &BalancerBinding::PostAttn, py::arg("tensors"))
      .def("refuse", &BalancerBinding::Refuse, py::arg("call"), py::arg("message"))
      .def("backward", &BalancerBinding::Backward, py::arg("call"), py::arg("tensors"))
      .def("lengths", &BalancerBinding::Lengths, py::arg("which"), py::arg("device"))
      .def("summary", &BalancerBinding::Summary)
      .def("tables", &BalancerBinding::Tables)
      .def("record_compute_seconds", &BalancerBinding::RecordComputeSeconds, py::arg("seconds"))
      .def("_time_route_and_reverse_in_cpp", &BalancerBinding::TimeRouteAndReverseInCpp,
           py::arg("x"))
      .def_property_readonly("rank", &BalancerBinding::rank)
      .def_property_readonly("world_size", &BalancerBinding::world_size)
      .def_property_readonly("bag_gpus", &BalancerBinding::bag_gpus)
      .def_property_readonly("heads_multiple", &BalancerBinding::heads_multiple)
      .def_property_readonly("step", &BalancerBinding::step)
      .def_property_readonly("planned", &BalancerBinding::planned)
      .def_property_readonly("planned_total_tokens", &BalancerBinding::planned_total_tokens)
      .def_property_readonly("planned_d_model", &BalancerBinding::planned_d_model)
      .def_property_readonly("source", &BalancerBinding::source)
      .def_static("_over_tensor_hub", &OverTensorHub, py::arg("size"), py::arg("args"),
                  py::arg("timeout_seconds") = 60.0,
                  "`size` balancers in this process over one TensorHubTransport on "
                  "args.device: each rank's rows are copied between tensors on that device "
                  "(one GPU playing several ranks; the GPU check's hub_layout). Every rank's "
                  "calls must come from a thread of its own, all on one CUDA stream.");
}

}  // namespace python
}  // namespace knapformer
