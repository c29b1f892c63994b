#include "bench/service_load/flags.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace knapformer {
namespace service_load {
namespace {

bool ParsePositive(const std::string& text, int64_t min_value, int64_t* out) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min_value) return false;
  *out = value;
  return true;
}

}  // namespace

void PrintUsage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--ranks 32,256,1024,4096] [--steps 100] [--warmup 5]\n"
               "          [--soak-minutes M [--sample-seconds 60]] [--overload] [--group-only]\n"
               "  --ranks   comma-separated group sizes (multiples of 32)\n"
               "  --steps   measured steps per group size (default 100, 30 at 4096 ranks)\n"
               "  --warmup  unmeasured steps before them (default 5)\n"
               "  --soak-minutes  instead: step the first group size without pause for M\n"
               "                  minutes, printing every --sample-seconds the server's RSS,\n"
               "                  open fds, CPU and the window's step latency\n"
               "  --overload      instead: the first group size steps while stray requests\n"
               "                  flood the server with 10x its pending-step and job limits\n"
               "  --group-only    the group-mode table alone: one PlanGroup per step, up to\n"
               "                  %d ranks (per-rank mode holds a call per rank)\n",
               argv0, kMaxWorldSize);
}

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    if (arg == "--overload") {
      flags->overload = true;
      continue;
    }
    if (arg == "--group-only") {
      flags->group_only = true;
      continue;
    }
    std::string name = arg;
    std::string value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (name != "--ranks" && name != "--steps" && name != "--warmup" &&
        name != "--soak-minutes" && name != "--sample-seconds") {
      std::fprintf(stderr, "unknown flag '%s'\n", arg.c_str());
      return false;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name.c_str());
        return false;
      }
      value = argv[++i];
    }
    if (name == "--ranks") {
      flags->ranks.clear();
      for (absl::string_view piece : absl::StrSplit(value, ',')) {
        int64_t r = 0;
        if (!ParsePositive(std::string(piece), 1, &r) || r > kMaxWorldSize) {
          std::fprintf(stderr, "--ranks: '%s' is not a rank count in [1, %d]\n",
                       std::string(piece).c_str(), kMaxWorldSize);
          return false;
        }
        flags->ranks.push_back(r);
      }
    } else if (name == "--steps") {
      if (!ParsePositive(value, 1, &flags->steps)) {
        std::fprintf(stderr, "--steps: '%s' is not a positive integer\n", value.c_str());
        return false;
      }
      flags->steps_given = true;
    } else if (name == "--soak-minutes" || name == "--sample-seconds") {
      int64_t* out = name == "--soak-minutes" ? &flags->soak_minutes : &flags->sample_seconds;
      if (!ParsePositive(value, 1, out)) {
        std::fprintf(stderr, "%s: '%s' is not a positive integer\n", name.c_str(), value.c_str());
        return false;
      }
    } else {
      if (!ParsePositive(value, 0, &flags->warmup)) {
        std::fprintf(stderr, "--warmup: '%s' is not a non-negative integer\n", value.c_str());
        return false;
      }
    }
  }
  return true;
}

int64_t StepsAt(const Flags& flags, int64_t ranks) {
  return flags.steps_given || ranks < 4096 ? flags.steps
                                           : std::min(flags.steps, kDefaultStepsAt4096);
}

}  // namespace service_load
}  // namespace knapformer
