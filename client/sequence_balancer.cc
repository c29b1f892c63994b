#include "client/sequence_balancer.h"

#include <numeric>
#include <stdexcept>
#include <utility>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "planner/topology.h"
#include "proto/plan_proto.h"

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

at::Tensor IndexTensor(const std::vector<int64_t>& index) {
  return at::tensor(index, at::kLong);
}

// Rows of `x` (dim 0) exchanged: send_rows[p] rows to peer p, recv_rows[p]
// from it. Byte-level, so every dtype travels (Gloo refuses bf16). The
// counts were cross-checked once for the step in PlanRouting.
at::Tensor Exchange(const at::Tensor& x, Transport* transport,
                    const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
  const at::Tensor input = x.contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  const int64_t row_elements =
      std::accumulate(shape.begin() + 1, shape.end(), int64_t{1}, std::multiplies<int64_t>());
  shape[0] = Sum(recv_rows);
  at::Tensor output = at::empty(shape, input.options());
  absl::Status status = transport->AllToAllRowsPrechecked(
      input.data_ptr(), send_rows, output.data_ptr(), recv_rows,
      row_elements * static_cast<int64_t>(input.element_size()));
  if (!status.ok()) throw TransportError(std::move(status));
  return output;
}

// The exchange as an autograd node: its backward sends each gradient row
// back the way its row came.
class ExchangeRows : public torch::autograd::Function<ExchangeRows> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            Transport* transport, const std::vector<int64_t>& send_rows,
                            const std::vector<int64_t>& recv_rows) {
    ctx->saved_data["transport"] = reinterpret_cast<int64_t>(transport);
    ctx->saved_data["send_rows"] = send_rows;
    ctx->saved_data["recv_rows"] = recv_rows;
    return Exchange(x, transport, send_rows, recv_rows);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* transport = reinterpret_cast<Transport*>(ctx->saved_data["transport"].toInt());
    at::Tensor grad = Exchange(grads[0], transport, ctx->saved_data["recv_rows"].toIntVector(),
                               ctx->saved_data["send_rows"].toIntVector());
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Runs a tensor operation; transport failures and torch's own errors
// (wrong device, dtype...) become a status.
template <typename Op>
absl::StatusOr<at::Tensor> Guarded(Op&& op) {
  try {
    return op();
  } catch (const TransportError& e) {
    return e.status();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
}

bool IsIdentity(const std::vector<int64_t>& index) {
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

std::vector<int64_t> Inverse(const std::vector<int64_t>& permutation) {
  std::vector<int64_t> inverse(permutation.size());
  for (size_t i = 0; i < permutation.size(); ++i) inverse[permutation[i]] = static_cast<int64_t>(i);
  return inverse;
}

// A row permutation applied with index_select (differentiable), skipped
// when it is the identity.
struct Permutation {
  bool identity = true;
  at::Tensor index;

  void Set(const std::vector<int64_t>& rows) {
    identity = IsIdentity(rows);
    index = identity ? at::Tensor() : IndexTensor(rows);
  }
  at::Tensor Apply(const at::Tensor& x) const {
    return identity ? x : x.index_select(0, index.to(x.device()));
  }
};

}  // namespace

struct SequenceBalancer::Rep {
  Transport* world = nullptr;
  std::unique_ptr<Transport> bag;  // null in a single-GPU bag
  int bag_gpus = 1;
  int bag_first_rank = 0;
  std::unique_ptr<PlannerClient> planner;
  uint64_t next_step = 0;
  bool planned = false;
  v1::StepSpec spec;
  bool has_timing = false;
  v1::StepTiming timing;  // of the current step, sent with the next plan

  // The current step.
  StepPlan step_plan;
  int64_t input_rows = 0;
  std::vector<int64_t> send_rows, recv_rows;  // route, per world rank
  Permutation to_send_order;                  // packed input -> send buffer
  Permutation from_send_order;                // its inverse
  std::vector<int64_t> routed_lengths;
  int64_t routed_rows = 0;
  // Ulysses, per bag position: rows this rank sends each (its routed rows,
  // one head slice each) and receives from each.
  std::vector<int64_t> ulysses_send_rows, ulysses_recv_rows;
  Permutation to_sequence_order;    // received (position, sequence) -> (sequence, position)
  Permutation from_sequence_order;  // its inverse
  std::vector<int64_t> attention_lengths;
  int64_t attention_rows = 0;

  absl::Status Derive(const std::vector<int64_t>& lengths);
  absl::Status CheckRows(const at::Tensor& x, int64_t rows, const char* what,
                         const char* expected) const;
};

absl::Status SequenceBalancer::Rep::Derive(const std::vector<int64_t>& lengths) {
  const RankPlan& plan = step_plan.plan;
  const int n = world->size();
  std::vector<int64_t> sequence_start(lengths.size() + 1, 0);
  for (size_t i = 0; i < lengths.size(); ++i) sequence_start[i + 1] = sequence_start[i] + lengths[i];
  input_rows = sequence_start.back();

  send_rows.assign(n, 0);
  recv_rows.assign(n, 0);
  std::vector<int64_t> send_index;
  send_index.reserve(input_rows);
  for (const Transfer& t : plan.route.sends) {
    // A plan from the service is data from the network: check before indexing.
    if (t.peer < 0 || t.peer >= n || t.seq_index < 0 ||
        t.seq_index >= static_cast<int32_t>(lengths.size()) || t.offset < 0 || t.length < 0 ||
        t.offset + t.length > lengths[t.seq_index]) {
      return absl::InternalError(absl::StrCat("plan: rank ", world->rank(), " is asked to send ",
                                              "tokens outside sequence ", t.seq_index,
                                              " or to rank ", t.peer));
    }
    send_rows[t.peer] += t.length;
    for (int64_t row = 0; row < t.length; ++row) {
      send_index.push_back(sequence_start[t.seq_index] + t.offset + row);
    }
  }
  // Every token leaves exactly once: the plan must be a permutation of the
  // input, or the reverse route could not put every row back.
  if (static_cast<int64_t>(send_index.size()) != input_rows) {
    return absl::InternalError(absl::StrCat("plan: rank ", world->rank(), " sends ",
                                            send_index.size(), " of its ", input_rows, " tokens"));
  }
  std::vector<bool> seen(input_rows, false);
  for (int64_t row : send_index) {
    if (seen[row]) return absl::InternalError("plan: a token is sent twice");
    seen[row] = true;
  }
  for (const Transfer& t : plan.route.recvs) {
    if (t.peer < 0 || t.peer >= n || t.length < 0) {
      return absl::InternalError(
          absl::StrCat("plan: rank ", world->rank(), " is to receive from rank ", t.peer));
    }
    recv_rows[t.peer] += t.length;
  }
  to_send_order.Set(send_index);
  from_send_order.Set(Inverse(send_index));
  routed_lengths = plan.compute_chunk_lengths;
  routed_rows = Sum(routed_lengths);

  const UlyssesBag& ulysses = plan.ulysses;
  if (ulysses.gpus != bag_gpus || ulysses.first_rank != bag_first_rank) {
    return absl::InternalError(absl::StrCat("plan: rank ", world->rank(), " is in the bag of ",
                                            bag_gpus, " GPUs from rank ", bag_first_rank,
                                            ", the plan says ", ulysses.gpus, " from ",
                                            ulysses.first_rank));
  }
  if (bag_gpus == 1) {
    attention_lengths = routed_lengths;
    attention_rows = routed_rows;
    ulysses_send_rows.clear();
    ulysses_recv_rows.clear();
    to_sequence_order.Set({});
    from_sequence_order.Set({});
    return absl::OkStatus();
  }
  ulysses_send_rows.assign(bag_gpus, routed_rows);
  ulysses_recv_rows.assign(bag_gpus, 0);
  attention_lengths.clear();
  for (const UlyssesSequence& seq : ulysses.sequences) {
    if (static_cast<int>(seq.chunk_lengths.size()) != bag_gpus) {
      return absl::InternalError(absl::StrCat("plan: a sequence of rank ", world->rank(),
                                              "'s bag has ", seq.chunk_lengths.size(),
                                              " chunk lengths for ", bag_gpus, " GPUs"));
    }
    attention_lengths.push_back(seq.length);
    for (int p = 0; p < bag_gpus; ++p) ulysses_recv_rows[p] += seq.chunk_lengths[p];
  }
  attention_rows = Sum(attention_lengths);
  // The receive buffer holds position 0's chunks of every sequence, then
  // position 1's...; attention wants each sequence whole, its chunks in
  // position order (which is token order: chunk offsets ascend with position).
  std::vector<int64_t> block_start(bag_gpus, 0);
  for (int p = 1; p < bag_gpus; ++p) block_start[p] = block_start[p - 1] + ulysses_recv_rows[p - 1];
  std::vector<int64_t> order;
  order.reserve(attention_rows);
  for (const UlyssesSequence& seq : ulysses.sequences) {
    for (int p = 0; p < bag_gpus; ++p) {
      for (int64_t row = 0; row < seq.chunk_lengths[p]; ++row) order.push_back(block_start[p] + row);
      block_start[p] += seq.chunk_lengths[p];
    }
  }
  to_sequence_order.Set(order);
  from_sequence_order.Set(Inverse(order));
  return absl::OkStatus();
}

absl::Status SequenceBalancer::Rep::CheckRows(const at::Tensor& x, int64_t rows, const char* what,
                                              const char* expected) const {
  if (!planned) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": call PlanRouting before moving tensors"));
  }
  if (!x.defined() || x.dim() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": needs a tensor of >= 1 dimension"));
  }
  if (x.size(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", x.size(0), " rows, rank ",
                                                   world->rank(), " expects ", rows, " (",
                                                   expected, ") at step ", spec.step()));
  }
  return absl::OkStatus();
}

