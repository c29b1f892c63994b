#include "client/planner_target.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace knapformer {
namespace {

// "host:port", "[v6]:port" or "host" -> host.
std::string HostOf(absl::string_view host_port) {
  if (absl::StartsWith(host_port, "[")) {
    const size_t close = host_port.find(']');
    return std::string(close == absl::string_view::npos ? host_port.substr(1)
                                                        : host_port.substr(1, close - 1));
  }
  const size_t colon = host_port.rfind(':');
  // More than one colon without brackets: a bare IPv6 address.
  if (colon != absl::string_view::npos && host_port.find(':') == colon) {
    return std::string(host_port.substr(0, colon));
  }
  return std::string(host_port);
}

bool IsLoopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    return IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr);
  }
  return false;
}

int ResolvedReplicas(const std::string& host) {
  if (host.empty()) return 1;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return 1;
  std::set<std::string> distinct;
  bool all_loopback = true;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    all_loopback = all_loopback && IsLoopback(a->ai_addr);
    char numeric[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, numeric, sizeof(numeric), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      distinct.insert(numeric);
    }
  }
  freeaddrinfo(found);
  if (all_loopback || distinct.empty()) return 1;
  return static_cast<int>(distinct.size());
}

}  // namespace

int PlannerTargetReplicas(const std::string& target) {
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(target, scheme)) continue;
    std::set<std::string> distinct;
    for (absl::string_view address :
         absl::StrSplit(absl::string_view(target).substr(scheme.size()), ',', absl::SkipEmpty())) {
      // gRPC accepts "ipv4:///a:p" as well as "ipv4:a:p".
      if (absl::StartsWith(address, "//")) address.remove_prefix(address.find('/', 2) + 1);
      distinct.insert(std::string(address));
    }
    return distinct.empty() ? 1 : static_cast<int>(distinct.size());
  }
  absl::string_view name = target;
  if (absl::StartsWith(name, "dns:")) {
    name.remove_prefix(4);
    // dns://authority/name: skip the (DNS server) authority.
    if (absl::StartsWith(name, "//")) {
      const size_t slash = name.find('/', 2);
      name = slash == absl::string_view::npos ? absl::string_view() : name.substr(slash + 1);
    }
  } else if (name.find("://") != absl::string_view::npos || absl::StartsWith(name, "unix:") ||
             absl::StartsWith(name, "unix-abstract:")) {
    return 1;
  }
  return ResolvedReplicas(HostOf(name));
}

}  // namespace knapformer
