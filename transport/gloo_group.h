#ifndef KNAPFORMER_TRANSPORT_GLOO_GROUP_H_
#define KNAPFORMER_TRANSPORT_GLOO_GROUP_H_

// Gloo process groups made in C++ (the command line's local worlds, the
// benchmarks, the C++ tests). Apart from c10d_transport because it needs
// LibTorch's Gloo headers, which the Python package does not: its groups
// come from torch.distributed.

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "transport/c10d_transport.h"

namespace knapformer {

struct GlooGroupOptions {
  // The host name or address whose interface Gloo binds ("127.0.0.1" for
  // one machine); empty = Gloo's default device (the host's name).
  std::string hostname;
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
};

// A Gloo process group over `store` (a TCPStore shared by all ranks). A
// process that left SIGPIPE at its default ignores it from then on: a peer
// that dies is an error on the survivors, not their end by signal.
c10::intrusive_ptr<c10d::ProcessGroup> NewGlooGroup(c10::intrusive_ptr<c10d::Store> store,
                                                    int rank, int size,
                                                    const GlooGroupOptions& options);

// Subgroups as Gloo groups over PrefixStores of `store`, named by their rank
// list and how many times that list was asked for.
SubgroupFactory GlooSubgroupFactory(c10::intrusive_ptr<c10d::Store> store,
                                    GlooGroupOptions options);

}  // namespace knapformer

#endif  // KNAPFORMER_TRANSPORT_GLOO_GROUP_H_