SequenceBalancer::SequenceBalancer(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}
SequenceBalancer::~SequenceBalancer() = default;

absl::StatusOr<std::unique_ptr<SequenceBalancer>> SequenceBalancer::Create(
    SequenceBalancerOptions options, Transport* world) {
  if (world == nullptr) return absl::InvalidArgumentError("world: must not be null");
  auto topology = Topology::Parse(options.topology);
  if (!topology.ok()) return topology.status();
  auto layout = World::Create(*topology, world->size());
  if (!layout.ok()) return layout.status();

  auto rep = std::make_unique<Rep>();
  rep->world = world;
  rep->next_step = options.first_step;
  rep->spec.set_job_id(options.job_id);
  rep->spec.set_group_id(options.group_id);
  rep->spec.set_world_size(world->size());
  rep->spec.set_topology(topology->spec());
  rep->spec.set_d_model(options.d_model);
  rep->spec.set_gamma(options.gamma);
  rep->spec.set_token_bytes(options.token_bytes);
  rep->spec.set_max_tokens_per_gpu(options.max_tokens_per_gpu);
  rep->spec.set_cost_model(CostKindToProto(options.cost_model));
  rep->spec.set_use_fitted_gamma(options.use_fitted_gamma);

  const RankLocation here = layout->Locate(world->rank());
  const Bag& bag = layout->topology().bag(here.bag);
  rep->bag_gpus = bag.gpus;
  rep->bag_first_rank = layout->RankOf({here.replica, here.bag, 0});
  if (bag.gpus > 1) {
    std::vector<int> members;
    for (int p = 0; p < bag.gpus; ++p) members.push_back(layout->RankOf({here.replica, here.bag, p}));
    auto subgroup = world->Subgroup(members);
    if (!subgroup.ok()) return subgroup.status();
    rep->bag = *std::move(subgroup);
  }
  auto planner = PlannerClient::Create(options.planner, world);
  if (!planner.ok()) return planner.status();
  rep->planner = *std::move(planner);
  return std::unique_ptr<SequenceBalancer>(new SequenceBalancer(std::move(rep)));
}

