#ifndef KNAPFORMER_SERVER_ARENA_MESSAGES_H_
#define KNAPFORMER_SERVER_ARENA_MESSAGES_H_

// A call's request and response, both on one protobuf Arena whose first
// block lives inside the holder: a Plan call's ~30 nested messages, repeated
// fields and strings cost one allocation and one free instead of one each
// (malloc and free were ~15% of the server's CPU in per-rank mode; see
// docs/service.md, "Server CPU per call"); a PlanGroup request's one message
// per rank, a few blocks. The service's calls hold one each and parse their
// request into it themselves (request_scan.h says why).

#include <cstddef>

#include "google/protobuf/arena.h"

namespace knapformer {

template <typename Request, typename Response, size_t kInlineBytes = 2048>
class ArenaMessages {
 public:
  ArenaMessages()
      : arena_(Options(block_)),
        request_(google::protobuf::Arena::CreateMessage<Request>(&arena_)),
        response_(google::protobuf::Arena::CreateMessage<Response>(&arena_)) {}
  ArenaMessages(const ArenaMessages&) = delete;
  ArenaMessages& operator=(const ArenaMessages&) = delete;

  Request* request() { return request_; }
  const Request* request() const { return request_; }
  Response* response() { return response_; }

 private:
  static google::protobuf::ArenaOptions Options(char* block) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = kInlineBytes;
    return options;
  }

  alignas(std::max_align_t) char block_[kInlineBytes];
  google::protobuf::Arena arena_;  // after block_: built from it, destroyed before it
  Request* const request_;
  Response* const response_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_ARENA_MESSAGES_H_
