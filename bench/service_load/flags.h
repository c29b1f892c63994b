#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_FLAGS_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_FLAGS_H_

// The service load benchmark's command line: its flags, their parsing and
// the usage text.

#include <cstdint>
#include <vector>

#include "bench/service_load/settings.h"

namespace knapformer {
namespace service_load {

struct Flags {
  std::vector<int64_t> ranks = kDefaultRanks;
  int64_t steps = kDefaultSteps;
  bool steps_given = false;
  int64_t warmup = kDefaultWarmup;
  int64_t soak_minutes = 0;  // 0: the table; else the soak, at the first --ranks
  int64_t sample_seconds = 60;
  bool overload = false;  // instead: the overload run, at the first --ranks
  bool group_only = false;  // the group-mode table alone (no per-rank mode)
};

void PrintUsage(const char* argv0);

// Returns false (after printing why) on a bad command line, and for --help.
bool ParseFlags(int argc, char** argv, Flags* flags);

// The measured steps at a group size of `ranks`: --steps; by default
// kDefaultSteps, and at most kDefaultStepsAt4096 from 4096 ranks up.
int64_t StepsAt(const Flags& flags, int64_t ranks);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_FLAGS_H_
