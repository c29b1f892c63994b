// knapformer._C.SequenceBalancer: client/sequence_balancer.h over the
// trainer's torch.distributed process group. The Python class of the same
// name (knapformer/sequence_balancer.py) makes the bag subgroups and shapes
// the results like the reference implementation's.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "client/environment.h"
#include "client/sequence_balancer.h"
#include "planner/balance_stats.h"
#include "planner/cost_model.h"
#include "python/bindings.h"
#include "python/status_exception.h"
#include "transport/c10d_transport.h"

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
  std::optional<bool> locality;
  std::optional<double> planner_deadline_s;
  uint64_t first_step = 0;
  bool use_fitted_gamma = false;
};

// A Python list/tuple of ints or a 1-D integer tensor, as lengths.
absl::StatusOr<std::vector<int64_t>> LengthsFrom(const py::handle& object) {
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
    // Integers only (bool is not a length); numpy and 0-d tensors work through __index__.
    if (py::isinstance<py::bool_>(item) || !PyIndex_Check(item.ptr())) {
      return absl::InvalidArgumentError(absl::StrCat("local_seq_lens[", i, "]: ",
                                                     std::string(py::repr(item)),
                                                     " is not an integer"));
    }
    py::int_ value = py::reinterpret_steal<py::int_>(PyNumber_Index(item.ptr()));
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
    if (overflow != 0) {
      return absl::InvalidArgumentError(absl::StrCat("local_seq_lens[", i, "]: ",
                                                     std::string(py::repr(item)),
                                                     " is outside [0, ", CostModel::kMaxLength,
                                                     "]"));
    }
    lengths.push_back(v);
  }
  return lengths;
}

