// The planner service under load: R ranks of one group over 127.0.0.1.
//
// Figures only, nothing is asserted. The server (knapformer::PlannerServer)
// runs in a child process forked before this process creates any gRPC object,
// so that its CPU time can be read from /proc/<pid>/stat on its own. The
// client plays every rank of one group with gRPC's callback API over 8
// channels (8 TCP connections), each step sending the R Plan requests of the
// paper's synthetic mixed-resolution stream and waiting for the R answers.
//
// Per R, after the warm-up steps:
//   steps/s         measured steps / their summed step latency
//   p50, p99        step latency: from just before the first request is sent
//                   to the arrival of the last answer (building the requests
//                   is not timed)
//   server CPU      the child's utime+stime over the measured steps, per step
//                   (clock-tick resolution: 1/sysconf(_SC_CLK_TCK) s in total)
//   bare ...        the same steps against a bare gRPC rendezvous in a second
//                   child (bench/bare_rendezvous.h: same RPC, replies of the
//                   same weight, no plan), measured right before the planner
//                   at each R: the floor of per-rank mode's server CPU per call
//   core solve      BalanceGreedy on the same batches in this process, median
//   client CPU      this process's CPU over the measured steps, per step
//   plan_micros     the server's own solve time as it reports it, median
//
//   bazel build -c opt //bench:service_load_bench
//   bazel-bin/bench/service_load_bench --ranks 32,256,1024,4096 --steps 100 --warmup 5
//
// Defaults: ranks 32,256,1024,4096, 100 steps (30 at 4096 ranks unless
// --steps is given), 5 warm-up steps. Exits non-zero if any call fails.

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/bare_rendezvous.h"
#include "grpcpp/grpcpp.h"
#include "knapformer/v1/planner.grpc.pb.h"
#include "planner/balancer.h"
#include "planner/cost_model.h"
#include "planner/data_stream.h"
#include "planner/plan_from_chunks.h"
#include "planner/topology.h"
#include "proto/plan_proto.h"
#include "server/planner_server.h"
#include "server/service_limits.h"
#include "common/malloc_policy.h"
#include "common/sample_stats.h"

namespace knapformer {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kScenario[] = "mixed-res";
constexpr uint64_t kStreamSeed = 0;
constexpr int32_t kDModel = 3072;
constexpr double kGamma = 0.49;
constexpr int64_t kTokenBytes = int64_t{kDModel} * 2;  // bf16 hidden states
constexpr int kChannels = 8;
constexpr char kChannelIndexArg[] = "knapformer.channel_index";

constexpr int64_t kDefaultSteps = 100;
constexpr int64_t kDefaultStepsAt4096 = 30;
constexpr int64_t kDefaultWarmup = 5;
const std::vector<int64_t> kDefaultRanks = {32, 256, 1024, 4096};

// Server side.
constexpr int32_t kMaxWorldSize = 16384;
constexpr absl::Duration kRendezvousTimeout = absl::Seconds(120);
constexpr absl::Duration kServerShutdownGrace = absl::Seconds(2);

// Bounds on every wait of the client.
constexpr absl::Duration kCallDeadline = absl::Seconds(60);
constexpr absl::Duration kStepWait = absl::Seconds(90);  // kCallDeadline + 30 s
constexpr absl::Duration kCancelWait = absl::Seconds(30);
constexpr int kPortWaitMs = 30000;
constexpr int kConnectWaitSeconds = 10;
constexpr int kChildExitWaitMs = 15000;

// The bare rendezvous's answers carry this much filler, so that they weigh
// about what the planner's do (~230 bytes per rank; both columns printed).
constexpr int kBareReplyPaddingBytes = 200;

// ---------------------------------------------------------------------------
// Flags.

struct Flags {
  std::vector<int64_t> ranks = kDefaultRanks;
  int64_t steps = kDefaultSteps;
  bool steps_given = false;
  int64_t warmup = kDefaultWarmup;
  int64_t soak_minutes = 0;  // 0: the table; else the soak, at the first --ranks
  int64_t sample_seconds = 60;
  bool overload = false;  // instead: the overload run, at the first --ranks
};

void PrintUsage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--ranks 32,256,1024,4096] [--steps 100] [--warmup 5]\n"
               "          [--soak-minutes M [--sample-seconds 60]] [--overload]\n"
               "  --ranks   comma-separated group sizes (multiples of 32)\n"
               "  --steps   measured steps per group size (default 100, 30 at 4096 ranks)\n"
               "  --warmup  unmeasured steps before them (default 5)\n"
               "  --soak-minutes  instead: step the first group size without pause for M\n"
               "                  minutes, printing every --sample-seconds the server's RSS,\n"
               "                  open fds, CPU and the window's step latency\n"
               "  --overload      instead: the first group size steps while stray requests\n"
               "                  flood the server with 10x its pending-step and job limits\n",
               argv0);
}

bool ParsePositive(const std::string& text, int64_t min_value, int64_t* out) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min_value) return false;
  *out = value;
  return true;
}

