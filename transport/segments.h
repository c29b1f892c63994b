#ifndef KNAPFORMER_TRANSPORT_SEGMENTS_H_
#define KNAPFORMER_TRANSPORT_SEGMENTS_H_

// The messages of a segment all-to-all: apart from transport.h so that the
// backends' checks of them (backend_checks.h) need not include the
// interface that uses those checks.

#include <cstdint>

namespace knapformer {

// One message of a segment all-to-all (AllToAllOptions::Segments): `bytes`
// bytes from `data` to `peer`, or from `peer` into `data`.
struct SendSegment {
  int peer = 0;
  const void* data = nullptr;
  int64_t bytes = 0;
};
struct RecvSegment {
  int peer = 0;
  void* data = nullptr;
  int64_t bytes = 0;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_SEGMENTS_H_