class BalancerBinding {
 public:
  BalancerBinding(ProcessGroupPtr group, BagGroups bag_groups, BalancerArgs args)
      : device_(ValueOrThrow(ParseDevice(args.device))) {
    CostKind kind = ValueOrThrow(ParseCostKind(args.cost_model, "cost_model"));
    SequenceBalancerOptions options;
    std::string job_id = "default", group_id;
    ThrowIfError(ApplyClientEnvironment(&options.planner, &job_id, &group_id));
    if (args.planner_address.has_value()) options.planner.address = *args.planner_address;
    if (args.job_id.has_value()) job_id = *args.job_id;
    if (args.group_id.has_value()) group_id = *args.group_id;
    if (args.planner_deadline_s.has_value()) {
      if (!(*args.planner_deadline_s > 0)) {
        ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
            "planner_deadline: must be > 0 seconds, got ", *args.planner_deadline_s)));
      }
      options.planner.call_deadline = absl::Seconds(*args.planner_deadline_s);
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
    options.gamma = args.gamma;
    options.max_tokens_per_gpu = args.max_tokens_per_gpu;
    options.first_step = args.first_step;
    options.use_fitted_gamma = args.use_fitted_gamma;
    options.locality = args.locality;
    fixed_d_model_ = args.d_model != 0;

    C10dTransportOptions transport;
    transport.device = device_;
    transport.new_subgroup = [bag_groups = std::move(bag_groups)](
                                 const std::vector<int>& ranks, int) -> ProcessGroupPtr {
      auto it = bag_groups.find(ranks);
      if (it == bag_groups.end()) {
        throw std::runtime_error("no process group was made for this bag's ranks");
      }
      return it->second;
    };
    py::gil_scoped_release no_gil;
    world_ = ValueOrThrow(C10dTransport::Create(std::move(group), std::move(transport)));
    balancer_ = ValueOrThrow(SequenceBalancer::Create(std::move(options), world_.get()));
  }

  // Collective. A rank whose lengths cannot be read still joins the step
  // with a length no planner accepts, so every rank fails it together; that
  // rank raises the precise reason.
  void PlanRouting(const py::handle& local_seq_lens, int64_t token_dim) {
    absl::StatusOr<std::vector<int64_t>> lengths = LengthsFrom(local_seq_lens);
    StepOverrides overrides;
    if (!fixed_d_model_) {
      if (token_dim < 1 || token_dim > CostModel::kMaxDModel) {
        // The same on every rank that passes it; a rank that differs is
        // refused as a spec mismatch by the planner.
        overrides.d_model = -1;
      } else {
        overrides.d_model = static_cast<int32_t>(token_dim);
      }
    }
    lengths_cache_.clear();
    absl::Status status;
    {
      py::gil_scoped_release no_gil;
      status = balancer_->PlanRouting(lengths.ok() ? *lengths : std::vector<int64_t>{-1},
                                      overrides);
    }
    ThrowIfError(lengths.status());
    if (!status.ok() && overrides.d_model == -1) {
      ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
          "token_dim: ", token_dim, " is outside [1, ", CostModel::kMaxDModel,
          "] (it is the cost model's d_model; pass d_model= to the SequenceBalancer to fix it)")));
    }
    ThrowIfError(status);
  }

  std::vector<at::Tensor> Route(const std::vector<at::Tensor>& xs) const {
    return Call([&] { return balancer_->RouteTensors(xs); });
  }
  std::vector<at::Tensor> ReverseRoute(const std::vector<at::Tensor>& ys) const {
    return Call([&] { return balancer_->ReverseRouteTensors(ys); });
  }
  std::vector<at::Tensor> PreAttn(const std::vector<at::Tensor>& xs) const {
    return Call([&] { return balancer_->PreAttnTensors(xs); });
  }
  std::vector<at::Tensor> PostAttn(const std::vector<at::Tensor>& ys) const {
    return Call([&] { return balancer_->PostAttnTensors(ys); });
  }

  // int32 lengths on `device`, made once per step and device: "chunk"
  // (routed_lengths), "sequence" (this rank's own) or "attention".
  at::Tensor Lengths(const std::string& which, const std::string& device_name) {
    const c10::Device device = ValueOrThrow(ParseDevice(device_name));
    const std::string key = absl::StrCat(which, "@", device.str());
    auto it = lengths_cache_.find(key);
    if (it != lengths_cache_.end()) return it->second;
    const std::vector<int64_t>* values = which == "chunk"       ? &balancer_->routed_lengths()
                                         : which == "sequence"  ? &balancer_->input_lengths()
                                         : which == "attention" ? &balancer_->attention_lengths()
                                                                : nullptr;
    if (values == nullptr) ThrowIfError(absl::InvalidArgumentError("which: unknown lengths"));
    at::Tensor lengths = at::tensor(*values, at::kLong).to(at::kInt).to(device);
    lengths_cache_.emplace(key, lengths);
    return lengths;
  }

  py::dict Summary() const {
    const StepPlan& step = balancer_->step_plan();
    const v1::StepSpec& spec = balancer_->spec();
    const BalanceStats before = ComputeBalanceStats(step.workload_before);
    const BalanceStats after = ComputeBalanceStats(step.workload_after);
    const int64_t token_bytes =
        balancer_->routed_token_bytes() > 0 ? balancer_->routed_token_bytes() : spec.token_bytes();
    py::dict summary;
    summary["step"] = balancer_->step();
    summary["source"] = PlanSourceName(step.source);
    summary["rank"] = world_->rank();
    summary["world_size"] = world_->size();
    summary["topology"] = spec.topology();
    summary["bag_gpus"] = balancer_->bag_gpus();
    summary["d_model"] = spec.d_model();
    summary["gamma"] = spec.gamma();
    summary["workload_before"] = step.workload_before;
    summary["workload_after"] = step.workload_after;
    summary["wir_before"] = before.wir;
    summary["wir_after"] = after.wir;
    summary["max_over_mean_before"] = before.max_over_mean;
    summary["max_over_mean_after"] = after.max_over_mean;
    summary["total_tokens"] = step.total_tokens;
    summary["moved_tokens"] = step.moved_tokens;
    summary["token_bytes"] = token_bytes;
    summary["moved_bytes"] =
        token_bytes > 0 && step.moved_tokens > INT64_MAX / token_bytes
            ? INT64_MAX
            : step.moved_tokens * token_bytes;
    summary["seq_lens"] = balancer_->input_lengths();
    summary["chunk_lens"] = balancer_->routed_lengths();
    summary["attention_seq_lens"] = balancer_->attention_lengths();
    return summary;
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

  void RecordComputeSeconds(double seconds) { balancer_->RecordComputeSeconds(seconds); }
  int rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  int bag_gpus() const { return balancer_->bag_gpus(); }
  int heads_multiple() const { return balancer_->heads_multiple(); }
  uint64_t step() const { return balancer_->step(); }
  std::string source() const { return PlanSourceName(balancer_->step_plan().source); }

 private:
  static absl::StatusOr<c10::Device> ParseDevice(const std::string& name) {
    try {
      return c10::Device(name);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("device: '", name, "' is not a device"));
    }
  }

  template <typename Op>
  std::vector<at::Tensor> Call(Op&& op) const {
    absl::StatusOr<std::vector<at::Tensor>> result;
    {
      py::gil_scoped_release no_gil;
      result = op();
    }
    return ValueOrThrow(std::move(result));
  }

  c10::Device device_;
  bool fixed_d_model_ = false;
  std::unique_ptr<Transport> world_;
  std::unique_ptr<SequenceBalancer> balancer_;
  std::map<std::string, at::Tensor> lengths_cache_;
};

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
      .def_readwrite("cost_model", &BalancerArgs::cost_model)
      .def_readwrite("locality", &BalancerArgs::locality)
      .def_readwrite("planner_deadline_s", &BalancerArgs::planner_deadline_s)
      .def_readwrite("first_step", &BalancerArgs::first_step)
      .def_readwrite("use_fitted_gamma", &BalancerArgs::use_fitted_gamma);

  py::class_<BalancerBinding>(m, "_SequenceBalancer")
      .def(py::init<ProcessGroupPtr, BagGroups, BalancerArgs>(), py::arg("process_group"),
           py::arg("bag_groups"), py::arg("args"))
      .def("plan_routing", &BalancerBinding::PlanRouting, py::arg("local_seq_lens"),
           py::arg("token_dim"))
      .def("route", &BalancerBinding::Route, py::arg("tensors"))
      .def("reverse_route", &BalancerBinding::ReverseRoute, py::arg("tensors"))
      .def("pre_attn", &BalancerBinding::PreAttn, py::arg("tensors"))
      .def("post_attn", &BalancerBinding::PostAttn, py::arg("tensors"))
      .def("lengths", &BalancerBinding::Lengths, py::arg("which"), py::arg("device"))
      .def("summary", &BalancerBinding::Summary)
      .def("record_compute_seconds", &BalancerBinding::RecordComputeSeconds, py::arg("seconds"))
      .def("_time_route_and_reverse_in_cpp", &BalancerBinding::TimeRouteAndReverseInCpp,
           py::arg("x"))
      .def_property_readonly("rank", &BalancerBinding::rank)
      .def_property_readonly("world_size", &BalancerBinding::world_size)
      .def_property_readonly("bag_gpus", &BalancerBinding::bag_gpus)
      .def_property_readonly("heads_multiple", &BalancerBinding::heads_multiple)
      .def_property_readonly("step", &BalancerBinding::step)
      .def_property_readonly("source", &BalancerBinding::source);
}

}  // namespace python
}  // namespace knapformer
