#include "client/sequence_balancer.h"

#include <map>
#include <numeric>
#include <stdexcept>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/graph_task.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/rank_report.h"
#include "client/route_layout.h"
#include "client/row_exchange.h"
#include "client/settings_agreement.h"
#include "common/log.h"
#include "planner/advice.h"
#include "planner/auto_layout.h"
#include "planner/machine.h"
#include "planner/rank_speeds.h"
#include "planner/topology.h"
#include "proto/plan_proto.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

// Runs a tensor operation; transport failures and torch's own errors
// (wrong device, dtype...) become a status.
template <typename Op>
auto Guarded(Op&& op) -> absl::StatusOr<decltype(op())> {
  try {
    return op();
  } catch (const TransportError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
}

// A tensor call's name, as errors and the books know it.
const char* CallName(SequenceBalancer::Call call) {
  switch (call) {
    case SequenceBalancer::Call::kRoute:
      return "route";
    case SequenceBalancer::Call::kReverseRoute:
      return "reverse_route";
    case SequenceBalancer::Call::kPreAttn:
      return "pre_attn";
    case SequenceBalancer::Call::kPostAttn:
      return "post_attn";
  }
  return "?";
}

bool InBag(SequenceBalancer::Call call) {
  return call == SequenceBalancer::Call::kPreAttn || call == SequenceBalancer::Call::kPostAttn;
}

absl::StatusOr<at::Tensor> Only(absl::StatusOr<std::vector<at::Tensor>> tensors) {
  if (!tensors.ok()) return tensors.status();
  return std::move((*tensors)[0]);
}

}  // namespace

struct SequenceBalancer::Rep {
  Transport* world = nullptr;
  // This step's bag: null in a single-GPU bag.
  std::shared_ptr<Transport> bag;
  // OwnerTensor of the world (when the balancer shares its ownership) and of
  // the bag, kept by every autograd node that moves over them.
  at::Tensor world_owner, bag_owner;
  int bag_gpus = 1;
  int bag_first_rank = 0;
  // Every multi-GPU bag this rank may be in, by GPUs, made in Create: the
  // block of that size holding this rank. A fixed topology has one.
  struct PreparedBag {
    int first_rank = 0;
    std::vector<int> ranks;  // world ranks, by bag position
    std::shared_ptr<Transport> transport;
    at::Tensor owner;
  };
  std::map<int, PreparedBag> prepared_bags;
  bool auto_layout = false;
  bool machine_given = false;        // options.machine is not Machine()'s
  bool noted_one_gpu_bags = false;   // NoteOneGpuBags said its line
  int heads_multiple = 1;
  Agreement agreement = Agreement::kOncePerStep;
  std::vector<int> world_ranks;  // 0..size-1: the world's members are themselves
  std::vector<int> bag_ranks;    // world ranks of this step's bag, by position
  // What each group agreed this step about each call (row_exchange.h).
  ExchangeBook world_book, bag_book;
  std::unique_ptr<PlannerClient> planner;
  uint64_t next_step = 0;
  bool planned = false;
  int32_t default_d_model = 0;
  int64_t default_token_bytes = 0;
  int64_t routed_token_bytes = 0;  // of the last RouteTensors
  v1::StepSpec spec;
  bool has_timing = false;
  v1::StepTiming timing;  // of the current step, sent with the next plan
  // The step PrefetchRouting started, if any.
  uint64_t prefetched_step = std::numeric_limits<uint64_t>::max();

  // The spec of `step`: the balancer's, with this step's overrides.
  v1::StepSpec SpecOf(uint64_t step, const StepOverrides& overrides) const {
    v1::StepSpec out = spec;
    out.set_step(step);
    out.set_d_model(overrides.d_model != 0 ? overrides.d_model : default_d_model);
    out.set_token_bytes(overrides.token_bytes >= 0 ? overrides.token_bytes
                        : default_token_bytes > 0  ? default_token_bytes
                                                   : routed_token_bytes);
    return out;
  }
  // The last exchange's chain link this step (MoveRowsFunction), undefined
  // before the first exchange that records a backward.
  at::Tensor backward_chain;
  at::Tensor chain_started;  // the chain's flag (RowMove::chain_started)
  // OnDevice's copies of this step's row orders, by (host tensor, device,
  // stream id).
  std::map<std::tuple<const void*, std::string, int64_t>, at::Tensor> device_copies;

