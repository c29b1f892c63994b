#ifndef KNAPFORMER_SERVER_ARENA_MESSAGE_ALLOCATOR_H_
#define KNAPFORMER_SERVER_ARENA_MESSAGE_ALLOCATOR_H_

// A gRPC callback method's request and response, both on one protobuf Arena
// whose first block lives inside the holder: a Plan call's ~30 nested
// messages, repeated fields and strings cost one allocation and one free
// instead of one each (malloc and free were ~15% of the server's CPU in
// per-rank mode; see docs/service.md, "Server CPU per call"); a PlanGroup
// request's one message per rank, a few blocks.

#include <cstddef>

#include "google/protobuf/arena.h"
#include "grpcpp/support/message_allocator.h"

namespace knapformer {

template <typename Request, typename Response, size_t kInlineBytes = 2048>
class ArenaMessageAllocator final : public grpc::MessageAllocator<Request, Response> {
 public:
  grpc::MessageHolder<Request, Response>* AllocateMessages() override { return new Holder(); }

 private:
  class Holder final : public grpc::MessageHolder<Request, Response> {
   public:
    Holder() : arena_(Options(block_)) {
      this->set_request(google::protobuf::Arena::CreateMessage<Request>(&arena_));
      this->set_response(google::protobuf::Arena::CreateMessage<Response>(&arena_));
    }
    // Frees the arena (every message and all their parts) with the holder.
    void Release() override { delete this; }

   private:
    static google::protobuf::ArenaOptions Options(char* block) {
      google::protobuf::ArenaOptions options;
      options.initial_block = block;
      options.initial_block_size = kInlineBytes;
      return options;
    }

    alignas(std::max_align_t) char block_[kInlineBytes];
    google::protobuf::Arena arena_;  // after block_: built from it, destroyed before it
  };
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_ARENA_MESSAGE_ALLOCATOR_H_