// Returns false (after printing why) on a bad command line.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") return false;
    if (arg == "--overload") {
      flags->overload = true;
      continue;
    }
    std::string name = arg;
    std::string value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (name != "--ranks" && name != "--steps" && name != "--warmup" &&
        name != "--soak-minutes" && name != "--sample-seconds") {
      std::fprintf(stderr, "unknown flag '%s'\n", arg.c_str());
      return false;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", name.c_str());
        return false;
      }
      value = argv[++i];
    }
    if (name == "--ranks") {
      flags->ranks.clear();
      for (absl::string_view piece : absl::StrSplit(value, ',')) {
        int64_t r = 0;
        if (!ParsePositive(std::string(piece), 1, &r) || r > kMaxWorldSize) {
          std::fprintf(stderr, "--ranks: '%s' is not a rank count in [1, %d]\n",
                       std::string(piece).c_str(), kMaxWorldSize);
          return false;
        }
        flags->ranks.push_back(r);
      }
    } else if (name == "--steps") {
      if (!ParsePositive(value, 1, &flags->steps)) {
        std::fprintf(stderr, "--steps: '%s' is not a positive integer\n", value.c_str());
        return false;
      }
      flags->steps_given = true;
    } else if (name == "--soak-minutes" || name == "--sample-seconds") {
      int64_t* out = name == "--soak-minutes" ? &flags->soak_minutes : &flags->sample_seconds;
      if (!ParsePositive(value, 1, out)) {
        std::fprintf(stderr, "%s: '%s' is not a positive integer\n", name.c_str(), value.c_str());
        return false;
      }
    } else {
      if (!ParsePositive(value, 0, &flags->warmup)) {
        std::fprintf(stderr, "--warmup: '%s' is not a non-negative integer\n", value.c_str());
        return false;
      }
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// The server's child process.

enum class ServerKind { kPlanner, kBareRendezvous };

// The server a child runs: a PlannerServer or the bare rendezvous, whichever
// StartChildServer was asked for, listening on `port`.
struct ChildServer {
  std::unique_ptr<PlannerServer> planner;
  BareRendezvousServer bare;
  int32_t port = 0;

  void Stop() {
    if (planner != nullptr) planner->Shutdown(kServerShutdownGrace);
    if (bare.server != nullptr) {
      bare.server->Shutdown(absl::ToChronoTime(absl::Now() + kServerShutdownGrace));
      bare.server->Wait();
    }
  }
};

absl::StatusOr<ChildServer> StartChildServer(ServerKind kind) {
  ChildServer child;
  if (kind == ServerKind::kBareRendezvous) {
    absl::StatusOr<BareRendezvousServer> bare = StartBareRendezvous(kBareReplyPaddingBytes);
    if (!bare.ok()) return bare.status();
    child.bare = *std::move(bare);
    child.port = child.bare.port;
    return child;
  }
  PlannerServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_address.clear();
  options.service.limits.max_world_size = kMaxWorldSize;
  options.service.limits.rendezvous_timeout = kRendezvousTimeout;
  absl::StatusOr<std::unique_ptr<PlannerServer>> server = PlannerServer::Start(options);
  if (!server.ok()) return server.status();
  child.planner = *std::move(server);
  child.port = child.planner->port();
  return child;
}

// Closes every descriptor above stderr but `a` and `b`: close_range where
// the kernel has it (5.9+), else one by one.
void CloseAllFdsBut(int a, int b) {
  const int low = std::min(a, b);
  const int high = std::max(a, b);
  const bool ranged = (low <= 3 || close_range(3, low - 1, 0) == 0) &&
                      (high <= low + 1 || close_range(low + 1, high - 1, 0) == 0) &&
                      close_range(high + 1, ~0U, 0) == 0;
  if (ranged) return;
  const long most = std::min(sysconf(_SC_OPEN_MAX), 1L << 20);
  for (int fd = 3; fd < most; ++fd) {
    if (fd != a && fd != b) close(fd);
  }
}

// Runs in the child, which has no threads yet. Never returns.
[[noreturn]] void RunServerChild(ServerKind kind, pid_t parent, int port_fd, int stop_fd) {
  // SIGTERM is taken through a signalfd, so it is blocked before the server
  // starts any thread (threads inherit the mask). The parent's death is seen
  // as EOF on stop_fd, and also turned into a SIGTERM.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_BLOCK, &term, nullptr);
  const int signal_fd = signalfd(-1, &term, SFD_CLOEXEC);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(1);

  absl::StatusOr<ChildServer> server = StartChildServer(kind);
  if (!server.ok()) {
    std::fprintf(stderr, "server child: %s\n", server.status().ToString().c_str());
    _exit(1);
  }
  const int32_t port = server->port;
  if (write(port_fd, &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) _exit(1);
  close(port_fd);

  while (true) {
    pollfd fds[2] = {{stop_fd, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    const int n = poll(fds, signal_fd >= 0 ? 2 : 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    if (fds[1].revents != 0) break;  // SIGTERM
    if (fds[0].revents != 0) {
      char byte;
      const ssize_t got = read(stop_fd, &byte, 1);
      if (got < 0 && errno == EINTR) continue;
      break;  // EOF (the parent closed its end or died) or anything written
    }
  }
  server->Stop();
  _exit(0);
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)),
                        ")", WCOREDUMP(status) ? ", core dumped" : "");
  }
  return absl::StrCat("wait status ", status);
}

// The server child: started before any gRPC object exists in this process,
// stopped (and reaped, killed if need be) on every way out.
class ServerProcess {
 public:
  explicit ServerProcess(ServerKind kind) : kind_(kind) {}
  ~ServerProcess() { Stop(); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // Forks the child and waits (bounded) for its port. False after printing why.
  bool Start() {
    int port_pipe[2];
    int stop_pipe[2];
    if (pipe2(port_pipe, O_CLOEXEC) != 0) {
      std::perror("pipe");
      return false;
    }
    if (pipe2(stop_pipe, O_CLOEXEC) != 0) {
      std::perror("pipe");
      close(port_pipe[0]);
      close(port_pipe[1]);
      return false;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (int fd : {port_pipe[0], port_pipe[1], stop_pipe[0], stop_pipe[1]}) close(fd);
      return false;
    }
    if (pid == 0) {
      // Only this child's own pipe ends: a child that kept an earlier
      // child's stop pipe open kept that child from ever seeing EOF, so
      // every server child but the last was killed after kChildExitWaitMs.
      CloseAllFdsBut(port_pipe[1], stop_pipe[0]);
      RunServerChild(kind_, parent, port_pipe[1], stop_pipe[0]);
    }
    pid_ = pid;
    close(port_pipe[1]);
    close(stop_pipe[0]);
    stop_fd_ = stop_pipe[1];

    int32_t port = 0;
    size_t have = 0;
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(kPortWaitMs);
    while (have < sizeof(port)) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) break;
      pollfd fd = {port_pipe[0], POLLIN, 0};
      const int n = poll(&fd, 1, static_cast<int>(left));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      const ssize_t got =
          read(port_pipe[0], reinterpret_cast<char*>(&port) + have, sizeof(port) - have);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      have += static_cast<size_t>(got);
    }
    close(port_pipe[0]);
    if (have != sizeof(port) || port <= 0) {
      std::fprintf(stderr, "server child %d did not report a port within %d ms (%s)\n",
                   static_cast<int>(pid_), kPortWaitMs, Stop().c_str());
      return false;
    }
    port_ = port;
    return true;
  }

  pid_t pid() const { return pid_; }
  int port() const { return port_; }

  // The child's resident set (VmRSS), bytes; -1 if unreadable.
  int64_t RssBytes() const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      int64_t kb = 0;
      if (line.rfind("VmRSS:", 0) == 0 &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(
                               absl::StripSuffix(absl::string_view(line).substr(6), "kB")),
                           &kb)) {
        return kb * 1024;
      }
    }
    return -1;
  }

  // The child's open file descriptors; -1 if unreadable.
  int OpenFds() const {
    const std::string dir = absl::StrCat("/proc/", pid_, "/fd");
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return -1;
    int count = 0;
    while (dirent* entry = readdir(d)) {
      if (entry->d_name[0] != '.') ++count;
    }
    closedir(d);
    return count;
  }

  // utime + stime of the child (all its threads), seconds; nullopt if gone.
  std::optional<double> CpuSeconds() const {
    if (pid_ <= 0 || reaped_) return std::nullopt;
    std::ifstream in(absl::StrCat("/proc/", pid_, "/stat"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren == std::string::npos) return std::nullopt;
    // After "pid (comm)": field 3 (state) onwards; utime and stime are 14, 15.
    std::istringstream fields(text.substr(paren + 1));
    std::string skip;
    for (int field = 3; field <= 13; ++field) fields >> skip;
    unsigned long long utime = 0, stime = 0;
    if (!(fields >> utime >> stime)) return std::nullopt;
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  // Empty while the child runs; how it ended once it has (reaping it).
  std::string ExitIfEnded() {
    if (pid_ <= 0) return "not started";
    if (reaped_) return how_;
    int status = 0;
    const pid_t got = waitpid(pid_, &status, WNOHANG);
    if (got == pid_) {
      reaped_ = true;
      how_ = DescribeWaitStatus(status);
      return how_;
    }
    return "";
  }

  // Asks the child to stop (closes the pipe), waits up to kChildExitWaitMs,
  // then kills it. Returns how it ended. Idempotent.
  std::string Stop() {
    if (pid_ <= 0) return "not started";
    if (stop_fd_ >= 0) {
      close(stop_fd_);
      stop_fd_ = -1;
    }
    const Clock::time_point until = Clock::now() + std::chrono::milliseconds(kChildExitWaitMs);
    while (!reaped_) {
      if (!ExitIfEnded().empty()) break;
      if (Clock::now() >= until) {
        kill(pid_, SIGKILL);
        int status = 0;
        while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        reaped_ = true;
        how_ = absl::StrCat("did not exit within ", kChildExitWaitMs,
                            " ms of being asked to, killed (", DescribeWaitStatus(status), ")");
        break;
      }
      usleep(10 * 1000);
    }
    return how_;
  }

 private:
  const ServerKind kind_;
  pid_t pid_ = -1;
  int port_ = 0;
  int stop_fd_ = -1;
  bool reaped_ = false;
  std::string how_;
};

double SelfCpuSeconds() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

// ---------------------------------------------------------------------------
// One step: R calls in flight, answered through callbacks.

struct StepCalls {
  explicit StepCalls(size_t ranks)
      : requests(ranks), responses(ranks), contexts(ranks), statuses(ranks) {}

  std::vector<v1::PlanRequest> requests;
  std::vector<v1::PlanResponse> responses;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<grpc::Status> statuses;  // written by each call's callback

  absl::Mutex mu;
  size_t done ABSL_GUARDED_BY(mu) = 0;
  Clock::time_point last_answer ABSL_GUARDED_BY(mu);
};

struct StepResult {
  bool all_done = false;  // false: calls still in flight, nothing may be freed
  double latency_ms = 0;
  int64_t failed = 0;
  std::map<int, int64_t> codes;          // failed calls by status code
  std::map<int, std::string> first_msg;  // first message per code
  int64_t wrong_answer = 0;              // OK, but rank or step not the one asked
  std::string first_wrong;
  int64_t plan_micros = -1;  // server-reported solve time
};

const char* CodeName(int code) {
  // clang-format off
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  // clang-format on
  return code >= 0 && code < 17 ? kNames[code] : "?";
}

class LoadClient {
 public:
  explicit LoadClient(int port) {
    const std::string target = absl::StrCat("127.0.0.1:", port);
    for (int i = 0; i < kChannels; ++i) {
      grpc::ChannelArguments args;
      // Distinct arguments: a channel of its own, hence a TCP connection of its own.
      args.SetInt(kChannelIndexArg, i);
      args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
      channels_.push_back(
          grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::Planner::NewStub(channels_.back()));
    }
  }

  // False (after printing why) unless every channel connects in time.
  bool Connect() {
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::seconds(kConnectWaitSeconds);
    for (int i = 0; i < kChannels; ++i) {
      if (!channels_[i]->WaitForConnected(deadline)) {
        std::fprintf(stderr, "channel %d did not connect within %d s\n", i, kConnectWaitSeconds);
        return false;
      }
    }
    return true;
  }

  // Sends every request of `calls` (already built), waits for every answer.
  StepResult Run(StepCalls& calls, uint64_t step) {
    const size_t n = calls.requests.size();
    const auto deadline =
        std::chrono::system_clock::now() + absl::ToChronoNanoseconds(kCallDeadline);
    for (size_t r = 0; r < n; ++r) {
      calls.contexts[r] = std::make_unique<grpc::ClientContext>();
      calls.contexts[r]->set_deadline(deadline);
    }
    StepCalls* const c = &calls;
    const Clock::time_point start = Clock::now();
    for (size_t r = 0; r < n; ++r) {
      stubs_[r % kChannels]->async()->Plan(calls.contexts[r].get(), &calls.requests[r],
                                           &calls.responses[r], [c, r, n](grpc::Status status) {
                                             c->statuses[r] = std::move(status);
                                             const Clock::time_point now = Clock::now();
                                             absl::MutexLock lock(&c->mu);
                                             if (++c->done == n) c->last_answer = now;
                                           });
    }

    StepResult result;
    auto all_done = [c, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu) { return c->done == n; };
    {
      absl::MutexLock lock(&calls.mu);
      result.all_done = calls.mu.AwaitWithTimeout(absl::Condition(&all_done), kStepWait);
    }
    if (!result.all_done) {
      size_t done;
      {
        absl::MutexLock lock(&calls.mu);
        done = calls.done;
      }
      std::fprintf(stderr, "step %llu: only %zu of %zu answers after %s; cancelling the rest\n",
                   static_cast<unsigned long long>(step), done, n,
                   absl::FormatDuration(kStepWait).c_str());
      for (auto& context : calls.contexts) context->TryCancel();
      absl::MutexLock lock(&calls.mu);
      result.all_done = calls.mu.AwaitWithTimeout(absl::Condition(&all_done), kCancelWait);
      if (!result.all_done) return result;
    }
    {
      absl::MutexLock lock(&calls.mu);
      result.latency_ms =
          std::chrono::duration<double, std::milli>(calls.last_answer - start).count();
    }
    for (size_t r = 0; r < n; ++r) {
      const grpc::Status& status = calls.statuses[r];
      if (!status.ok()) {
        ++result.failed;
        const int code = static_cast<int>(status.error_code());
        if (result.codes[code]++ == 0) {
          result.first_msg[code] = absl::StrCat("rank ", r, ": ", status.error_message());
        }
        continue;
      }
      const v1::PlanResponse& response = calls.responses[r];
      if (response.plan().rank() != static_cast<int32_t>(r) || response.step() != step) {
        if (result.wrong_answer++ == 0) {
          result.first_wrong = absl::StrCat("rank ", r, " step ", step, " got plan.rank ",
                                            response.plan().rank(), " step ", response.step());
        }
        continue;
      }
      if (result.plan_micros < 0) result.plan_micros = response.balance().plan_micros();
    }
    return result;
  }

 private:
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Planner::Stub>> stubs_;
};

// ---------------------------------------------------------------------------
// One group size.

struct Problem {
  int64_t ranks = 0;
  std::string topology;
  DataStream stream;
  World world;
  CostModel cost;
};

int64_t BlockGpus(const std::vector<DataCode>& codes) {
  int64_t block = 0;
  for (const DataCode& code : codes) block += code.gpus;
  return block;
}

// The problem at `requested` ranks, or at the nearest valid size (printing
// what was used) when the stream or the topology rejects it.
absl::StatusOr<Problem> MakeProblem(const std::vector<DataCode>& codes, int64_t requested) {
  int64_t ranks = requested;
  // The topology g1n{R/2}+g2n{R/8}+g4n{R/16} needs R % 16 == 0; the stream a
  // multiple of its block. Both hold at multiples of lcm(block, 16).
  if (!DataStream::Create(codes, ranks, kStreamSeed).ok() || ranks % 16 != 0) {
    const int64_t block = BlockGpus(codes);
    int64_t unit = block;
    while (unit % 16 != 0) unit += block;
    ranks = std::max<int64_t>(unit, (requested + unit / 2) / unit * unit);
    while (ranks > kMaxWorldSize) ranks -= unit;
    std::fprintf(stderr, "note: %lld ranks is not valid for %s (multiples of %lld); using %lld\n",
                 static_cast<long long>(requested), kScenario, static_cast<long long>(unit),
                 static_cast<long long>(ranks));
    std::fflush(stderr);
  }
  auto stream = DataStream::Create(codes, ranks, kStreamSeed);
  if (!stream.ok()) return stream.status();
  const std::string spec = absl::StrCat("g1n", ranks / 2, "+g2n", ranks / 8, "+g4n", ranks / 16);
  auto topology = Topology::Parse(spec);
  if (!topology.ok()) return topology.status();
  auto world = World::Create(*topology, ranks);
  if (!world.ok()) return world.status();
  auto cost = CostModel::Create(kDModel, kGamma);
  if (!cost.ok()) return cost.status();
  return Problem{ranks, spec, *std::move(stream), *std::move(world), *cost};
}

v1::StepSpec StepSpecOf(const Problem& problem, const std::string& job_id, uint64_t step) {
  v1::StepSpec spec;
  spec.set_job_id(job_id);
  spec.set_step(step);
  spec.set_world_size(static_cast<int32_t>(problem.ranks));
  spec.set_topology(problem.topology);
  spec.set_d_model(kDModel);
  spec.set_gamma(kGamma);
  spec.set_token_bytes(kTokenBytes);
  return spec;
}

// The planner core's median solve time on batches first..first+steps-1, in
// this process (the server idle).
absl::StatusOr<double> CoreSolveMs(const Problem& problem, int64_t first, int64_t steps) {
  std::vector<double> solve_ms;
  for (int64_t i = 0; i < steps; ++i) {
    const RankLengths lengths = problem.stream.Batch(first + i);
    const Clock::time_point start = Clock::now();
    absl::StatusOr<Plan> plan = BalanceGreedy(problem.world, problem.cost, lengths);
    const Clock::time_point end = Clock::now();
    if (!plan.ok()) return plan.status();
    solve_ms.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  return Median(solve_ms);
}

void BuildRequests(const Problem& problem, const std::string& job_id, uint64_t step,
                   StepCalls& calls) {
  const RankLengths lengths = problem.stream.Batch(static_cast<int64_t>(step));
  const v1::StepSpec spec = StepSpecOf(problem, job_id, step);
  for (int64_t r = 0; r < problem.ranks; ++r) {
    v1::PlanRequest& request = calls.requests[r];
    *request.mutable_spec() = spec;
    request.set_rank(static_cast<int32_t>(r));
    request.mutable_sequence_lengths()->Add(lengths[r].begin(), lengths[r].end());
  }
}

struct Row {
  int64_t requested = 0;  // as asked by --ranks (ranks may differ, see MakeProblem)
  int64_t ranks = 0;
  int64_t steps = 0;  // measured and completed
  std::vector<double> latency_ms;
  double server_cpu_ms_per_step = NAN;
  double client_cpu_ms_per_step = NAN;
  double core_solve_ms = NAN;
  std::vector<double> plan_ms;  // server-reported
  int64_t failed_calls = 0;
  bool aborted = false;
  double wire_kib_per_step = NAN;  // request + answer payloads, all ranks
};

std::string Fixed(double value, int digits) {
  if (std::isnan(value)) return "n/a";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

// Server CPU per rank per call, microseconds.
double MicrosPerCall(const Row& row) {
  return 1000.0 * row.server_cpu_ms_per_step / static_cast<double>(row.ranks);
}

void PrintRow(const Row& row, const Row& bare) {
  double total_ms = 0;
  for (double ms : row.latency_ms) total_ms += ms;
  const double steps_per_s =
      row.latency_ms.empty() ? NAN : 1000.0 * static_cast<double>(row.latency_ms.size()) / total_ms;
  const std::string asked =
      row.requested != row.ranks ? absl::StrCat(" (asked ", row.requested, ")") : "";
  std::printf("| %lld%s | %lld%s | %s | %s | %s | %s | %s | %s | %s | %s | %lld | %s "
              "| %s | %s | %s | %s | %s |\n",
              static_cast<long long>(row.ranks), asked.c_str(), static_cast<long long>(row.steps),
              row.aborted ? " (aborted)" : "", Fixed(steps_per_s, 1).c_str(),
              Fixed(Percentile(row.latency_ms, 0.50), 2).c_str(),
              Fixed(Percentile(row.latency_ms, 0.99), 2).c_str(),
              Fixed(row.server_cpu_ms_per_step, 2).c_str(), Fixed(row.core_solve_ms, 3).c_str(),
              Fixed(row.server_cpu_ms_per_step / row.core_solve_ms, 1).c_str(),
              Fixed(row.client_cpu_ms_per_step, 2).c_str(), Fixed(Median(row.plan_ms), 3).c_str(),
              static_cast<long long>(row.failed_calls + bare.failed_calls),
              Fixed(row.wire_kib_per_step, 0).c_str(),
              Fixed(Percentile(bare.latency_ms, 0.50), 2).c_str(),
              Fixed(MicrosPerCall(row), 1).c_str(), Fixed(MicrosPerCall(bare), 1).c_str(),
              Fixed(MicrosPerCall(row) / MicrosPerCall(bare), 2).c_str(),
              Fixed(bare.wire_kib_per_step, 0).c_str());
  std::fflush(stdout);
}

// Reports a step with failed calls or wrong answers on stderr.
void ReportStep(int64_t ranks, uint64_t step, const StepResult& result) {
  std::string codes;
  for (const auto& [code, count] : result.codes) {
    absl::StrAppend(&codes, codes.empty() ? "" : ", ", CodeName(code), " x", count,
                    " (first: ", result.first_msg.at(code), ")");
  }
  std::fprintf(stderr,
               "R=%lld step %llu: %lld failed calls%s%s; %lld wrong answers%s%s; "
               "step took %.1f ms\n",
               static_cast<long long>(ranks), static_cast<unsigned long long>(step),
               static_cast<long long>(result.failed), codes.empty() ? "" : ": ", codes.c_str(),
               static_cast<long long>(result.wrong_answer), result.first_wrong.empty() ? "" : ": ",
               result.first_wrong.c_str(), result.latency_ms);
  std::fflush(stderr);
}

enum class Outcome { kOk, kFailed, kStuck };

// Measures one group size. kStuck: calls are still in flight (their buffers
// cannot be freed), the run must end at once.
Outcome MeasureRanks(LoadClient& client, ServerProcess& server, const Problem& problem,
                     int64_t steps, int64_t warmup, bool measure_core_solve, Row* row) {
  row->ranks = problem.ranks;
  const std::string job_id = absl::StrCat("service-load-bench-r", problem.ranks);
  const uint64_t total = static_cast<uint64_t>(warmup + steps);
  std::optional<double> server_cpu_start;
  double client_cpu_start = 0;
  Outcome outcome = Outcome::kOk;

  for (uint64_t step = 0; step < total; ++step) {
    const bool measured = step >= static_cast<uint64_t>(warmup);
    auto calls = std::make_unique<StepCalls>(static_cast<size_t>(problem.ranks));
    BuildRequests(problem, job_id, step, *calls);
    if (measured && step == static_cast<uint64_t>(warmup)) {
      server_cpu_start = server.CpuSeconds();
      client_cpu_start = SelfCpuSeconds();
    }
    StepResult result = client.Run(*calls, step);
    if (!result.all_done) {
      std::fprintf(stderr, "R=%lld step %llu: calls still in flight after cancelling\n",
                   static_cast<long long>(problem.ranks), static_cast<unsigned long long>(step));
      (void)calls.release();  // gRPC may still write into them
      row->aborted = true;
      return Outcome::kStuck;
    }
    if (result.failed > 0 || result.wrong_answer > 0) {
      ReportStep(problem.ranks, step, result);
      row->failed_calls += result.failed + result.wrong_answer;
      const std::string ended = server.ExitIfEnded();
      if (!ended.empty()) {
        std::fprintf(stderr, "R=%lld step %llu: server child %s\n",
                     static_cast<long long>(problem.ranks), static_cast<unsigned long long>(step),
                     ended.c_str());
      }
      row->aborted = true;
      outcome = Outcome::kFailed;
      break;
    }
    if (measured && step == static_cast<uint64_t>(warmup)) {
      size_t bytes = 0;
      for (size_t r = 0; r < calls->requests.size(); ++r) {
        bytes += calls->requests[r].ByteSizeLong() + calls->responses[r].ByteSizeLong();
      }
      row->wire_kib_per_step = static_cast<double>(bytes) / 1024.0;
    }
    if (measured) {
      row->latency_ms.push_back(result.latency_ms);
      if (result.plan_micros >= 0) row->plan_ms.push_back(1e-3 * result.plan_micros);
      ++row->steps;
    }
  }

  if (row->steps > 0) {
    const std::optional<double> server_cpu_end = server.CpuSeconds();
    const double client_cpu_end = SelfCpuSeconds();
    if (server_cpu_start && server_cpu_end) {
      row->server_cpu_ms_per_step =
          1000.0 * (*server_cpu_end - *server_cpu_start) / static_cast<double>(row->steps);
    }
    row->client_cpu_ms_per_step =
        1000.0 * (client_cpu_end - client_cpu_start) / static_cast<double>(row->steps);

    if (!measure_core_solve) return outcome;
    // The planner core on the same batches.
    const absl::StatusOr<double> solve_ms = CoreSolveMs(problem, warmup, row->steps);
    if (solve_ms.ok()) {
      row->core_solve_ms = *solve_ms;
    } else {
      std::fprintf(stderr, "R=%lld: BalanceGreedy: %s\n", static_cast<long long>(problem.ranks),
                   solve_ms.status().ToString().c_str());
    }
  }
  return outcome;
}

// Group mode (PlannerClient's default): one PlanGroup request with every
// rank's lengths, its answer serialized (rank 0's broadcast), parsed and
// rebuilt into a plan (what every other rank does, in parallel) and one
// rank's slice taken. The gather before it is not included.
struct GroupRow {
  int64_t ranks = 0;
  int64_t steps = 0;
  std::vector<double> step_ms;
  std::vector<double> rpc_ms, serialize_ms, rebuild_ms;
  double core_solve_ms = NAN;
  double server_cpu_ms_per_step = NAN;
  double request_kib = NAN, answer_kib = NAN;
  int64_t failed = 0;
};

bool MeasureGroup(int port, ServerProcess& server, const Problem& problem, int64_t steps,
                  int64_t warmup, GroupRow* row) {
  row->ranks = problem.ranks;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto stub = v1::Planner::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  const std::string job_id = absl::StrCat("service-load-bench-group-r", problem.ranks);
  std::optional<double> cpu_start;
  for (int64_t step = 0; step < warmup + steps; ++step) {
    const bool measured = step >= warmup;
    const RankLengths lengths = problem.stream.Batch(step);
    v1::PlanGroupRequest request;
    *request.mutable_spec() = StepSpecOf(problem, job_id, static_cast<uint64_t>(step));
    for (const std::vector<int64_t>& rank : lengths) {
      request.add_ranks()->mutable_sequence_lengths()->Add(rank.begin(), rank.end());
    }
    if (measured && step == warmup) cpu_start = server.CpuSeconds();
    const Clock::time_point start = Clock::now();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCallDeadline));
    v1::PlanGroupResponse response;
    const grpc::Status status = stub->PlanGroup(&context, request, &response);
    const Clock::time_point answered = Clock::now();
    if (!status.ok()) {
      std::fprintf(stderr, "R=%lld group step %lld: %s\n", static_cast<long long>(problem.ranks),
                   static_cast<long long>(step), status.error_message().c_str());
      ++row->failed;
      return false;
    }
    const std::string broadcast = response.SerializeAsString();
    v1::PlanGroupResponse received;
    const bool parsed = received.ParseFromString(broadcast);
    const Clock::time_point deserialized = Clock::now();
    absl::StatusOr<std::vector<Chunk>> chunks = ChunksFromProto(received.chunks());
    absl::StatusOr<Plan> plan =
        chunks.ok() ? PlanFromChunks(problem.world, problem.cost, lengths, *std::move(chunks))
                    : absl::StatusOr<Plan>(chunks.status());
    const RankPlan slice = plan.ok() ? plan->Slice(static_cast<int32_t>(problem.ranks - 1))
                                     : RankPlan();
    const Clock::time_point rebuilt = Clock::now();
    if (!parsed || !plan.ok()) {
      std::fprintf(stderr, "R=%lld group step %lld: the answer does not rebuild: %s\n",
                   static_cast<long long>(problem.ranks), static_cast<long long>(step),
                   plan.ok() ? "parse failed" : plan.status().ToString().c_str());
      ++row->failed;
      return false;
    }
    if (!measured) continue;
    if (step == warmup) {
      row->request_kib = static_cast<double>(request.ByteSizeLong()) / 1024.0;
      row->answer_kib = static_cast<double>(broadcast.size()) / 1024.0;
    }
    auto ms = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double, std::milli>(b - a).count();
    };
    row->step_ms.push_back(ms(start, rebuilt));
    row->rpc_ms.push_back(ms(start, answered));
    row->serialize_ms.push_back(ms(answered, deserialized));
    row->rebuild_ms.push_back(ms(deserialized, rebuilt));
    ++row->steps;
    (void)slice;
  }
  const std::optional<double> cpu_end = server.CpuSeconds();
  if (cpu_start && cpu_end && row->steps > 0) {
    row->server_cpu_ms_per_step = 1000.0 * (*cpu_end - *cpu_start) / row->steps;
  }
  const absl::StatusOr<double> solve_ms = CoreSolveMs(problem, warmup, row->steps);
  if (!solve_ms.ok()) return false;
  row->core_solve_ms = *solve_ms;
  return true;
}

