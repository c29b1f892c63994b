#ifndef KNAPFORMER_TRANSPORT_AGREEMENT_H_
#define KNAPFORMER_TRANSPORT_AGREEMENT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "transport/transport.h"

namespace knapformer {

// Collective over `transport`: every rank's local verdict on the collective
// it is about to enter (`mine`: Ok or why it cannot take part; `row_bytes`:
// the bytes per row it would move, or -1 when the exchange has no single row
// size) in one small all-gather, so that all ranks return the same status:
// the lowest failing rank's error (its code, its message prefixed with its
// rank), else, when row sizes differ, InvalidArgument naming the first rank
// whose size differs from rank 0's, else Ok. A rank that would fail alone
// would leave its peers waiting in the collective until a timeout; this
// turns that into the same immediate error everywhere.
//
// If the all-gather itself fails (a peer gone, a broken transport), that is
// the result: Unavailable or DeadlineExceeded, from the transport.
absl::Status AgreeOnStatus(Transport& transport, const absl::Status& mine,
                           int64_t row_bytes = -1);

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_AGREEMENT_H_
