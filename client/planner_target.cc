#include "client/planner_target.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
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

int ResolvedReplicas(const std::string& host) {
  if (host.empty()) return 1;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return 1;
  std::vector<std::string> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char numeric[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, numeric, sizeof(numeric), nullptr, 0,
                    NI_NUMERICHOST) == 0) {
      addresses.push_back(numeric);
    }
  }
  freeaddrinfo(found);
  return PlannerAddressReplicas(addresses);
}

}  // namespace

int PlannerAddressReplicas(const std::vector<std::string>& addresses) {
  // By family: a dual-stack host (an A and an AAAA record) is one planner.
  std::set<std::string> v4, v6;
  bool all_loopback = true;
  for (const std::string& address : addresses) {
    in_addr a4;
    in6_addr a6;
    if (inet_pton(AF_INET, address.c_str(), &a4) == 1) {
      v4.insert(address);
      all_loopback = all_loopback && (ntohl(a4.s_addr) >> 24) == 127;
    } else if (inet_pton(AF_INET6, address.c_str(), &a6) == 1) {
      v6.insert(address);
      all_loopback = all_loopback && IN6_IS_ADDR_LOOPBACK(&a6);
    } else {
      all_loopback = false;
      v4.insert(address);  // not numeric: counted as itself
    }
  }
  if (all_loopback) return 1;
  return std::max<int>(1, static_cast<int>(std::max(v4.size(), v6.size())));
}

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
    // dns://authority/name: skip the (DNS server) authority; dns:/name and
    // dns:name are gRPC's too.
    if (absl::StartsWith(name, "//")) {
      const size_t slash = name.find('/', 2);
      name = slash == absl::string_view::npos ? absl::string_view() : name.substr(slash + 1);
    } else if (absl::StartsWith(name, "/")) {
      name.remove_prefix(1);
    }
  } else if (name.find("://") != absl::string_view::npos || absl::StartsWith(name, "unix:") ||
             absl::StartsWith(name, "unix-abstract:")) {
    return 1;
  }
  return ResolvedReplicas(HostOf(name));
}

}  // namespace knapformer