void PrintGroupRow(const GroupRow& row, double per_rank_server_cpu_ms) {
  std::printf("| %lld | %lld | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
              static_cast<long long>(row.ranks), static_cast<long long>(row.steps),
              Fixed(Percentile(row.step_ms, 0.5), 2).c_str(),
              Fixed(Percentile(row.step_ms, 0.99), 2).c_str(),
              Fixed(row.core_solve_ms, 2).c_str(),
              Fixed(Percentile(row.step_ms, 0.5) / row.core_solve_ms, 2).c_str(),
              Fixed(Median(row.rpc_ms), 2).c_str(), Fixed(Median(row.serialize_ms), 2).c_str(),
              Fixed(Median(row.rebuild_ms), 2).c_str(),
              Fixed(row.server_cpu_ms_per_step, 2).c_str(),
              Fixed(per_rank_server_cpu_ms / row.server_cpu_ms_per_step, 1).c_str(),
              Fixed(row.request_kib, 0).c_str(), Fixed(row.answer_kib, 0).c_str(),
              row.failed > 0 ? "yes" : "no");
  std::fflush(stdout);
}

// The soak: one group stepping without pause for `minutes`; every `sample`
// the server's RSS, fds and CPU and the window's latency. Ends with the RSS
// at the end against its value at the first sample (after the warm-up).
Outcome Soak(LoadClient& client, ServerProcess& server, const Problem& problem,
             int64_t minutes, int64_t sample_seconds) {
  const std::string job_id = absl::StrCat("service-soak-r", problem.ranks);
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::minutes(minutes);
  Clock::time_point next_sample = start + std::chrono::seconds(sample_seconds);
  std::vector<double> window_ms;
  std::optional<double> cpu_before = server.CpuSeconds();
  int64_t warm_rss = -1, last_rss = -1, max_rss = -1;
  std::printf("\n| minute | steps | p50 (ms) | p99 (ms) | server CPU (%%) | RSS (MiB) | open fds |\n"
              "|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  for (uint64_t step = 0;; ++step) {
    auto calls = std::make_unique<StepCalls>(static_cast<size_t>(problem.ranks));
    BuildRequests(problem, job_id, step, *calls);
    StepResult result = client.Run(*calls, step);
    if (!result.all_done) {
      (void)calls.release();  // gRPC may still write into them
      return Outcome::kStuck;
    }
    if (result.failed > 0 || result.wrong_answer > 0) {
      ReportStep(problem.ranks, step, result);
      return Outcome::kFailed;
    }
    window_ms.push_back(result.latency_ms);
    const Clock::time_point now = Clock::now();
    if (now < next_sample && now < end) continue;
    const std::optional<double> cpu_now = server.CpuSeconds();
    const double seconds = std::chrono::duration<double>(now - start).count();
    last_rss = server.RssBytes();
    if (warm_rss < 0) warm_rss = last_rss;
    max_rss = std::max(max_rss, last_rss);
    std::printf("| %.1f | %llu | %.2f | %.2f | %.1f | %.1f | %d |\n", seconds / 60,
                static_cast<unsigned long long>(step + 1), Percentile(window_ms, 0.5),
                Percentile(window_ms, 0.99),
                cpu_before && cpu_now ? 100.0 * (*cpu_now - *cpu_before) / sample_seconds : -1.0,
                last_rss / 1048576.0, server.OpenFds());
    std::fflush(stdout);
    window_ms.clear();
    cpu_before = cpu_now;
    next_sample += std::chrono::seconds(sample_seconds);
    if (now >= end) break;
  }
  std::printf("\nRSS at the first sample %.1f MiB, at the end %.1f MiB (%+.1f%%), "
              "largest %.1f MiB\n",
              warm_rss / 1048576.0, last_rss / 1048576.0,
              100.0 * (static_cast<double>(last_rss) / static_cast<double>(warm_rss) - 1),
              max_rss / 1048576.0);
  return Outcome::kOk;
}

