#include "planner/advice.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "planner/auto_layout.h"

namespace knapformer {

std::optional<AdviceChoice> ChooseTopology(absl::Span<const AdviceRow> rows) {
  if (rows.empty()) return std::nullopt;
  AdviceChoice choice;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].seconds < rows[choice.fastest].seconds) choice.fastest = i;
  }
  const double fastest = rows[choice.fastest].seconds;
  if (fastest <= 0) return std::nullopt;
  choice.chosen = choice.fastest;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (AutoLayout::Matches(rows[i].topology) && rows[i].seconds <= 1.01 * fastest) {
      choice.chosen = i;
      break;
    }
  }
  size_t slowest = choice.fastest;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].seconds > rows[slowest].seconds) slowest = i;
  }
  if (rows[slowest].seconds > 1.05 * rows[choice.chosen].seconds) choice.slowest = slowest;
  return choice;
}

std::string TopologyAdvice(absl::Span<const AdviceRow> rows, const AdviceWording& wording) {
  const std::optional<AdviceChoice> choice = ChooseTopology(rows);
  if (!choice.has_value()) return "";
  auto time = [&wording](double seconds) {
    return wording.unit == AdviceWording::Unit::kMilliseconds
               ? absl::StrFormat("%.3gms", seconds * 1e3)
               : absl::StrFormat("%.1fus", seconds * 1e6);
  };
  std::set<std::string> cost_models;
  for (const AdviceRow& row : rows) cost_models.insert(row.cost_model);
  const AdviceRow& chosen = rows[choice->chosen];
  std::string out = absl::StrCat(
      "advice: --topology ", chosen.topology,
      cost_models.size() > 1 ? absl::StrCat(" --cost-model ", chosen.cost_model) : "", ": ",
      time(chosen.seconds), " per block on the slowest GPU", wording.seconds_note, ", ",
      absl::StrFormat("%.2fx", chosen.seconds_before / chosen.seconds), " faster than ",
      wording.baseline, " (", time(chosen.seconds_before), ")");
  if (choice->chosen != choice->fastest) {
    absl::StrAppend(&out, " (within 1% of ", rows[choice->fastest].topology,
                    ", and it adapts to the data)");
  }
  if (choice->slowest.has_value()) {
    const AdviceRow& slowest = rows[*choice->slowest];
    absl::StrAppend(&out, "; ", slowest.topology, " would be ",
                    absl::StrFormat("%.2fx", slowest.seconds / chosen.seconds), " slower");
  }
  if (!wording.trainer_arguments.empty()) {
    absl::StrAppend(&out, "; in the trainer: SequenceBalancer(\"", chosen.topology, "\", ",
                    wording.trainer_arguments);
    if (!chosen.cost_model.empty() && chosen.cost_model != "transformer") {
      absl::StrAppend(&out, ", cost_model=\"", chosen.cost_model, "\"",
                      chosen.cost_model == "measured" && !wording.measured_arguments.empty()
                          ? absl::StrCat(", ", wording.measured_arguments)
                          : "");
    }
    absl::StrAppend(&out, ")");
  }
  return out;
}

std::string MachineArgument(const Machine& machine) {
  Machine given = machine;
  Machine defaults;
  std::string fields;
  for (absl::string_view name : absl::StrSplit(kMachineFieldNames, ", ")) {
    const MachineField field = FieldOfMachine(given, std::string(name));
    const MachineField fallback = FieldOfMachine(defaults, std::string(name));
    if (field.rate != nullptr && *field.rate != *fallback.rate) {
      absl::StrAppend(&fields, fields.empty() ? "" : ", ", "\"", name, "\": ",
                      absl::StrFormat("%.10g", *field.rate));
    } else if (field.count != nullptr && *field.count != *fallback.count) {
      absl::StrAppend(&fields, fields.empty() ? "" : ", ", "\"", name, "\": ", *field.count);
    }
  }
  return fields.empty() ? "" : absl::StrCat("machine={", fields, "}");
}

}  // namespace knapformer
