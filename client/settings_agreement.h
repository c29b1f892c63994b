#ifndef KNAPFORMER_CLIENT_SETTINGS_AGREEMENT_H_
#define KNAPFORMER_CLIENT_SETTINGS_AGREEMENT_H_

// The settings every rank of one balancer must share (topology, cost model,
// planner...), and the check that they do: a rank configured differently
// would otherwise make other subgroups or plan other steps than its peers,
// which hangs the job instead of failing it.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "client/sequence_balancer_options.h"
#include "transport/transport.h"

namespace knapformer {

// (name, value) of every setting the ranks must share, in a fixed order;
// values as text (numbers exactly: %.17g).
using SharedSettings = std::vector<std::pair<std::string, std::string>>;
SharedSettings SharedSettingsOf(const SequenceBalancerOptions& options);

// Every rank's settings as bytes (a serialized client::SharedSettingList),
// for an all-gather by a caller that has no Transport (the Python binding
// all-gathers them over torch.distributed).
std::string EncodeSettings(const SharedSettings& settings);

// Empty when every rank's encoded settings are the same; else why not: the
// first setting (in SharedSettingsOf's order) that differs, with the ranks
// holding each value, e.g. "topology is 'g1n4' on rank 3 but 'g1n2+g2n1' on
// ranks 0-2". Bytes that do not decode, and a list of other names or
// another length (another knapformer version), are named too.
std::string SettingsDisagreement(const std::vector<std::string>& encoded);

// FailedPrecondition carrying SettingsDisagreement's reason, or OK.
absl::Status CheckSettingsAgree(const std::vector<std::string>& encoded);

// Collective over `world`: all-gathers the encoded settings and returns
// CheckSettingsAgree's verdict on them (the same on every rank), or the
// transport's error when the all-gather fails.
absl::Status AgreeOnSettings(Transport& world, const SharedSettings& mine);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_SETTINGS_AGREEMENT_H_