// Stray Plan requests, each opening a step of a 2-rank group that never
// completes: they hold pending steps (and jobs) until their deadline.
class Flood {
 public:
  Flood(int port, int64_t requests, int64_t job_ids, int64_t into_one_job)
      : calls_(requests + into_one_job) {
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Planner::NewStub(channel_);
    for (int64_t i = 0; i < static_cast<int64_t>(calls_.size()); ++i) {
      v1::PlanRequest& request = calls_[i].request;
      v1::StepSpec* spec = request.mutable_spec();
      const bool one_job = i >= requests;
      spec->set_job_id(one_job ? "flood-one" : absl::StrCat("flood-", i % job_ids));
      spec->set_step(one_job ? i : i / job_ids);
      spec->set_world_size(2);
      spec->set_topology("g1n2");
      spec->set_d_model(kDModel);
      spec->set_gamma(kGamma);
      request.set_rank(0);
      request.add_sequence_lengths(1000);
    }
  }

  // Sends every request; each waits at most `deadline`.
  void Send(absl::Duration deadline) {
    const auto until = absl::ToChronoTime(absl::Now() + deadline);
    for (Call& call : calls_) {
      call.context.set_deadline(until);
      stub_->async()->Plan(&call.context, &call.request, &call.response,
                           [this, &call](grpc::Status status) {
                             absl::MutexLock lock(&mu_);
                             ++codes_[static_cast<int>(status.error_code())];
                             ++done_;
                           });
    }
  }

