#include "common/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace knapformer {
namespace {

bool IsHelp(const std::string& arg) { return arg == "--help" || arg == "-h"; }

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// Case and '_' for '-' do not count as typos.
std::string Normalized(absl::string_view name) {
  std::string out = absl::AsciiStrToLower(name);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

// " (did you mean --a or --b?)", or "" when nothing is close.
std::string DidYouMean(absl::string_view name, const std::vector<std::string>& known) {
  const std::vector<std::string> close = SuggestOptions(name, known);
  if (close.empty()) return "";
  return absl::StrCat(" (did you mean --", absl::StrJoin(close, " or --"), "?)");
}

absl::Status UnknownOption(const std::string& name, const std::vector<std::string>& allowed) {
  // --help is every command's, though callers handle it before parsing.
  std::vector<std::string> known = allowed;
  known.push_back("help");
  std::string hint = DidYouMean(name, known);
  if (hint.empty()) {
    hint = allowed.empty()
               ? " (this command takes none; --help for its usage)"
               : absl::StrCat(" (known: --", absl::StrJoin(allowed, ", --"),
                              "; --help for the usage)");
  }
  return absl::InvalidArgumentError(absl::StrCat("--", name, ": unknown option", hint));
}

}  // namespace

bool Args::WantsHelp(const std::vector<std::string>& argv) {
  return std::any_of(argv.begin(), argv.end(), IsHelp);
}

absl::StatusOr<Args> Args::ParseOptions(const std::vector<std::string>& argv,
                                        const std::vector<OptionSpec>& options) {
  std::vector<std::string> switches;
  for (const OptionSpec& option : options) {
    if (option.value.empty()) switches.push_back(option.name);
  }
  return Parse(argv, OptionNames(options), switches);
}

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::vector<std::string>& allowed,
                                 const std::vector<std::string>& switches) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      // "-topology": one dash short of an option.
      std::string hint = " (options are --name value)";
      if (arg.size() > 2 && arg[0] == '-' && arg[1] != '-') {
        const std::string name = arg.substr(1, arg.find('=') - 1);
        if (Contains(allowed, name)) {
          hint = absl::StrCat(" (did you mean --", name, "?)");
        } else if (std::string close = DidYouMean(name, allowed); !close.empty()) {
          hint = close;
        }
      }
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'", hint));
    }
    std::string name = arg.substr(2);
    std::string value;
    const size_t eq = name.find('=');
    const bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    // Named before the value is looked at: "--topologyy g1n8" is a typo of
    // an option, not a missing value.
    if (!Contains(allowed, name)) return UnknownOption(name, allowed);
    if (Contains(switches, name)) {
      if (inline_value) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": takes no value, got '", value, "'"));
      }
      value = "on";
    } else if (!inline_value) {
      // No value, or the next option where the value should be: a value
      // never starts with "--", so "--topology --steps 3" is not --topology
      // "--steps".
      if (i + 1 >= argv.size() || argv[i + 1].rfind("--", 0) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
      value = argv[++i];
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


int EditDistance(absl::string_view a, absl::string_view b) {
  // d[i][j]: the distance between a's first i and b's first j characters.
  std::vector<std::vector<int>> d(a.size() + 1, std::vector<int>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const int substitution = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + substitution});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

std::vector<std::string> SuggestOptions(absl::string_view name,
                                        const std::vector<std::string>& known) {
  const std::string typed = Normalized(name);
  if (typed.empty()) return {};
  // One typo in a short name, up to three in a long one: more than that
  // would also match names that only share a few letters ("data", "gamma").
  const int threshold = std::max(1, std::min(3, static_cast<int>(typed.size()) / 4));
  int best = std::numeric_limits<int>::max();
  std::vector<std::string> closest;
  for (const std::string& candidate : known) {
    const int distance = EditDistance(typed, Normalized(candidate));
    if (distance > threshold || distance > best) continue;
    if (distance < best) closest.clear();
    best = distance;
    closest.push_back(candidate);
  }
  if (!closest.empty()) return closest;
  // A shortened name: "--max-tokens" for --max-tokens-per-gpu.
  if (typed.size() < 3) return {};
  std::vector<std::string> extended;
  for (const std::string& candidate : known) {
    if (absl::StartsWith(Normalized(candidate), typed)) extended.push_back(candidate);
  }
  if (extended.size() > 3) return {};
  return extended;
}

std::vector<std::string> OptionNames(const std::vector<OptionSpec>& options) {
  std::vector<std::string> names;
  names.reserve(options.size());
  for (const OptionSpec& option : options) names.push_back(option.name);
  return names;
}

std::string FormatUsage(absl::string_view synopsis, absl::string_view description,
                        const std::vector<OptionSpec>& options) {
  // Help texts start in one column, but a long option does not push every
  // other line past 100 columns: it gets its own wider first column.
  constexpr size_t kMaxColumn = 30;
  std::vector<std::string> left;
  size_t column = std::string("-h, --help").size();
  for (const OptionSpec& option : options) {
    left.push_back(absl::StrCat("--", option.name, option.value.empty() ? "" : " ", option.value));
    if (left.back().size() <= kMaxColumn) column = std::max(column, left.back().size());
  }
  std::string out;
  bool first = true;
  for (absl::string_view line :
       absl::StrSplit(absl::StripTrailingAsciiWhitespace(synopsis), '\n')) {
    absl::StrAppend(&out, first ? "usage: " : "       ", line, "\n");
    first = false;
  }
  absl::StrAppend(&out, "\n", absl::StripTrailingAsciiWhitespace(description), "\n\noptions:\n");
  auto append = [&](const std::string& flag, const std::string& help) {
    absl::StrAppend(&out, "  ", flag, std::string(column + 2 - std::min(flag.size(), column), ' '),
                    help, "\n");
  };
  for (size_t i = 0; i < options.size(); ++i) {
    const OptionSpec& option = options[i];
    append(left[i], option.default_value.empty()
                        ? option.help
                        : absl::StrCat(option.help, " (default ", option.default_value, ")"));
  }
  append("-h, --help", "print this text and exit");
  return out;
}

}  // namespace knapformer
