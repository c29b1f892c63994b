#ifndef KNAPFORMER_CLIENT_SEQUENCE_BALANCER_OPTIONS_H_
#define KNAPFORMER_CLIENT_SEQUENCE_BALANCER_OPTIONS_H_

// A SequenceBalancer's settings (sequence_balancer.h), apart from the
// balancer so that what reads them (the settings every rank must share,
// the environment) needs no LibTorch.

#include <cstdint>
#include <optional>
#include <string>

#include "client/planner_client_options.h"
#include "planner/cost_model.h"
#include "planner/machine.h"

namespace knapformer {

struct SequenceBalancerOptions {
  // The service's rendezvous key (one balancer per job and group).
  std::string job_id = "default";
  std::string group_id;
  // Compute bags of one replica, e.g. "g1n2+g2n1+g4n1"; the world is
  // transport size / GPUs of the topology replicas of it. Or "auto"
  // ("auto:max_bag=G:group=T", planner/auto_layout.h): the planner chooses
  // the bags every step; the balancer prepares a subgroup for every aligned
  // power-of-two block of ranks up to the largest bag within each node, once
  // in Create, and each step uses the ones its plan names.
  std::string topology;
  // What the GPUs and links can do (planner/machine.h): prices the
  // communication that "auto" trades against balance, and the predicted
  // step time. gpus_per_node must be the ranks per node of the transport
  // (ranks node-major, as torchrun numbers them).
  Machine machine;
  // The cost model: transformer 24*l*d^2 + gamma*4*l^2*d (d_model and gamma
  // are checked whatever the kind), uniform, linear or measured
  // (planner/cost_model.h).
  CostKind cost_model = CostKind::kTransformer;
  // The measured model's attention table (`knapformer calibrate --table`):
  // given exactly with CostKind::kMeasured.
  std::optional<MeasuredAttention> measured_attention;
  int32_t d_model = 0;
  double gamma = 1.0;
  // Bytes per token of the routed tensors, for the service's moved-bytes
  // figures only; 0 = unknown.
  int64_t token_bytes = 0;
  // Memory: at most this many tokens on any GPU after routing; 0 = no cap.
  // PlanRouting fails (ResourceExhausted, on every rank) when no placement
  // meets it.
  int64_t max_tokens_per_gpu = 0;
  // The first PlanRouting is this step; each call takes the next one. All
  // ranks must start at the same step (e.g. the trainer's step on resume).
  uint64_t first_step = 0;
  // Plan with the gamma the planner service fits to this job's step timings
  // (RecordComputeSeconds) once it has one; `gamma` until then.
  bool use_fitted_gamma = false;
  // Locality-aware planning (planner/balancer.h): the plan may trade WIR,
  // never max/mean, for fewer moved tokens. Unset = the planner's default
  // (the service's --locality flag; on when planning locally).
  std::optional<bool> locality;
  // One rank's mistake in an exchange (Route, ReverseRoute, PreAttn,
  // PostAttn and their backward passes: other rows, dtype or shape, another
  // device) is every rank's immediate error, and the next call works
  // (client/row_exchange.h): the first exchange of each call in a step
  // agrees on every rank's verdict and tensors in one small all-gather; later
  // ones carry one status byte per rank with their rows. Off: a mistake
  // fails only its own rank, and its peers wait in the exchange until that
  // process exits or the transport's timeout. PlanRouting always agrees
  // (once per step).
  bool agree_on_errors = true;
  // Debugging: the all-gather before every exchange instead (what every
  // exchange paid before the flags; needs agree_on_errors).
  bool agree_every_exchange = false;
  PlannerClientOptions planner;
};

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_SEQUENCE_BALANCER_OPTIONS_H_