  // Waits (bounded) for every answer; false if some never came.
  bool Wait(absl::Duration bound) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ == calls_.size(); };
    return mu_.AwaitWithTimeout(absl::Condition(&all), bound);
  }

  std::string Codes() {
    absl::MutexLock lock(&mu_);
    std::string out;
    for (const auto& [code, count] : codes_) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", CodeName(code), " ", count);
    }
    return out;
  }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::PlanRequest request;
    v1::PlanResponse response;
  };
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Planner::Stub> stub_;
  std::vector<Call> calls_;
  absl::Mutex mu_;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, int64_t> codes_ ABSL_GUARDED_BY(mu_);
};

// The overload: one good group steps before, during and after a flood of
// ten times the server's pending-step limit over ten times its job limit
// (and ten times the per-job limit into one job). Prints the good group's
// latency and failures, the flood's answers by code, and the server's RSS.
Outcome Overload(LoadClient& client, ServerProcess& server, const Problem& problem, int port) {
  const ServiceLimits limits;
  const std::string job_id = absl::StrCat("service-overload-r", problem.ranks);
  uint64_t step = 0;
  std::printf("\n| phase | good steps | good p50 (ms) | good p99 (ms) | good failed calls "
              "| server RSS (MiB) | open fds |\n|---|---:|---:|---:|---:|---:|---:|\n");
  auto phase = [&](const char* name, int steps) {
    std::vector<double> ms;
    int64_t failed = 0;
    std::map<int, int64_t> codes;
    for (int i = 0; i < steps; ++i, ++step) {
      auto calls = std::make_unique<StepCalls>(static_cast<size_t>(problem.ranks));
      BuildRequests(problem, job_id, step, *calls);
      StepResult result = client.Run(*calls, step);
      if (!result.all_done) {
        (void)calls.release();
        return false;
      }
      failed += result.failed;
      for (const auto& [code, count] : result.codes) codes[code] += count;
      ms.push_back(result.latency_ms);
    }
    std::string failures = absl::StrCat(failed);
    for (const auto& [code, count] : codes) absl::StrAppend(&failures, " ", CodeName(code));
    std::printf("| %s | %d | %.2f | %.2f | %s | %.1f | %d |\n", name, steps, Percentile(ms, 0.5),
                Percentile(ms, 0.99), failures.c_str(), server.RssBytes() / 1048576.0,
                server.OpenFds());
    std::fflush(stdout);
    return true;
  };
  if (!phase("before", 30)) return Outcome::kStuck;
  Flood flood(port, 10 * int64_t{limits.max_pending_steps}, 10 * int64_t{limits.max_jobs},
              10 * int64_t{limits.max_pending_steps_per_job});
  flood.Send(absl::Seconds(20));
  absl::SleepFor(absl::Seconds(2));  // every stray request has arrived
  if (!phase("during the flood", 30)) return Outcome::kStuck;
  const bool answered = flood.Wait(absl::Seconds(60));
  if (!phase("after it", 30)) return Outcome::kStuck;
  std::printf("\nflood: %lld requests over %lld job ids and %lld into one job; answers: %s%s\n",
              static_cast<long long>(10 * int64_t{limits.max_pending_steps}),
              static_cast<long long>(10 * int64_t{limits.max_jobs}),
              static_cast<long long>(10 * int64_t{limits.max_pending_steps_per_job}),
              flood.Codes().c_str(), answered ? "" : " (some never answered)");
  return answered ? Outcome::kOk : Outcome::kFailed;
}

