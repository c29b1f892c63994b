#include "client/sequence_balancer.h"

#include <map>
#include <numeric>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/host_tensor_cache.h"
#include "client/route_layout.h"
#include "client/settings_agreement.h"
#include "planner/auto_layout.h"
#include "planner/machine.h"
#include "planner/topology.h"
#include "proto/plan_proto.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

// A transport failure inside an exchange; carries the status through torch's
// autograd (which rethrows exceptions as they are) back to the API.
class TransportError : public std::runtime_error {
 public:
  explicit TransportError(absl::Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

int64_t Sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

bool IsIdentity(const std::vector<int64_t>& index) {
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// A row order (gather: row i of the result is row index[i] of the source)
// and its inverse; both undefined when it is the identity, which then costs
// nothing.
struct RowOrder {
  at::Tensor index;
  at::Tensor inverse;

  static RowOrder Of(const std::vector<int64_t>& rows) {
    if (IsIdentity(rows)) return {};
    std::vector<int64_t> inverse(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) inverse[rows[i]] = static_cast<int64_t>(i);
    return {at::tensor(rows, at::kLong), at::tensor(inverse, at::kLong)};
  }
  RowOrder Inverted() const { return {inverse, index}; }
};

// One exchange of rows: the input's rows in `before` order are sent,
// send_rows[p] to peer p, recv_rows[p] come from each peer, and the result
// is the received rows in `after` order. Counts were cross-checked once for
// the step in PlanRouting.
struct RowMove {
  Transport* transport = nullptr;
  const char* what = "";  // the entry point, for errors
  bool agree = true;      // agree on every rank's verdict before moving
  // A 0-element tensor owning the transport (OwnerTensor), or undefined when
  // the caller owns it. Saved in the autograd node, so a backward pass can
  // run after the balancer is gone.
  at::Tensor owner;
  const std::vector<int64_t>* send_rows = nullptr;
  const std::vector<int64_t>* recv_rows = nullptr;
  RowOrder before;
  RowOrder after;
  // The chain's "a backward has started" flag (a 1-element bool tensor
  // shared by the chain's nodes), or undefined when not chained.
  at::Tensor chain_started;
};

at::Tensor OwnerTensor(std::shared_ptr<Transport> transport) {
  auto* held = new std::shared_ptr<Transport>(std::move(transport));
  return at::from_blob(
      held, {0}, [held](void*) { delete held; }, at::TensorOptions().dtype(at::kByte));
}

int64_t RowElements(const at::Tensor& x) {
  return std::accumulate(x.sizes().begin() + 1, x.sizes().end(), int64_t{1},
                         std::multiplies<int64_t>());
}

// x as [rows, bytes per row] of kByte, sharing x's memory when it can. A
// tensor torch calls contiguous may still have odd strides where a size is 0
// or 1 (an expanded gradient of zero rows, say), which a byte view refuses:
// those are copied to plain strides first.
at::Tensor ByteRows(const at::Tensor& x) {
  const int64_t rows = x.size(0);
  const int64_t elements = RowElements(x);
  at::Tensor flat = x.resolve_conj().resolve_neg().contiguous().reshape({rows, elements});
  if (flat.stride(1) != 1 || (elements > 1 && flat.stride(0) != elements)) {
    flat = at::empty({rows, elements}, flat.options()).copy_(flat);
  }
  return flat.view(at::kByte);
}

// An uninitialised contiguous tensor of `like`'s dtype and device. Host
// memory comes from the host tensor cache: a step allocates the same few
// large buffers every step, and fresh ones cost a page fault per page.
at::Tensor Empty(at::IntArrayRef shape, const at::Tensor& like) {
  if (like.device().is_cpu()) return EmptyHostTensor(shape, like.scalar_type());
  return at::empty(shape, like.options());
}

// x's rows in `index` order (all of them, unchanged, when it is undefined).
at::Tensor Reordered(const at::Tensor& x, const at::Tensor& index) {
  if (!index.defined()) return x;
  at::Tensor out = Empty(x.sizes(), x);
  at::index_select_out(out, x, 0, index.to(x.device()));
  return out;
}

// A torch error while preparing an exchange, as a status.
absl::Status FromTorchError(const c10::Error& e, const char* what) {
  const std::string message = absl::StrCat(what, ": ", e.what_without_backtrace());
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InvalidArgumentError(message);
}

// Every tensor's rows exchanged with one all-to-all. One tensor moves as it
// is; several are packed side by side as bytes (so each keeps its dtype,
// bit for bit, and Gloo's refusal of bf16 does not matter) and unpacked.
// Everything that can fail on one rank alone (packing, allocating the
// receive buffer, a row size that differs from the peers') is decided before
// the exchange and agreed on by every rank of the group, so a rank never
// enters the all-to-all that another has given up on.
std::vector<at::Tensor> MoveRows(at::TensorList xs, const RowMove& move) {
  const int64_t send_count = Sum(*move.send_rows);
  const int64_t recv_count = Sum(*move.recv_rows);
  const bool single = xs.size() == 1;
  at::Tensor send, received;
  std::vector<at::Tensor> bytes;  // several tensors: each [rows, its row bytes]
  int64_t row_bytes = 0;
  absl::Status prepared;
  try {
    if (single) {
      // Conjugate and negative views are lazy bits on the tensor, not in its
      // bytes: resolve them before the bytes travel.
      send = Reordered(xs[0].resolve_conj().resolve_neg().contiguous(), move.before.index);
      std::vector<int64_t> shape = send.sizes().vec();
      shape[0] = recv_count;
      received = Empty(shape, send);
      row_bytes = RowElements(send) * static_cast<int64_t>(send.element_size());
    } else {
      for (const at::Tensor& x : xs) {
        bytes.push_back(ByteRows(x));
        row_bytes += bytes.back().size(1);
      }
      send = Empty({send_count, row_bytes}, bytes[0]);
      int64_t column = 0;
      for (const at::Tensor& b : bytes) {
        at::Tensor slot = send.narrow(1, column, b.size(1));
        if (move.before.index.defined()) {
          at::index_select_out(slot, b, 0, move.before.index.to(b.device()));
        } else {
          slot.copy_(b);
        }
        column += b.size(1);
      }
      received = Empty({recv_count, row_bytes}, send);
    }
  } catch (const c10::Error& e) {
    prepared = FromTorchError(e, move.what);
  }
  if (prepared.ok()) {
    prepared = move.transport->CheckLimits(*move.send_rows, *move.recv_rows, row_bytes);
  }
  absl::Status agreed =
      move.agree ? AgreeOnStatus(*move.transport, prepared, row_bytes) : prepared;
  if (!agreed.ok()) throw TransportError(std::move(agreed));
  absl::Status status = move.transport->AllToAllRowsPrechecked(
      send.data_ptr(), *move.send_rows, received.data_ptr(), *move.recv_rows, row_bytes);
  if (!status.ok()) throw TransportError(std::move(status));
  if (single) return {Reordered(received, move.after.index)};
  std::vector<at::Tensor> outputs;
  int64_t column = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    at::Tensor slot = received.narrow(1, column, bytes[i].size(1));
    column += bytes[i].size(1);
    // Each output is a tensor of its own, not a view of the receive buffer,
    // which is freed here instead of living as long as any one output.
    std::vector<int64_t> shape = xs[i].sizes().vec();
    shape[0] = recv_count;
    at::Tensor out = Empty(shape, xs[i]);
    at::Tensor out_bytes = out.view({recv_count, RowElements(out)}).view(at::kByte);
    if (move.after.index.defined()) {
      at::index_select_out(out_bytes, slot, 0, move.after.index.to(slot.device()));
    } else {
      out_bytes.copy_(slot);
    }
    outputs.push_back(std::move(out));
  }
  return outputs;
}

// MoveRows as an autograd node: its backward sends each gradient row back
// the way its row came, for the tensors that required grad (the same set on
// every rank, so the backward exchange matches on every rank too). The
// backward is this node again, reversed, so it is differentiable as well
// (double backward). Callers pass an at::TensorList: autograd only tracks
// the tensors of an argument of that type (a std::vector would silently be a
// non-tensor argument).
//
// Backward order. Autograd runs independent nodes in whatever order they
// become ready, and ranks' graphs differ (a loss that uses one routed tensor
// more than another, CUDA and CPU nodes on different engine threads), so
// two exchanges could run in different orders on different ranks: a hang,
// or rows of one tensor received as another's. Every node therefore takes
// the previous node's `chain` output (an empty tensor) as an input and
// emits its own: the backward of an exchange cannot start before the
// backward of every later exchange of the step has ended, so backward
// exchanges run in exactly the reverse of the forward order, on every rank.
class MoveRowsFunction : public torch::autograd::Function<MoveRowsFunction> {
 public:
  // Returns the moved tensors, then the chain link for the next exchange.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList xs, at::TensorList chain,
                                                const RowMove* move) {
    std::vector<int64_t> differentiable;
    for (size_t i = 0; i < xs.size(); ++i) {
      if (xs[i].requires_grad()) differentiable.push_back(static_cast<int64_t>(i));
    }
    ctx->saved_data["differentiable"] = differentiable;
    ctx->saved_data["inputs"] = static_cast<int64_t>(xs.size());
    // The previous link, or none (an undefined tensor may not be an input).
    ctx->saved_data["chained"] = !chain.empty();
    ctx->saved_data["transport"] = reinterpret_cast<int64_t>(move->transport);
    ctx->saved_data["what"] = std::string(move->what);
    ctx->saved_data["agree"] = move->agree;
    ctx->saved_data["owner"] = move->owner;
    ctx->saved_data["chain_started"] = move->chain_started;
    ctx->saved_data["send_rows"] = *move->send_rows;
    ctx->saved_data["recv_rows"] = *move->recv_rows;
    // Backward gathers with the inverses, in the opposite order.
    ctx->saved_data["back_before"] = move->after.inverse;
    ctx->saved_data["back_before_inverse"] = move->after.index;
    ctx->saved_data["back_after"] = move->before.inverse;
    ctx->saved_data["back_after_inverse"] = move->before.index;
    std::vector<at::Tensor> outputs = MoveRows(xs, *move);
    torch::autograd::variable_list non_differentiable;  // one call: each call replaces the set
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!xs[i].requires_grad()) non_differentiable.push_back(outputs[i]);
    }
    ctx->mark_non_differentiable(non_differentiable);
    outputs.push_back(at::empty({0}));  // the chain link
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const std::vector<int64_t> differentiable = ctx->saved_data["differentiable"].toIntVector();
    // Exchanges recorded after this point start a new chain instead of
    // linking into a graph whose backward has begun (and may be freed).
    const at::IValue& started = ctx->saved_data["chain_started"];
    if (started.isTensor() && started.toTensor().defined()) started.toTensor().fill_(true);
    const std::vector<int64_t> send_rows = ctx->saved_data["recv_rows"].toIntVector();
    const std::vector<int64_t> recv_rows = ctx->saved_data["send_rows"].toIntVector();
    const std::string what = ctx->saved_data["what"].toStringRef() + " (backward)";
    RowMove back;
    auto tensor = [&](const char* key) {
      const at::IValue& value = ctx->saved_data[key];
      return value.isTensor() ? value.toTensor() : at::Tensor();
    };
    back.transport = reinterpret_cast<Transport*>(ctx->saved_data["transport"].toInt());
    back.what = what.c_str();
    back.agree = ctx->saved_data["agree"].toBool();
    back.owner = tensor("owner");
    back.send_rows = &send_rows;
    back.recv_rows = &recv_rows;
    back.before = {tensor("back_before"), tensor("back_before_inverse")};
    back.after = {tensor("back_after"), tensor("back_after_inverse")};
    std::vector<at::Tensor> to_send;
    for (int64_t i : differentiable) to_send.push_back(grads[i]);
    // A node of its own only when the backward itself is being recorded
    // (create_graph); otherwise apply runs the exchange and records nothing.
    // Double backward is not chained: it is one exchange per backward node.
    std::vector<at::Tensor> moved =
        MoveRowsFunction::apply(at::TensorList(to_send), at::TensorList(), &back);
    const int64_t inputs = ctx->saved_data["inputs"].toInt();
    const bool chained = ctx->saved_data["chained"].toBool();
    torch::autograd::variable_list result(inputs + (chained ? 1 : 0) + 1);  // xs, chain, move
    for (size_t j = 0; j < differentiable.size(); ++j) result[differentiable[j]] = moved[j];
    // Passing the link on releases the previous exchange's backward.
    if (chained) result[inputs] = at::zeros({0});
    return result;
  }
};

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
    std::shared_ptr<Transport> transport;
    at::Tensor owner;
  };
  std::map<int, PreparedBag> prepared_bags;
  bool auto_layout = false;
  int heads_multiple = 1;
  bool agree_on_errors = true;
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
  // OnDevice's copies of this step's row orders, by (host tensor, device).
  std::map<std::pair<const void*, std::string>, at::Tensor> device_copies;

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

  // Under "auto", takes this step's bag from the plan among the prepared
  // ones; Internal when the plan names a bag that was not prepared.
  absl::Status SelectBag();
  absl::Status Derive(const std::vector<int64_t>& lengths);
  absl::Status CheckRows(const std::vector<at::Tensor>& xs, int64_t rows, const char* what,
                         const char* expected) const;
  absl::Status CheckHeads(const std::vector<at::Tensor>& xs, const char* what,
                          bool whole_heads) const;
  RowMove WorldMove(const char* what, const std::vector<int64_t>& send,
                    const std::vector<int64_t>& recv, RowOrder before, RowOrder after) const {
    return {world, what, agree_on_errors, world_owner, &send, &recv, std::move(before),
            std::move(after), at::Tensor()};
  }
  RowMove BagMove(const char* what, const std::vector<int64_t>& send,
                  const std::vector<int64_t>& recv, RowOrder before, RowOrder after) const {
    return {bag.get(), what, agree_on_errors, bag_owner, &send, &recv, std::move(before),
            std::move(after), at::Tensor()};
  }
  // The exchange as an autograd node, chained after this step's previous
  // one when it records a backward.
  std::vector<at::Tensor> Move(at::TensorList xs, const RowMove& move);
  // `order` with its tensors on `device`: copied once per step and device,
  // not at every exchange (a copy from pageable host memory to a GPU
  // synchronises the host with it).
  RowOrder OnDevice(const RowOrder& order, const c10::Device& device) {
    if (device.is_cpu()) return order;
    auto copy = [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined()) return t;
      at::Tensor& cached = device_copies[{t.unsafeGetTensorImpl(), device.str()}];
      if (!cached.defined()) cached = t.to(device);
      return cached;
    };
    return {copy(order.index), copy(order.inverse)};
  }
  // A local error of an exchange's entry point: agreed with the group
  // (unless agree_on_errors is off), so that no peer waits in the exchange.
  absl::Status Agreed(Transport& transport, const absl::Status& local) const {
    return agree_on_errors ? AgreeOnStatus(transport, local) : local;
  }
  // Checks on the tensors of an entry point that every rank must agree on.
  absl::Status CheckDevice(const std::vector<at::Tensor>& xs, const Transport& transport,
                           const char* what) const;
};

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
  std::vector<at::Tensor> outputs = MoveRowsFunction::apply(xs, at::TensorList(chain), &chained);
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
  rep->agree_on_errors = options.agree_on_errors;
  rep->auto_layout = AutoLayout::Matches(topology);
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
    prepared.transport = *std::move(subgroup);
    prepared.owner = OwnerTensor(prepared.transport);
    if (!rep->auto_layout) {
      rep->bag = prepared.transport;
      rep->bag_owner = prepared.owner;
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
  if (!ok.ok()) return r.Agreed(*r.world, ok);
  int64_t token_bytes = 0;
  for (const at::Tensor& x : xs) token_bytes += RowElements(x) * x.element_size();
  r.routed_token_bytes = token_bytes;
  const RowMove move = r.WorldMove("route", r.send_rows, r.recv_rows,
                                   r.OnDevice(r.send_order, xs[0].device()), {});
  return Guarded([&] { return r.Move(at::TensorList(xs), move); });
}

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::ReverseRouteTensors(
    const std::vector<at::Tensor>& ys) const {
  Rep& r = *rep_;
  absl::Status ok = r.CheckRows(ys, r.routed_rows, "reverse_route", "the sum of routed_lengths");
  if (ok.ok()) ok = r.CheckDevice(ys, *r.world, "reverse_route");
  if (!ok.ok()) return r.Agreed(*r.world, ok);
  const RowMove move =
      r.WorldMove("reverse_route", r.recv_rows, r.send_rows, {},
                  r.OnDevice(r.send_order, ys[0].device()).Inverted());
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
  if (!ok.ok()) return r.Agreed(*r.bag, ok);
  return Guarded([&] {
    // [T, heads, ...] -> [bag, T, heads/bag, ...]: position p's head slice of
    // every routed row, contiguous, is what goes to position p.
    std::vector<at::Tensor> by_position;
    for (const at::Tensor& x : xs) {
      std::vector<int64_t> split = x.sizes().vec();
      split[1] /= r.bag_gpus;
      split.insert(split.begin() + 1, r.bag_gpus);
      std::vector<int64_t> rows = split;
      rows.erase(rows.begin());
      rows[0] = r.bag_gpus * r.routed_rows;
      by_position.push_back(x.reshape(split).transpose(0, 1).contiguous().reshape(rows));
    }
    const RowMove move =
        r.BagMove("pre_attn", r.ulysses_send_rows, r.ulysses_recv_rows, {},
                  r.OnDevice(r.sequence_order, xs[0].device()));
    return r.Move(at::TensorList(by_position), move);
  });
}

