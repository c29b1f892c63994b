#ifndef KNAPFORMER_TESTS_CLIENT_SLOW_CONNECT_PROXY_H_
#define KNAPFORMER_TESTS_CLIENT_SLOW_CONNECT_PROXY_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace knapformer {

// A TCP proxy on 127.0.0.1 (a free port) in front of 127.0.0.1:target_port
// that holds every new connection `delay` before it forwards a byte: the
// client sees the service's first HTTP/2 frame that much later, as on a
// loaded machine or a slow network. Bytes then pass unchanged both ways.
class SlowConnectProxy {
 public:
  static absl::StatusOr<std::unique_ptr<SlowConnectProxy>> Start(int target_port,
                                                                 absl::Duration delay);
  // Stops accepting, closes every connection and joins its threads.
  ~SlowConnectProxy();

  int port() const { return port_; }
  // Connections accepted so far.
  int connections() const { return connections_.load(); }

 private:
  SlowConnectProxy(int listen_fd, int port, int target_port, absl::Duration delay);
  void AcceptLoop();
  void Forward(int client_fd);

  const int listen_fd_;
  const int port_;
  const int target_port_;
  const absl::Duration delay_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  absl::Mutex mu_;
  std::vector<std::thread> forwarders_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_CLIENT_SLOW_CONNECT_PROXY_H_
