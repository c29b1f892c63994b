#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_SETTINGS_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_SETTINGS_H_

// The service load benchmark's fixed settings: the stream and model every
// step is made from, the server's limits, the client's channels, the
// defaults of its flags and the bound on every wait.

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace knapformer {
namespace service_load {

constexpr char kScenario[] = "mixed-res";
constexpr uint64_t kStreamSeed = 0;
constexpr int32_t kDModel = 3072;
constexpr double kGamma = 0.49;
constexpr int64_t kTokenBytes = int64_t{kDModel} * 2;  // bf16 hidden states
constexpr int kChannels = 8;
constexpr char kChannelIndexArg[] = "knapformer.channel_index";

constexpr int64_t kDefaultSteps = 100;
constexpr int64_t kDefaultStepsAt4096 = 30;
constexpr int64_t kDefaultWarmup = 5;
inline const std::vector<int64_t> kDefaultRanks = {32, 256, 1024, 4096};

// Server side.
constexpr int32_t kMaxWorldSize = 65536;
constexpr absl::Duration kRendezvousTimeout = absl::Seconds(120);
constexpr absl::Duration kServerShutdownGrace = absl::Seconds(2);

// Bounds on every wait of the client.
constexpr absl::Duration kCallDeadline = absl::Seconds(60);
constexpr absl::Duration kStepWait = absl::Seconds(90);  // kCallDeadline + 30 s
constexpr absl::Duration kCancelWait = absl::Seconds(30);
constexpr int kPortWaitMs = 30000;
constexpr int kConnectWaitSeconds = 10;
constexpr int kChildExitWaitMs = 15000;

// The bare rendezvous's answers carry this much filler, so that they weigh
// about what the planner's do (~230 bytes per rank; both columns printed).
constexpr int kBareReplyPaddingBytes = 200;

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_SETTINGS_H_
