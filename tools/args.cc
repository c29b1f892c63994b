#include "tools/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace knapformer {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& allowed) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' (options are --name value)"));
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
      value = argv[++i];
    }
    if (std::find(allowed.begin(), allowed.end(), name) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, ": unknown option (known: --", absl::StrJoin(allowed, ", --"), ")"));
    }
    if (!args.values_.emplace(name, value).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": given twice"));
    }
  }
  return args;
}

std::string Args::GetString(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& name, int64_t fallback, int64_t min,
                                     int64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || value < min || value > max) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", text,
                                                   "' is not a whole number in [", min, ", ",
                                                   max, "]"));
  }
  return static_cast<int64_t>(value);
}

absl::StatusOr<double> Args::GetDouble(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", text, "' is not a finite number"));
  }
  return value;
}

absl::StatusOr<bool> Args::GetOnOff(const std::string& name, bool fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  if (it->second != "on" && it->second != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": must be on or off, got '", it->second, "'"));
  }
  return it->second == "on";
}

}  // namespace knapformer