  // The current step.
  StepPlan step_plan;
  std::vector<int64_t> input_lengths;
  int64_t input_rows = 0;
  std::vector<int64_t> send_rows, recv_rows;  // route, per world rank
  RowOrder send_order;                        // packed input -> send buffer
  std::vector<int64_t> routed_lengths;
  int64_t routed_rows = 0;
  // Ulysses, per bag position: rows this rank sends each (its routed rows,
  // one head slice each) and receives from each.
  std::vector<int64_t> ulysses_send_rows, ulysses_recv_rows;
  RowOrder sequence_order;  // received (position, sequence) -> (sequence, position)
  std::vector<int64_t> attention_lengths;
  int64_t attention_rows = 0;

  void NoteOneGpuBags();
  // Under "auto", takes this step's bag from the plan among the prepared
  // ones; Internal when the plan names a bag that was not prepared.
  absl::Status SelectBag();
  absl::Status Derive(const std::vector<int64_t>& lengths);
  absl::Status CheckRows(const std::vector<at::Tensor>& xs, int64_t rows, const char* what,
                         const char* expected) const;
  absl::Status CheckHeads(const std::vector<at::Tensor>& xs, const char* what,
                          bool whole_heads) const;
  // An exchange over the world (routes) or the bag (Ulysses) of `xs`
  // (their signature: the caller's tensors, whatever reshaping follows).
  // `in_book`: a forward exchange, agreed as the group's book says (else
  // a backward one's forward, which BackwardOf reverses).
  RowMove WorldMove(const char* what, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv, RowOrder before, RowOrder after,
                    const std::vector<at::Tensor>& xs, bool in_book = true) {
    return MoveOf(world, world_owner, world_ranks, in_book ? &world_book : nullptr, what, send,
                  recv, std::move(before), std::move(after), xs);
  }
  RowMove BagMove(const char* what, const std::vector<int64_t>& send,
                  const std::vector<int64_t>& recv, RowOrder before, RowOrder after,
                  const std::vector<at::Tensor>& xs, bool in_book = true) {
    return MoveOf(bag.get(), bag_owner, bag_ranks, in_book ? &bag_book : nullptr, what, send,
                  recv, std::move(before), std::move(after), xs);
  }
  // The move of call `which` by the step's plan, its orders on `device`.
  RowMove CallMove(SequenceBalancer::Call which, const c10::Device& device,
                   const std::vector<at::Tensor>& xs, bool in_book = true) {
    const char* what = CallName(which);
    switch (which) {
      case SequenceBalancer::Call::kRoute:
        return WorldMove(what, send_rows, recv_rows, OnDevice(send_order, device), {}, xs,
                         in_book);
      case SequenceBalancer::Call::kReverseRoute:
        return WorldMove(what, recv_rows, send_rows, {}, OnDevice(send_order, device).Inverted(),
                         xs, in_book);
      case SequenceBalancer::Call::kPreAttn: {  // position p gets its heads of every row
        RowMove move = BagMove(what, ulysses_send_rows, ulysses_recv_rows, {},
                               OnDevice(sequence_order, device), xs, in_book);
        move.input_groups = bag_gpus;
        return move;
      }
      case SequenceBalancer::Call::kPostAttn: {  // and gives them back
        RowMove move = BagMove(what, ulysses_recv_rows, ulysses_send_rows,
                               OnDevice(sequence_order, device).Inverted(), {}, xs, in_book);
        move.output_groups = bag_gpus;
        return move;
      }
    }
    return {};
  }
  RowMove MoveOf(Transport* transport, const at::Tensor& owner, const std::vector<int>& ranks,
                 ExchangeBook* book, const char* what, const std::vector<int64_t>& send,
                 const std::vector<int64_t>& recv, RowOrder before, RowOrder after,
                 const std::vector<at::Tensor>& xs) const {
    RowMove move;
    move.transport = transport;
    move.what = what;
    move.agreement = agreement;
    move.owner = owner;
    move.send_rows = &send;
    move.recv_rows = &recv;
    move.before = std::move(before);
    move.after = std::move(after);
    move.world_ranks = ranks;
    move.step = spec.step();
    move.book = book;
    if (book != nullptr) move.ordinal = book->Next(what);
    move.signature = SignatureOf(xs);
    return move;
  }
  // The exchange as an autograd node, chained after this step's previous
  // one when it records a backward.
  std::vector<at::Tensor> Move(at::TensorList xs, const RowMove& move);
  // `order` with its tensors on `device`: copied once per step, device and
  // stream, not at every exchange, from pinned memory without waiting (a
  // copy from pageable host memory to a GPU synchronises the host with it).
  // Per stream: each copy is made on the stream that reads it, so that no
  // exchange reads an index before its copy has landed, and the caching
  // allocator (which orders a block's reuse by its allocation stream) never
  // hands it out while another stream still reads it.
  RowOrder OnDevice(const RowOrder& order, const c10::Device& device) {
    if (device.is_cpu()) return order;
    const int64_t stream =
        c10::impl::getDeviceGuardImpl(device.type())->getStream(device).id();
    auto copy = [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined()) return t;
      at::Tensor& cached = device_copies[{t.unsafeGetTensorImpl(), device.str(), stream}];
      if (!cached.defined()) {
        cached = device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true)
                                  : t.to(device);
      }
      return cached;
    };
    return {copy(order.index), copy(order.inverse), order.host_index, order.host_inverse};
  }
  // A local error of an exchange's entry point, in place of the exchange:
  // agreed with the group as the call's exchanges are (RefuseExchange), so
  // that no peer waits in it. Without a plan there are no counts: then the
  // error is agreed in one all-gather.
  absl::Status Refused(SequenceBalancer::Call which, const absl::Status& local) {
    if (!planned) {
      // Without a plan this rank's peers may be planning: what it sends is
      // a report of the kind PlanRouting gathers, so that they name this
      // call instead of misreading it (and it names theirs).
      Transport* group = InBag(which) ? bag.get() : world;
      if (agreement == Agreement::kOff || group == nullptr) return local;
      client::RankReport report;
      report.set_call(client::RankReport::UNPLANNED_EXCHANGE);
      *report.mutable_verdict() = VerdictOf(local);
      absl::StatusOr<std::vector<client::RankReport>> all = AllGatherMessages(*group, report);
      if (!all.ok()) return all.status();
      // Peers that were planning have spent that step (a failed plan is a
      // step): so does this rank, so that the next PlanRouting meets them
      // at the same one.
      for (const client::RankReport& theirs : *all) {
        if (theirs.call() == client::RankReport::PLAN ||
            theirs.call() == client::RankReport::PREFETCHED) {
          next_step = theirs.spec().step() + 1;
          break;
        }
      }
      absl::StatusOr<Gathered> digested = Digest(*std::move(all), /*probing_ranks=*/0);
      return digested.ok() ? local : digested.status();
    }
    // The orders are not read: nothing of this rank's moves.
    return RefuseExchange(CallMove(which, c10::Device(c10::kCPU), {}), local);
  }
  // Checks on the tensors of an entry point that every rank must agree on.
  absl::Status CheckDevice(const std::vector<at::Tensor>& xs, const Transport& transport,
                           const char* what) const;
};

