#ifndef KNAPFORMER_CLIENT_EXCHANGE_AGREEMENT_H_
#define KNAPFORMER_CLIENT_EXCHANGE_AGREEMENT_H_

// How the ranks of an exchange agree that they can make it (the all-gather
// of client/row_exchange.h's Agreement): every rank's verdict and the
// signature of its tensors, folded into one status. Internal to the
// row_exchange library.

#include <cstdint>

#include "absl/status/status.h"
#include "client/row_move.h"

namespace knapformer {

// Collective over the move's group: every rank's verdict (`mine`, the bytes
// per row it would move) and signature (none in a backward pass or when it
// refuses), folded into the same status on every rank: the lowest failing
// rank's ("rank W: ...", W its world rank), else the first rank whose
// signature differs from the group's first rank's, else Ok.
absl::Status AgreeOnExchange(const RowMove& move, const absl::Status& mine, int64_t row_bytes,
                             const ExchangeSignature* signature);

}  // namespace knapformer

#endif  // KNAPFORMER_CLIENT_EXCHANGE_AGREEMENT_H_
