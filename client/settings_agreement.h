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

// A rank's report when a balancer is made, as bytes (a serialized
// client::SettingsReport, typed as transport/agreement.h's messages are):
// its settings, or, refusing, why it refused its own arguments (it then
// takes part only to fail with its peers). For an all-gather by a caller
// that has no Transport yet (the Python binding all-gathers them over
// torch.distributed) as for AgreeOnSettings.
std::string EncodeSettings(const SharedSettings& settings);
std::string EncodeSettingsRefusal(const absl::Status& why);

// Empty when every rank's reported settings are the same; else why not: the
// first setting (in SharedSettingsOf's order) that differs, with the ranks
// holding each value, e.g. "topology is 'g1n4' on rank 3 but 'g1n2+g2n1' on
// ranks 0-2". Bytes that do not decode, and a list of other names or
// another length (another knapformer version), are named too.
std::string SettingsDisagreement(const std::vector<std::string>& encoded);

// Every rank's reports (by rank) judged alike on every rank: InvalidArgument
// "rank R refused its arguments (why); every rank fails with it" for the
// first rank that refused, Internal for a verdict that does not decode,
// else FailedPrecondition carrying SettingsDisagreement's reason, or OK.
absl::Status CheckSettingsAgree(const std::vector<std::string>& encoded);

// Collective over `world`: all-gathers the encoded settings and returns
// CheckSettingsAgree's verdict on them (the same on every rank), or the
// transport's error when the all-gather fails.
absl::Status AgreeOnSettings(Transport& world, const SharedSettings& mine);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_SETTINGS_AGREEMENT_H_