// Under auto with no machine given, a step of one-GPU bags only may be the
// price of the machine assumed, not of this one: Ulysses on an H100 node's
// links costs more than a slower GPU would save by it. Said once, by rank 0.
void SequenceBalancer::Rep::NoteOneGpuBags() {
  if (!auto_layout || machine_given || noted_one_gpu_bags || world->rank() != 0) return;
  absl::StatusOr<Topology> layout = Topology::Parse(step_plan.layout);
  if (!layout.ok() || layout->max_bag_gpus() != 1) return;
  noted_one_gpu_bags = true;
  const Machine assumed;
  Log(LogLevel::kInfo,
      absl::StrCat(
          "step ", spec.step(), ": auto kept every GPU in a one-GPU bag (", step_plan.layout,
          "), pricing Ulysses on the machine it assumes without machine=: ",
          absl::StrFormat("%.4g", assumed.flops_per_second / 1e12), " TFLOP/s, ",
          absl::StrFormat("%.4g", assumed.intra_node_bytes_per_second / 1e9),
          " GB/s within a node of ", assumed.gpus_per_node,
          " (an H100 node). On GPUs that compute slower against their links (a CPU, a "
          "smaller GPU) multi-GPU bags pay sooner: pass machine={\"flops_per_second\": "
          "<this device's rate>} (knapformer replay measures it and prints the call)"));
}

absl::Status SequenceBalancer::Rep::SelectBag() {
  if (!auto_layout) return absl::OkStatus();  // the fixed bag, checked by Derive
  const UlyssesBag& planned = step_plan.plan.ulysses;
  bag_gpus = 1;
  bag_first_rank = world->rank();
  bag = nullptr;
  bag_owner = at::Tensor();
  if (planned.gpus == 1 && planned.first_rank == world->rank()) return absl::OkStatus();
  auto it = prepared_bags.find(planned.gpus);
  if (it == prepared_bags.end() || it->second.first_rank != planned.first_rank) {
    return absl::InternalError(absl::StrCat(
        "plan: rank ", world->rank(), " is in a bag of ", planned.gpus, " GPUs from rank ",
        planned.first_rank, ", not one of the aligned blocks prepared for ", spec.topology()));
  }
  bag_gpus = planned.gpus;
  bag_first_rank = planned.first_rank;
  bag = it->second.transport;
  bag_owner = it->second.owner;
  if (bag_ranks != it->second.ranks) bag_book.Clear();  // another group
  bag_ranks = it->second.ranks;
  return absl::OkStatus();
}

