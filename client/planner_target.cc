#include "client/planner_target.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/loopback.h"

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

// What follows a target's scheme without its authority, as gRPC reads
// URIs: "//authority/path" and "/path" give "path" (dns:///host:port,
// dns://server/host:port, dns:/host:port), "//authority" alone gives "",
// anything else is the path itself (dns:host:port, ipv4:a:p).
absl::string_view UriPath(absl::string_view rest) {
  if (absl::StartsWith(rest, "//")) {
    const size_t slash = rest.find('/', 2);
    return slash == absl::string_view::npos ? absl::string_view() : rest.substr(slash + 1);
  }
  if (absl::StartsWith(rest, "/")) rest.remove_prefix(1);
  return rest;
}

// The addresses an ipv4: or ipv6: target lists (ipv4:a:p,b:q and
// ipv4:///a:p alike), or nullopt when the target is neither.
std::optional<std::vector<absl::string_view>> ListedAddresses(absl::string_view target) {
  for (absl::string_view scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(target, scheme)) continue;
    std::vector<absl::string_view> addresses =
        absl::StrSplit(UriPath(target.substr(scheme.size())), ',', absl::SkipEmpty());
    return addresses;
  }
  return std::nullopt;
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

constexpr const char* kForms =
    "a planner address is host:port (e.g. 127.0.0.1:50051 or planner.ns.svc:50051), "
    "[ipv6]:port, dns:///host:port, ipv4:a:p,b:q, ipv6:[a]:p or unix:path";

absl::Status Refused(const std::string& target, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("planner_address: '", target, "' ", why, "; ", kForms));
}

// host:port or [v6]:port, as gRPC's dns and ipv4/ipv6 resolvers take it.
absl::Status CheckHostPort(const std::string& target, absl::string_view host_port) {
  absl::string_view host, port;
  if (absl::StartsWith(host_port, "[")) {
    const size_t close = host_port.find(']');
    if (close == absl::string_view::npos) return Refused(target, "has no ']' after its '['");
    host = host_port.substr(1, close - 1);
    absl::string_view rest = host_port.substr(close + 1);
    if (!absl::StartsWith(rest, ":")) return Refused(target, "has no port");
    port = rest.substr(1);
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == absl::string_view::npos) {
      return Refused(target, "has no port (gRPC would try 443)");
    }
    if (host_port.find(':') != colon) {
      return Refused(target, "is an IPv6 address without brackets");
    }
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
  }
  if (host.empty()) return Refused(target, "has no host");
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return absl::ascii_isdigit(c); })) {
    return Refused(target, absl::StrCat("has port '", port, "', not a number in 1..65535"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPlannerTarget(const std::string& target) {
  absl::string_view rest = target;
  if (rest.empty()) return Refused(target, "is empty");
  if (absl::StartsWith(rest, "unix:") || absl::StartsWith(rest, "unix-abstract:")) {
    return rest.substr(rest.find(':') + 1).empty() ? Refused(target, "names no socket")
                                                   : absl::OkStatus();
  }
  if (const auto listed = ListedAddresses(rest)) {
    if (listed->empty()) return Refused(target, "lists no address");
    for (absl::string_view address : *listed) {
      if (absl::Status ok = CheckHostPort(target, address); !ok.ok()) return ok;
    }
    return absl::OkStatus();
  }
  if (absl::StartsWith(rest, "dns:")) return CheckHostPort(target, UriPath(rest.substr(4)));
  if (const size_t scheme_end = rest.find("://"); scheme_end != absl::string_view::npos) {
    const std::string scheme(rest.substr(0, scheme_end));
    // Resolvers gRPC has besides those above; their targets are theirs.
    if (scheme == "xds" || scheme == "vsock" || scheme == "google-c2p") return absl::OkStatus();
    return Refused(target, absl::StrCat("is a URL of scheme '", scheme,
                                        "', which gRPC does not resolve (drop '", scheme,
                                        "://')"));
  }
  return CheckHostPort(target, rest);
}

int PlannerAddressReplicas(const std::vector<std::string>& addresses) {
  // By family: a dual-stack host (an A and an AAAA record) is one planner.
  std::set<std::string> v4, v6;
  bool all_loopback = true;
  for (const std::string& address : addresses) {
    in_addr a4;
    in6_addr a6;
    if (inet_pton(AF_INET, address.c_str(), &a4) == 1) {
      v4.insert(address);
      all_loopback = all_loopback && IsLoopbackHost(address);
    } else if (inet_pton(AF_INET6, address.c_str(), &a6) == 1) {
      v6.insert(address);
      all_loopback = all_loopback && IsLoopbackHost(address);
    } else {
      all_loopback = false;
      v4.insert(address);  // not numeric: counted as itself
    }
  }
  if (all_loopback) return 1;
  return std::max<int>(1, static_cast<int>(std::max(v4.size(), v6.size())));
}

bool PlannerTargetIsLocal(const std::string& target) {
  if (absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:")) {
    return true;
  }
  if (const auto listed = ListedAddresses(target)) {
    return !listed->empty() && std::all_of(listed->begin(), listed->end(),
                                           [](absl::string_view address) {
                                             return IsLoopbackHost(HostOf(address));
                                           });
  }
  absl::string_view name = target;
  if (absl::StartsWith(name, "dns:")) {
    name = UriPath(name.substr(4));
  } else if (name.find("://") != absl::string_view::npos) {
    return false;
  }
  return IsLoopbackHost(HostOf(name));
}

int PlannerTargetReplicas(const std::string& target) {
  if (const auto listed = ListedAddresses(target)) {
    const std::set<absl::string_view> distinct(listed->begin(), listed->end());
    return distinct.empty() ? 1 : static_cast<int>(distinct.size());
  }
  absl::string_view name = target;
  if (absl::StartsWith(name, "dns:")) {
    name = UriPath(name.substr(4));  // skips a (DNS server) authority
  } else if (name.find("://") != absl::string_view::npos || absl::StartsWith(name, "unix:") ||
             absl::StartsWith(name, "unix-abstract:")) {
    return 1;
  }
  return ResolvedReplicas(HostOf(name));
}

}  // namespace knapformer