int Main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    PrintUsage(argv[0]);
    return 2;
  }
  absl::StatusOr<std::vector<DataCode>> codes = ParseDataCodes(ScenarioCodes(kScenario));
  if (!codes.ok()) {
    std::fprintf(stderr, "%s: %s\n", kScenario, codes.status().ToString().c_str());
    return 2;
  }

  // Before any gRPC object exists in this process. The bare rendezvous is
  // only needed for the table.
  const bool table = !flags.overload && flags.soak_minutes == 0;
  ServerProcess server(ServerKind::kPlanner);
  if (!server.Start()) return 1;
  ServerProcess bare_server(ServerKind::kBareRendezvous);
  if (table && !bare_server.Start()) return 1;

  std::printf(
      "service_load_bench: nproc %d; server pid %d on 127.0.0.1:%d (in a child "
      "process); %d channels, callback API, retries off; %s stream seed %llu, "
      "d_model %d, gamma %.2f; %lld warm-up steps per R; server CPU at 1/%ld s "
      "resolution over all measured steps\n",
      AvailableCpus(), static_cast<int>(server.pid()), server.port(), kChannels, kScenario,
      static_cast<unsigned long long>(kStreamSeed), kDModel, kGamma,
      static_cast<long long>(flags.warmup), sysconf(_SC_CLK_TCK));
  std::fflush(stdout);

  int exit_code = 0;
  {
    LoadClient client(server.port());
    if (!client.Connect()) {
      std::fprintf(stderr, "server child: %s\n", server.Stop().c_str());
      return 1;
    }
    if (flags.overload) {
      absl::StatusOr<Problem> problem = MakeProblem(*codes, flags.ranks[0]);
      if (!problem.ok()) {
        std::fprintf(stderr, "%s\n", problem.status().ToString().c_str());
        return 1;
      }
      std::printf("overload: %lld ranks\n", static_cast<long long>(problem->ranks));
      const Outcome outcome = Overload(client, server, *problem, server.port());
      if (outcome == Outcome::kStuck) {
        std::fprintf(stderr, "server child: %s\n", server.Stop().c_str());
        std::fflush(stdout);
        std::_Exit(1);
      }
      if (outcome != Outcome::kOk) exit_code = 1;
    } else if (flags.soak_minutes > 0) {
      absl::StatusOr<Problem> problem = MakeProblem(*codes, flags.ranks[0]);
      if (!problem.ok()) {
        std::fprintf(stderr, "%s\n", problem.status().ToString().c_str());
        return 1;
      }
      std::printf("soak: %lld ranks, %lld minutes\n", static_cast<long long>(problem->ranks),
                  static_cast<long long>(flags.soak_minutes));
      const Outcome outcome =
          Soak(client, server, *problem, flags.soak_minutes, flags.sample_seconds);
      if (outcome == Outcome::kStuck) {
        std::fprintf(stderr, "server child: %s\n", server.Stop().c_str());
        std::fflush(stdout);
        std::_Exit(1);
      }
      if (outcome != Outcome::kOk) exit_code = 1;
    } else {
    LoadClient bare_client(bare_server.port());
    if (!bare_client.Connect()) {
      std::fprintf(stderr, "bare rendezvous child: %s\n", bare_server.Stop().c_str());
      return 1;
    }
    std::printf(
        "\nper-rank mode, and a bare gRPC rendezvous (pid %d: same Plan RPC, every call "
        "held until the step's last rank asks, answered with %d bytes of filler, no "
        "plan) measured right before it at each R:\n\n"
        "| ranks | steps | steps/s | p50 (ms) | p99 (ms) | server CPU/step (ms) "
        "| core solve p50 (ms) | server CPU / solve | client CPU/step (ms) "
        "| server plan_micros p50 (ms) | failed calls | wire KiB/step "
        "| bare p50 (ms) | server CPU per call (us) | bare server CPU per call (us) "
        "| per call / bare | bare wire KiB/step |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        static_cast<int>(bare_server.pid()), kBareReplyPaddingBytes);
    std::fflush(stdout);
    std::map<int64_t, double> per_rank_cpu;  // by ranks: server CPU per step
    std::vector<Problem> problems;
    for (const int64_t requested : flags.ranks) {
      const std::string ended = server.ExitIfEnded();
      if (!ended.empty()) {
        std::fprintf(stderr, "server child %s; stopping\n", ended.c_str());
        exit_code = 1;
        break;
      }
      absl::StatusOr<Problem> problem = MakeProblem(*codes, requested);
      if (!problem.ok()) {
        std::fprintf(stderr, "R=%lld: %s\n", static_cast<long long>(requested),
                     problem.status().ToString().c_str());
        exit_code = 1;
        continue;
      }
      const int64_t steps = flags.steps_given || problem->ranks < 4096
                                ? flags.steps
                                : std::min(flags.steps, kDefaultStepsAt4096);
      Row bare;
      bare.requested = requested;
      Outcome outcome = MeasureRanks(bare_client, bare_server, *problem, steps, flags.warmup,
                                     /*measure_core_solve=*/false, &bare);
      Row row;
      row.requested = requested;
      if (outcome == Outcome::kOk) {
        outcome = MeasureRanks(client, server, *problem, steps, flags.warmup,
                               /*measure_core_solve=*/true, &row);
      }
      PrintRow(row, bare);
      per_rank_cpu[problem->ranks] = row.server_cpu_ms_per_step;
      problems.push_back(*std::move(problem));
      if (outcome != Outcome::kOk) exit_code = 1;
      if (outcome == Outcome::kStuck) {
        // Calls in flight still point into this process's buffers: end now,
        // without running gRPC's destructors, after stopping the server.
        std::fprintf(stderr, "server child: %s\n", server.Stop().c_str());
        std::fprintf(stderr, "bare rendezvous child: %s\n", bare_server.Stop().c_str());
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
    std::printf(
        "\ngroup mode (one PlanGroup per step; the ranks' all-gather before it not "
        "included):\n\n"
        "| ranks | steps | step p50 (ms) | step p99 (ms) | core solve p50 (ms) "
        "| step / solve | RPC p50 (ms) | serialize + parse p50 (ms) "
        "| rebuild + slice p50 (ms) | server CPU/step (ms) | per-rank server CPU / group's "
        "| request KiB | answer KiB | failed |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (const Problem& problem : problems) {
      const int64_t steps = flags.steps_given || problem.ranks < 4096
                                ? flags.steps
                                : std::min(flags.steps, kDefaultStepsAt4096);
      GroupRow row;
      if (!MeasureGroup(server.port(), server, problem, steps, flags.warmup, &row)) {
        exit_code = 1;
      }
      PrintGroupRow(row, per_rank_cpu[problem.ranks]);
    }
    }
  }  // every channel is closed before the server is asked to stop

  const std::string how = server.Stop();
  if (how != "exited with status 0") {
    std::fprintf(stderr, "server child %s\n", how.c_str());
    exit_code = 1;
  }
  if (table) {
    const std::string bare_how = bare_server.Stop();
    if (bare_how != "exited with status 0") {
      std::fprintf(stderr, "bare rendezvous child %s\n", bare_how.c_str());
      exit_code = 1;
    }
  }
  return exit_code;
}

}  // namespace
}  // namespace knapformer

int main(int argc, char** argv) {
  // As `knapformer serve` does: Debian's abseil checks every lock for
  // deadlock cycles (gRPC's too), ~5% of the server's CPU; and malloc keeps
  // freed memory for the next plan (common/malloc_policy.h). The server child
  // is forked from here and inherits both; so does the core solve measured
  // in this process.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status retained = knapformer::RetainFreedMemory(); !retained.ok()) {
    std::fprintf(stderr, "%s\n", std::string(retained.message()).c_str());
    return 1;
  }
  return knapformer::Main(argc, argv);
}