absl::Status SequenceBalancer::Rep::Derive(const std::vector<int64_t>& lengths) {
  absl::StatusOr<RouteLayout> layout = DeriveRouteLayout(
      step_plan.plan, lengths, world->rank(), world->size(), bag_gpus, bag_first_rank);
  if (!layout.ok()) return layout.status();
  input_rows = layout->input_rows;
  send_rows = std::move(layout->send_rows);
  recv_rows = std::move(layout->recv_rows);
  send_order = RowOrder::Of(layout->send_index);
  routed_lengths = std::move(layout->routed_lengths);
  routed_rows = layout->routed_rows;
  ulysses_send_rows = std::move(layout->ulysses_send_rows);
  ulysses_recv_rows = std::move(layout->ulysses_recv_rows);
  attention_lengths = std::move(layout->attention_lengths);
  attention_rows = layout->attention_rows;
  // The masks of the sequences attention sees: one each, fitting each one's
  // length, or none in a step without masks. A plan that says otherwise
  // (a faulty service) must not hand the trainer a wrong mask.
  const std::vector<AttentionMask>& masks = step_plan.plan.attention_masks;
  if (!masks.empty() && masks.size() != attention_lengths.size()) {
    return absl::InternalError(absl::StrCat("plan: ", masks.size(),
                                            " attention masks for the ",
                                            attention_lengths.size(),
                                            " sequences attention sees on rank ",
                                            world->rank()));
  }
  for (size_t i = 0; i < masks.size(); ++i) {
    absl::Status fits = CheckMask(attention_lengths[i], masks[i],
                                  absl::StrCat("plan.attention_masks[", i, "]"));
    if (!fits.ok()) return absl::InternalError(fits.message());
  }
  return absl::OkStatus();
}

std::vector<at::Tensor> SequenceBalancer::Rep::Move(at::TensorList xs, const RowMove& move) {
  bool records_backward = false;
  if (at::GradMode::is_enabled()) {
    for (const at::Tensor& x : xs) records_backward = records_backward || x.requires_grad();
  }
  // An exchange recorded during a backward pass (activation checkpointing
  // recomputing a forward) is not chained: linking it to nodes of the pass
  // that is running would make that pass wait on itself.
  if (torch::autograd::get_current_graph_task_nodes_in_graph() != nullptr) {
    records_backward = false;
  }
  if (records_backward && chain_started.defined() && chain_started.item<bool>()) {
    // A backward of the chain so far has begun: this exchange belongs to a
    // new graph (forward, backward, forward again in one step).
    backward_chain = at::Tensor();
    chain_started = at::Tensor();
  }
  if (records_backward && !chain_started.defined()) chain_started = at::zeros({1}, at::kBool);
  RowMove chained = move;
  if (records_backward) chained.chain_started = chain_started;
  std::vector<at::Tensor> chain;
  if (records_backward && backward_chain.defined()) chain.push_back(backward_chain);
  std::vector<at::Tensor> outputs = MoveRowsWithGrad(xs, at::TensorList(chain), chained);
  at::Tensor link = std::move(outputs.back());
  outputs.pop_back();
  if (records_backward) backward_chain = std::move(link);
  return outputs;
}

absl::Status SequenceBalancer::Rep::CheckDevice(const std::vector<at::Tensor>& xs,
                                                const Transport& transport,
                                                const char* what) const {
  const int cuda = transport.cuda_device();
  const c10::Device expected = cuda < 0 ? c10::Device(c10::kCPU) : c10::Device(c10::kCUDA, cuda);
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i].device() != expected) {
      const std::string name = xs.size() == 1 ? "" : absl::StrCat("tensor ", i, " ");
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": ", name, "is on ", xs[i].device().str(), ", but rank ", world->rank(),
          "'s transport moves ", expected.str(), " memory"));
    }
  }
  return absl::OkStatus();
}

