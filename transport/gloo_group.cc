#include "transport/gloo_group.h"

#include <signal.h>

#include <map>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/version.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace knapformer {

#if TORCH_VERSION_MAJOR >= 2
namespace {

// Earlier 2.x releases construct a ProcessGroup with Options (backend name
// and timeout), 2.6 with the store, rank and size alone. Chosen by which
// constructor exists, so that every 2.x release is right.
template <typename Group = c10d::ProcessGroup>
c10::intrusive_ptr<Group> MakeProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int size, std::chrono::milliseconds timeout) {
  if constexpr (std::is_constructible_v<Group, const c10::intrusive_ptr<c10d::Store>&, int, int>) {
    return c10::make_intrusive<Group>(store, rank, size);
  } else {
    return c10::make_intrusive<Group>(
        store, rank, size, c10::make_intrusive<typename Group::Options>("gloo", timeout));
  }
}

}  // namespace
#endif

namespace {

// Gloo writes to its peers' sockets without MSG_NOSIGNAL: a write to a peer
// that has died raises SIGPIPE, whose default action ends this process, where
// the transport's contract is an error on every survivor. A process that left
// SIGPIPE at its default ignores it from its first group on, as Python does
// at startup; one with a handler of its own keeps it.
void IgnoreSigpipeLeftAtDefault() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && !(current.sa_flags & SA_SIGINFO) &&
      current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> NewGlooGroup(c10::intrusive_ptr<c10d::Store> store,
                                                    int rank, int size,
                                                    const GlooGroupOptions& options) {
  IgnoreSigpipeLeftAtDefault();
  auto gloo = c10d::ProcessGroupGloo::Options::create();
  gloo->timeout = options.timeout;
  gloo->devices.push_back(
      options.hostname.empty()
          ? c10d::ProcessGroupGloo::createDefaultDevice()
          : c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname));
#if TORCH_VERSION_MAJOR >= 2
  // Since 2.0 ProcessGroupGloo is a c10d::Backend: a ProcessGroup fronts
  // it, dispatching CPU tensors to it, as init_process_group("gloo") does.
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo);
  auto group = MakeProcessGroup(store, rank, size, options.timeout);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  return group;
#else
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo);
#endif
}

SubgroupFactory GlooSubgroupFactory(c10::intrusive_ptr<c10d::Store> store,
                                    GlooGroupOptions options) {
  // How many subgroups of each rank list this factory has made: each new one
  // gets a store prefix of its own.
  struct Made {
    absl::Mutex mu;
    std::map<std::vector<int>, int> count ABSL_GUARDED_BY(mu);
  };
  auto made = std::make_shared<Made>();
  return [store = std::move(store), options = std::move(options), made](
             const std::vector<int>& global_ranks, int rank) {
    int serial = 0;
    {
      absl::MutexLock lock(&made->mu);
      serial = made->count[global_ranks]++;
    }
    const std::string prefix =
        absl::StrCat("knapformer/subgroup/", absl::StrJoin(global_ranks, ","), "/", serial);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return NewGlooGroup(prefixed, rank, static_cast<int>(global_ranks.size()), options);
  };
}

}  // namespace knapformer
