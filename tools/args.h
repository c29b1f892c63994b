#ifndef KNAPFORMER_TOOLS_ARGS_H_
#define KNAPFORMER_TOOLS_ARGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace knapformer {

// Command-line options of one subcommand: `--name value` or `--name=value`.
// Every option must be declared; unknown or repeated ones are errors.
class Args {
 public:
  // Parses argv[first..). `allowed` lists the option names without "--".
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::vector<std::string>& allowed);

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

}  // namespace knapformer

#endif  // KNAPFORMER_TOOLS_ARGS_H_
