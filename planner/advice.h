#ifndef KNAPFORMER_PLANNER_ADVICE_H_
#define KNAPFORMER_PLANNER_ADVICE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/types/span.h"
#include "planner/machine.h"

namespace knapformer {

// Which topology to use, from each one's time of a block on the slowest
// GPU: the advice line that `knapformer simulate` (predicted times) and
// `python -m knapformer.replay` (measured compute, modelled communication)
// end with. One decision for both; only the wording differs.

// One topology's figures (one row per topology and cost model).
struct AdviceRow {
  std::string topology;    // as given: "g2n16", "auto", "auto:max_bag=4"
  std::string cost_model;  // what it was planned by; named when the rows differ in it
  double seconds = 0;         // a block on the slowest GPU, balanced
  double seconds_before = 0;  // the same without balancing
};

// The rows the advice names, by index.
struct AdviceChoice {
  size_t fastest = 0;  // the first of least seconds
  // The fastest, or the first auto row (AutoLayout::Matches) within 1% of
  // it: auto adapts when the data changes.
  size_t chosen = 0;
  // The first of most seconds, when more than 5% slower than the chosen one.
  std::optional<size_t> slowest;
};

// Nothing for no rows, or when the fastest takes no time (<= 0 seconds: no
// prediction).
std::optional<AdviceChoice> ChooseTopology(absl::Span<const AdviceRow> rows);

// How the line words its figures.
struct AdviceWording {
  enum class Unit {
    kMicroseconds,  // "%.1fus"
    kMilliseconds,  // "%.3gms"
  };
  Unit unit = Unit::kMicroseconds;
  // What the seconds are, after "per block on the slowest GPU":
  // " (measured compute, modelled communication)", or nothing.
  std::string seconds_note;
  // What "Nx faster than" compares with.
  std::string baseline = "without balancing";
  // The arguments beside the topology with which a trainer's
  // SequenceBalancer plans as the rows were planned, in Python's spelling
  // (`gamma=0.49, machine={...}`), and those a measured row adds
  // (`cost_table=...`). When `trainer_arguments` is set the line ends with
  // the call to write: `; in the trainer: SequenceBalancer("T", <trainer
  // arguments>[, cost_model="M", <measured arguments>])`.
  std::string trainer_arguments;
  std::string measured_arguments;
};

// `machine={...}` with the members of `machine` that differ from Machine's
// defaults (what SequenceBalancer assumes without one), in Python's
// spelling; "" when none does.
std::string MachineArgument(const Machine& machine);

// ChooseTopology's choice in one line, no newline:
//   advice: --topology T[ --cost-model M]: <time> per block on the slowest
//   GPU<note>, 1.93x faster than <baseline> (<time before>)[ (within 1% of
//   F, and it adapts to the data)][; S would be 1.21x slower][; in the
//   trainer: SequenceBalancer("T", ...)]
// --cost-model is named when the rows hold more than one cost model.
// "" when nothing is chosen.
std::string TopologyAdvice(absl::Span<const AdviceRow> rows, const AdviceWording& wording);

}  // namespace knapformer

#endif  // KNAPFORMER_PLANNER_ADVICE_H_