absl::StatusOr<std::vector<at::Tensor>> SequenceBalancer::PostAttnTensors(
    const std::vector<at::Tensor>& ys) const {
  Rep& r = *rep_;
  absl::Status ok = r.CheckRows(ys, r.attention_rows, "post_attn", "the sum of attention_lengths");
  if (ok.ok()) ok = r.CheckHeads(ys, "post_attn", /*whole_heads=*/false);
  if (r.bag == nullptr) return ok.ok() ? absl::StatusOr<std::vector<at::Tensor>>(ys) : ok;
  if (ok.ok()) ok = r.CheckDevice(ys, *r.bag, "post_attn");
  if (!ok.ok()) return r.Agreed(*r.bag, ok);
  return Guarded([&] {
    const RowMove move = r.BagMove("post_attn", r.ulysses_recv_rows, r.ulysses_send_rows,
                                   r.OnDevice(r.sequence_order, ys[0].device()).Inverted(), {});
    std::vector<at::Tensor> by_position = r.Move(at::TensorList(ys), move);
    std::vector<at::Tensor> outputs;
    for (size_t i = 0; i < ys.size(); ++i) {
      std::vector<int64_t> split = ys[i].sizes().vec();  // [bag, T, heads/bag, ...]
      split[0] = r.routed_rows;
      split.insert(split.begin(), r.bag_gpus);
      std::vector<int64_t> merged = ys[i].sizes().vec();  // [T, heads, ...]
      merged[0] = r.routed_rows;
      merged[1] *= r.bag_gpus;
      outputs.push_back(by_position[i].reshape(split).transpose(0, 1).reshape(merged));
    }
    return outputs;
  });
}

absl::Status SequenceBalancer::RefuseCall(Call which, const absl::Status& reason) const {
  const Rep& r = *rep_;
  const bool in_bag = which == Call::kPreAttn || which == Call::kPostAttn;
  if (in_bag && r.bag == nullptr) return reason;  // a single-GPU bag moves nothing
  absl::Status agreed = r.Agreed(in_bag ? *r.bag : *r.world, reason);
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