absl::Status SequenceBalancer::Rep::CheckRows(const std::vector<at::Tensor>& xs, int64_t rows,
                                              const char* what, const char* expected) const {
  if (!planned) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": no plan for this step yet; call PlanRouting (plan_routing in "
                     "Python) first"));
  }
  if (xs.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no tensors given"));
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string name = xs.size() == 1 ? "" : absl::StrCat("tensor ", i, ": ");
    if (!xs[i].defined() || xs[i].dim() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", name, "needs a tensor of >= 1 dimension"));
    }
    if (xs[i].size(0) != rows) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, xs[i].size(0),
                                                     " rows, rank ", world->rank(), " expects ",
                                                     rows, " (", expected, ") at step ",
                                                     spec.step()));
    }
    if (xs[i].device() != xs[0].device()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, "on ",
                                                     xs[i].device().str(), ", tensor 0 on ",
                                                     xs[0].device().str()));
    }
  }
  return absl::OkStatus();
}

absl::Status SequenceBalancer::Rep::CheckHeads(const std::vector<at::Tensor>& xs,
                                               const char* what, bool whole_heads) const {
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string name = xs.size() == 1 ? "" : absl::StrCat("tensor ", i, ": ");
    if (xs[i].dim() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": ", name, "needs [tokens, heads, ...], got ", xs[i].dim(),
                       " dimension", xs[i].dim() == 1 ? "" : "s"));
    }
    if (xs[i].size(1) != xs[0].size(1)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", name, xs[i].size(1),
                                                     " heads, tensor 0 has ", xs[0].size(1)));
    }
  }
  // Checked against every bag size, not only this rank's bag: a mistake is
  // then the same error on every rank (and every step, under "auto")
  // instead of some bags failing while the others wait for them in the next
  // exchange.
  if (whole_heads && xs[0].size(1) % heads_multiple != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", xs[0].size(1), " heads (dimension 1) do not split over the bags of ",
        spec.topology(), "; heads must be a multiple of ", heads_multiple,
        " (every bag size the topology may use)"));
  }
  return absl::OkStatus();
}

