#ifndef KNAPFORMER_COMMON_ARGS_H_
#define KNAPFORMER_COMMON_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace knapformer {

// One option of a subcommand: what Args::Parse accepts and what its usage
// text shows, declared once so that the two cannot drift apart.
struct OptionSpec {
  std::string name;   // without "--"
  std::string value;  // the value's placeholder ("N", "on|off"); empty: a switch (--pretty)
  std::string default_value;  // shown as "(default X)"; empty: nothing shown
  std::string help;           // one line
};

// Command-line options of one subcommand: `--name value` or `--name=value`,
// and switches (`--name`, no value). Every option must be declared; unknown
// or repeated ones are errors.
class Args {
 public:
  // Parses argv[first..). `allowed` lists the option names without "--";
  // `switches` the ones that take no value. An unknown option's error names
  // the closest allowed ones (SuggestOptions), or lists them all.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<std::string>& allowed,
                                    const std::vector<std::string>& switches = {});
  // The same, with the names and switches of `options` (named apart from
  // Parse: a braced list of names would convert to either).
  static absl::StatusOr<Args> ParseOptions(const std::vector<std::string>& argv,
                                           const std::vector<OptionSpec>& options);

  // True when argv holds --help or -h anywhere: callers print their usage
  // and exit 0 before parsing, so that help works next to a bad option too.
  static bool WantsHelp(const std::vector<std::string>& argv);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string GetString(const std::string& name, const std::string& fallback) const;
  // InvalidArgument "--name: ..." when the value is not a whole number in range.
  absl::StatusOr<int64_t> GetInt(const std::string& name, int64_t fallback, int64_t min,
                                 int64_t max) const;
  absl::StatusOr<double> GetDouble(const std::string& name, double fallback) const;
  // "on" or "off"; InvalidArgument "--name: must be on or off, got '...'".
  absl::StatusOr<bool> GetOnOff(const std::string& name, bool fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

// Edit distance with adjacent transpositions counting as one edit (optimal
// string alignment): "stpes" is 1 from "steps".
int EditDistance(absl::string_view a, absl::string_view b);

// The known names a mistyped `name` most likely meant, best first: those at
// the smallest edit distance when it is at most max(1, min(3, size / 4))
// (case and '_' for '-' ignored); otherwise those that start with `name`
// (3 characters or more), when at most 3 do. Empty when nothing is close.
std::vector<std::string> SuggestOptions(absl::string_view name,
                                        const std::vector<std::string>& known);

// The option names of `options`, for Args::Parse.
std::vector<std::string> OptionNames(const std::vector<OptionSpec>& options);

// A usage text: the `synopsis` lines, a blank line, `description`, then one
// line per option ("  --name VALUE   help (default X)") and -h/--help.
std::string FormatUsage(absl::string_view synopsis, absl::string_view description,
                        const std::vector<OptionSpec>& options);

// "on" or "off", for an OptionSpec's default.
inline std::string OnOff(bool value) { return value ? "on" : "off"; }

}  // namespace knapformer

#endif  // KNAPFORMER_COMMON_ARGS_H_