absl::Status SequenceBalancer::PlanRouting(const std::vector<int64_t>& lengths) {
  Rep& r = *rep_;
  r.planned = false;
  r.spec.set_step(r.next_step++);
  auto plan = r.planner->Plan(r.spec, lengths, r.has_timing ? &r.timing : nullptr);
  r.has_timing = false;
  if (!plan.ok()) return plan.status();
  r.step_plan = *std::move(plan);
  absl::Status derived = r.Derive(lengths);
  if (!derived.ok()) {
    // Still take part in the collective check, with counts no peer can
    // match, so that every rank fails this step instead of waiting for us.
    std::vector<int64_t> impossible(r.world->size(), -1);
    (void)r.world->CheckRowCounts(std::vector<int64_t>(r.world->size(), 0), impossible);
    return derived;
  }
  // Once per step instead of per exchange: every Route, ReverseRoute,
  // PreAttn and PostAttn of the step moves these counts or their transpose.
  absl::Status checked = r.world->CheckRowCounts(r.send_rows, r.recv_rows);
  if (checked.ok() && r.bag != nullptr) {
    checked = r.bag->CheckRowCounts(r.ulysses_send_rows, r.ulysses_recv_rows);
  }
  if (!checked.ok()) return checked;
  r.planned = true;
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
const std::vector<int64_t>& SequenceBalancer::routed_lengths() const {
  return rep_->routed_lengths;
}
const std::vector<int64_t>& SequenceBalancer::attention_lengths() const {
  return rep_->attention_lengths;
}
int SequenceBalancer::bag_gpus() const { return rep_->bag_gpus; }

absl::StatusOr<at::Tensor> SequenceBalancer::Route(const at::Tensor& x) const {
  const Rep& r = *rep_;
  absl::Status ok = r.CheckRows(x, r.input_rows, "route", "the sum of its sequence lengths");
  if (!ok.ok()) return ok;
  return Guarded([&] {
    return ExchangeRows::apply(r.to_send_order.Apply(x), r.world, r.send_rows, r.recv_rows);
  });
}

absl::StatusOr<at::Tensor> SequenceBalancer::ReverseRoute(const at::Tensor& y) const {
  const Rep& r = *rep_;
  absl::Status ok = r.CheckRows(y, r.routed_rows, "reverse_route", "the sum of routed_lengths");
  if (!ok.ok()) return ok;
  return Guarded([&] {
    return r.from_send_order.Apply(ExchangeRows::apply(y, r.world, r.recv_rows, r.send_rows));
  });
}

absl::StatusOr<at::Tensor> SequenceBalancer::PreAttn(const at::Tensor& x) const {
  const Rep& r = *rep_;
  absl::Status ok = r.CheckRows(x, r.routed_rows, "pre_attn", "the sum of routed_lengths");
  if (!ok.ok()) return ok;
  if (r.bag_gpus == 1) return x;
  if (x.dim() < 2 || x.size(1) % r.bag_gpus != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pre_attn: ", x.dim() < 2 ? 0 : x.size(1), " heads (dimension 1) do not split over the ",
        r.bag_gpus, " GPUs of rank ", r.world->rank(), "'s bag; heads must be a multiple of every "
        "bag size of the topology"));
  }
  return Guarded([&] {
    // [T, heads, ...] -> [bag, T, heads/bag, ...]: position p's head slice of
    // every routed row, contiguous, is what goes to position p.
    std::vector<int64_t> split = x.sizes().vec();
    split[1] /= r.bag_gpus;
    split.insert(split.begin() + 1, r.bag_gpus);
    at::Tensor by_position = x.reshape(split).transpose(0, 1).contiguous();
    std::vector<int64_t> rows = split;
    rows.erase(rows.begin());
    rows[0] = r.bag_gpus * r.routed_rows;
    at::Tensor received = ExchangeRows::apply(by_position.reshape(rows), r.bag.get(),
                                              r.ulysses_send_rows, r.ulysses_recv_rows);
    return r.to_sequence_order.Apply(received);
  });
}

absl::StatusOr<at::Tensor> SequenceBalancer::PostAttn(const at::Tensor& y) const {
  const Rep& r = *rep_;
  absl::Status ok = r.CheckRows(y, r.attention_rows, "post_attn", "the sum of attention_lengths");
  if (!ok.ok()) return ok;
  if (r.bag_gpus == 1) return y;
  if (y.dim() < 2) return absl::InvalidArgumentError("post_attn: needs [tokens, heads, ...]");
  return Guarded([&] {
    at::Tensor by_position = ExchangeRows::apply(r.from_sequence_order.Apply(y), r.bag.get(),
                                                 r.ulysses_recv_rows, r.ulysses_send_rows);
    std::vector<int64_t> split = y.sizes().vec();  // [bag, T, heads/bag, ...]
    split[0] = r.routed_rows;
    split.insert(split.begin(), r.bag_gpus);
    std::vector<int64_t> merged = y.sizes().vec();  // [T, heads, ...]
    merged[0] = r.routed_rows;
    merged[1] *= r.bag_gpus;
    return by_position.reshape(split).transpose(0, 1).reshape(merged);
  });
}

}  // namespace knapformer