SequenceBalancer::SequenceBalancer(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
SequenceBalancer::~SequenceBalancer() = default;

namespace {

// The bags a rank may be in, as (GPUs, members), smallest first: the fixed
// topology's one bag, or under "auto" the aligned block of every power of
// two from 2 to the largest bag that holds `rank`.
struct BagMembers {
  int gpus;
  std::vector<int> ranks;
};

absl::StatusOr<std::vector<BagMembers>> BagsOfRank(const std::string& topology, int world_size,
                                                   int rank, const Machine& machine,
                                                   std::string* canonical,
                                                   int* heads_multiple) {
  std::vector<BagMembers> bags;
  *heads_multiple = 1;
  if (AutoLayout::Matches(topology)) {
    absl::StatusOr<AutoLayout> layout = AutoLayout::Parse(topology);
    if (!layout.ok()) return layout.status();
    absl::StatusOr<AutoShape> shape = layout->Resolve(world_size, machine);
    if (!shape.ok()) return shape.status();
    *canonical = layout->spec();
    *heads_multiple = shape->max_bag;
    for (int gpus = 2; gpus <= shape->max_bag; gpus *= 2) {
      BagMembers bag{gpus, {}};
      for (int p = 0; p < gpus; ++p) bag.ranks.push_back(rank / gpus * gpus + p);
      bags.push_back(std::move(bag));
    }
    return bags;
  }
  auto parsed = Topology::Parse(topology);
  if (!parsed.ok()) return parsed.status();
  auto layout = World::Create(*parsed, world_size);
  if (!layout.ok()) return layout.status();
  *canonical = parsed->spec();
  for (const Bag& bag : parsed->bags()) *heads_multiple = std::lcm(*heads_multiple, bag.gpus);
  const RankLocation here = layout->Locate(rank);
  BagMembers bag{parsed->bag(here.bag).gpus, {}};
  for (int p = 0; p < bag.gpus; ++p) {
    bag.ranks.push_back(layout->RankOf({here.replica, here.bag, p}));
  }
  bags.push_back(std::move(bag));
  return bags;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SequenceBalancer>> SequenceBalancer::Create(
    SequenceBalancerOptions options, Transport* world) {
  if (world == nullptr) return absl::InvalidArgumentError("world: must not be null");
  // Before anything that could differ between ranks (a bad setting refused
  // here but not there, subgroups of other bags): a rank configured
  // differently fails every rank now instead of hanging them later.
  if (absl::Status agreed = AgreeOnSettings(*world, SharedSettingsOf(options)); !agreed.ok()) {
    return agreed;
  }
  if (absl::Status machine = CheckMachine(options.machine); !machine.ok()) return machine;
  if (absl::Status speeds = CheckRankSpeeds(options.planner.balancer.rank_speeds, world->size());
      !speeds.ok()) {
    return speeds;
  }
  std::string topology;
  int heads_multiple = 1;
  absl::StatusOr<std::vector<BagMembers>> bags =
      BagsOfRank(options.topology, world->size(), world->rank(), options.machine, &topology,
                 &heads_multiple);
  if (!bags.ok()) return bags.status();
  if (options.token_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_bytes: must be >= 0 (0 = learn it from Route), got ", options.token_bytes));
  }

  auto rep = std::make_unique<Rep>();
  rep->world = world;
  rep->next_step = options.first_step;
  rep->default_d_model = options.d_model;
  rep->default_token_bytes = options.token_bytes;
  rep->agreement = !options.agree_on_errors        ? Agreement::kOff
                   : options.agree_every_exchange ? Agreement::kEveryExchange
                                                  : Agreement::kOncePerStep;
  for (int p = 0; p < world->size(); ++p) rep->world_ranks.push_back(p);
  rep->auto_layout = AutoLayout::Matches(topology);
  rep->machine_given = !MachineArgument(options.machine).empty();
  rep->heads_multiple = heads_multiple;
  rep->spec.set_job_id(options.job_id);
  rep->spec.set_group_id(options.group_id);
  rep->spec.set_world_size(world->size());
  rep->spec.set_topology(topology);
  rep->spec.set_d_model(options.d_model);
  rep->spec.set_gamma(options.gamma);
  rep->spec.set_token_bytes(options.token_bytes);
  rep->spec.set_max_tokens_per_gpu(options.max_tokens_per_gpu);
  rep->spec.set_cost_model(CostKindToProto(options.cost_model));
  if (options.measured_attention.has_value()) {
    MeasuredAttentionToProto(*options.measured_attention, rep->spec.mutable_measured_attention());
  }
  rep->spec.set_use_fitted_gamma(options.use_fitted_gamma);
  MachineToProto(options.machine, rep->spec.mutable_machine());
  if (options.locality.has_value()) {
    rep->spec.set_locality(*options.locality ? v1::LOCALITY_ON : v1::LOCALITY_OFF);
  }

  rep->bag_first_rank = world->rank();
  // Smallest first on every rank: a block's members have all made their
  // smaller blocks before they meet in it.
  for (BagMembers& members : *bags) {
    if (!rep->auto_layout) {
      rep->bag_gpus = members.gpus;
      rep->bag_first_rank = members.ranks.front();
    }
    if (members.gpus == 1) continue;
    auto subgroup = world->Subgroup(members.ranks);
    if (!subgroup.ok()) return subgroup.status();
    Rep::PreparedBag& prepared = rep->prepared_bags[members.gpus];
    prepared.first_rank = members.ranks.front();
    prepared.ranks = members.ranks;
    prepared.transport = *std::move(subgroup);
    prepared.owner = OwnerTensor(prepared.transport);
    if (!rep->auto_layout) {
      rep->bag = prepared.transport;
      rep->bag_owner = prepared.owner;
      rep->bag_ranks = prepared.ranks;
    }
  }
  auto planner = PlannerClient::Create(options.planner, world);
  if (!planner.ok()) return planner.status();
  rep->planner = *std::move(planner);
  return std::unique_ptr<SequenceBalancer>(new SequenceBalancer(std::move(rep)));
}

absl::StatusOr<std::unique_ptr<SequenceBalancer>> SequenceBalancer::Create(
    SequenceBalancerOptions options, std::shared_ptr<Transport> world) {
  auto balancer = Create(std::move(options), world.get());
  if (balancer.ok()) (*balancer)->rep_->world_owner = OwnerTensor(std::move(world));
  return balancer;
}

absl::Status SequenceBalancer::PlanRouting(const std::vector<int64_t>& lengths,
                                           const StepOverrides& overrides,
                                           const std::vector<AttentionMask>& masks) {
  Rep& r = *rep_;
  r.planned = false;
  r.spec = r.SpecOf(r.next_step++, overrides);
  // A prefetched step sent its timing with the prefetch; one recorded since
  // goes with the next request.
  const bool prefetched = r.prefetched_step == r.spec.step();
  const bool send_timing = r.has_timing && !prefetched;
  auto plan = r.planner->Plan(r.spec, lengths, send_timing ? &r.timing : nullptr, masks,
                              overrides.refused_input);
  if (send_timing) r.has_timing = false;
  if (!plan.ok()) return plan.status();
  r.step_plan = *std::move(plan);
  r.input_lengths = lengths;
  r.backward_chain = at::Tensor();
  r.chain_started = at::Tensor();
  r.device_copies.clear();
  r.world_book.StartStep();
  r.bag_book.StartStep();
  absl::Status derived = r.SelectBag();
  if (derived.ok()) derived = r.Derive(lengths);
  if (r.auto_layout) {
    // The bag checks below run within bags this step's plan formed: every
    // rank must know its bag is sound before any waits in one.
    derived = AgreeOnStatus(*r.world, derived);
    if (!derived.ok()) return derived;
  }
  // Once per step instead of per exchange: every Route, ReverseRoute,
  // PreAttn and PostAttn of the step moves these counts or their transpose.
  // A rank whose plan cannot be used still takes part in both checks, with
  // counts no peer can match, so that nobody waits for it.
  auto check = [&](Transport& t, const std::vector<int64_t>& send,
                   const std::vector<int64_t>& recv) {
    if (derived.ok()) return t.CheckRowCounts(send, recv);
    return t.CheckRowCounts(std::vector<int64_t>(t.size(), 0),
                            std::vector<int64_t>(t.size(), -1));
  };
  const absl::Status bag_checked =
      r.bag != nullptr ? check(*r.bag, r.ulysses_send_rows, r.ulysses_recv_rows)
                       : absl::OkStatus();
  const absl::Status world_checked = check(*r.world, r.send_rows, r.recv_rows);
  // The world check is the same on every rank, but a bag's is seen by that
  // bag only: the whole world agrees on the first reason before anyone
  // routes.
  const absl::Status local = !derived.ok()       ? derived
                             : !bag_checked.ok() ? bag_checked
                                                 : world_checked;
  absl::Status agreed = AgreeOnStatus(*r.world, local);
  if (!agreed.ok()) return agreed;
  // Only now: its size is what the bag's peers confirmed they send.
  r.sequence_order = RowOrder::Of(AttentionIndex(r.ulysses_recv_rows, r.step_plan.plan.ulysses));
  r.planned = true;
  r.NoteOneGpuBags();
  return absl::OkStatus();
}

absl::Status SequenceBalancer::PrefetchRouting(const std::vector<int64_t>& lengths,
                                               const StepOverrides& overrides,
                                               const std::vector<AttentionMask>& masks) {
  Rep& r = *rep_;
  const v1::StepSpec spec = r.SpecOf(r.next_step, overrides);
  absl::Status started =
      r.planner->Prefetch(spec, lengths, r.has_timing ? &r.timing : nullptr, masks,
                          overrides.refused_input);
  if (!started.ok()) return started;
  r.has_timing = false;
  r.prefetched_step = spec.step();
  return absl::OkStatus();
}

void SequenceBalancer::RecordComputeSeconds(double seconds) {
  if (!rep_->planned || !(seconds > 0)) return;
  rep_->timing.set_step(rep_->spec.step());
  rep_->timing.set_compute_seconds(seconds);
  rep_->has_timing = true;
}

const StepPlan& SequenceBalancer::step_plan() const { return rep_->step_plan; }
uint64_t SequenceBalancer::step() const { return rep_->spec.step(); }
const v1::StepSpec& SequenceBalancer::spec() const { return rep_->spec; }
const std::vector<int64_t>& SequenceBalancer::routed_lengths() const {
  return rep_->routed_lengths;
}
const std::vector<int64_t>& SequenceBalancer::input_lengths() const {
  return rep_->input_lengths;
}
const std::vector<AttentionMask>& SequenceBalancer::attention_masks() const {
  return rep_->step_plan.plan.attention_masks;
}
const std::vector<int64_t>& SequenceBalancer::attention_lengths() const {
  return rep_->attention_lengths;
}
int SequenceBalancer::bag_gpus() const { return rep_->bag_gpus; }
int SequenceBalancer::bag_first_rank() const { return rep_->bag_first_rank; }
int SequenceBalancer::heads_multiple() const { return rep_->heads_multiple; }
int64_t SequenceBalancer::routed_token_bytes() const { return rep_->routed_token_bytes; }

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::RouteTensors(
    const std::vector<at::Tensor>& xs) const {
  Rep& r = *rep_;
  absl::Status ok = r.CheckRows(xs, r.input_rows, "route", "the sum of its sequence lengths");
  if (ok.ok()) ok = r.CheckDevice(xs, *r.world, "route");
  if (!ok.ok()) return r.Refused(Call::kRoute, ok);
  int64_t token_bytes = 0;
  for (const at::Tensor& x : xs) token_bytes += RowElements(x) * x.element_size();
  r.routed_token_bytes = token_bytes;
  const RowMove move = r.CallMove(Call::kRoute, xs[0].device(), xs);
  return Guarded([&] { return r.Move(at::TensorList(xs), move); });
}

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::ReverseRouteTensors(
    const std::vector<at::Tensor>& ys) const {
  Rep& r = *rep_;
  absl::Status ok = r.CheckRows(ys, r.routed_rows, "reverse_route", "the sum of routed_lengths");
  if (ok.ok()) ok = r.CheckDevice(ys, *r.world, "reverse_route");
  if (!ok.ok()) return r.Refused(Call::kReverseRoute, ok);
  const RowMove move = r.CallMove(Call::kReverseRoute, ys[0].device(), ys);
  return Guarded([&] { return r.Move(at::TensorList(ys), move); });
}

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::PreAttnTensors(
    const std::vector<at::Tensor>& xs) const {
  Rep& r = *rep_;
  absl::Status ok = r.CheckRows(xs, r.routed_rows, "pre_attn", "the sum of routed_lengths");
  if (ok.ok()) ok = r.CheckHeads(xs, "pre_attn", /*whole_heads=*/true);
  // A single-GPU bag moves nothing: its errors are its own.
  if (r.bag == nullptr) return ok.ok() ? absl::StatusOr<std::vector<at::Tensor>>(xs) : ok;
  if (ok.ok()) ok = r.CheckDevice(xs, *r.bag, "pre_attn");
  if (!ok.ok()) return r.Refused(Call::kPreAttn, ok);
  return Guarded([&] {
    const RowMove move = r.CallMove(Call::kPreAttn, xs[0].device(), xs);
    return r.Move(at::TensorList(xs), move);
  });
}

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::PostAttnTensors(
    const std::vector<at::Tensor>& ys) const {
  Rep& r = *rep_;
  absl::Status ok = r.CheckRows(ys, r.attention_rows, "post_attn", "the sum of attention_lengths");
  if (ok.ok()) ok = r.CheckHeads(ys, "post_attn", /*whole_heads=*/false);
  if (r.bag == nullptr) return ok.ok() ? absl::StatusOr<std::vector<at::Tensor>>(ys) : ok;
  if (ok.ok()) ok = r.CheckDevice(ys, *r.bag, "post_attn");
  if (!ok.ok()) return r.Refused(Call::kPostAttn, ok);
  return Guarded([&] {
    const RowMove move = r.CallMove(Call::kPostAttn, ys[0].device(), ys);
    return r.Move(at::TensorList(ys), move);
  });
}

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::BackwardOf(
    Call which, const std::vector<at::Tensor>& grads) const {
  Rep& r = *rep_;
  const char* name = CallName(which);
  if (!r.planned) {
    return absl::FailedPreconditionError(
        absl::StrCat(name, " (backward): no plan for this step; run the backward before the "
                           "next PlanRouting"));
  }
  if (grads.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, " (backward): no tensors given"));
  }
  if (InBag(which) && r.bag == nullptr) return grads;  // a single-GPU bag moved nothing
  return Guarded([&]() -> std::vector<at::Tensor> {
    const RowMove back = Reversed(r.CallMove(which, grads[0].device(), grads, false));
    return MoveRowsOnce(at::TensorList(grads), back);
  });
}

absl::Status SequenceBalancer::RefuseCall(Call which, const absl::Status& reason) const {
  Rep& r = *rep_;
  if (InBag(which) && r.bag == nullptr) return reason;  // a single-GPU bag moves nothing
  absl::Status agreed = r.Refused(which, reason);
  return agreed.ok() ? reason : agreed;
}

absl::StatusOr<at::Tensor> SequenceBalancer::Route(const at::Tensor& x) const {
  return Only(RouteTensors({x}));
}
absl::StatusOr<at::Tensor> SequenceBalancer::ReverseRoute(const at::Tensor& y) const {
  return Only(ReverseRouteTensors({y}));
}
absl::StatusOr<at::Tensor> SequenceBalancer::PreAttn(const at::Tensor& x) const {
  return Only(PreAttnTensors({x}));
}
absl::StatusOr<at::Tensor> SequenceBalancer::PostAttn(const at::Tensor& y) const {
  return Only(PostAttnTensors({y}));
}

}  // namespace knapformer
