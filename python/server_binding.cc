// knapformer.PlannerServer: the planner service hosted in a Python process
// (e.g. a trainer's rank 0), configured with `knapformer serve`'s flags.
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "python/bindings.h"
#include "python/status_exception.h"
#include "server/planner_server.h"
#include "tools/serve.h"

namespace knapformer {
namespace python {
namespace {

namespace py = pybind11;

// Flags of `knapformer serve` that act on the whole process or only make
// sense for a process of its own.
constexpr const char* kProcessFlags[] = {"--port-file", "--retain-freed-memory"};

class EmbeddedServer {
 public:
  explicit EmbeddedServer(const std::vector<std::string>& flags) {
    for (const std::string& flag : flags) {
      for (const char* process_flag : kProcessFlags) {
        if (absl::StartsWith(flag, process_flag)) {
          ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
              process_flag + 2, ": a setting of the `knapformer serve` process; an "
              "embedded server does not take it")));
        }
      }
    }
    ServeConfig config = ValueOrThrow(ParseServeArgs(flags));
    SetLogLevel(config.log_level);
    shutdown_grace_ = config.shutdown_grace;
    py::gil_scoped_release no_gil;
    server_ = ValueOrThrow(PlannerServer::Start(config.server));
  }

  std::string address() const { return Server().address(); }
  int port() const { return Server().port(); }
  int metrics_port() const { return Server().metrics_port(); }
  bool running() const { return server_ != nullptr; }

  // Taken out of the object while the GIL is held, so that another thread
  // sees a stopped server, not one being destroyed.
  void Shutdown(std::optional<double> grace_seconds) {
    std::unique_ptr<PlannerServer> server = std::move(server_);
    if (server == nullptr) return;
    const absl::Duration grace =
        grace_seconds.has_value() ? absl::Seconds(*grace_seconds) : shutdown_grace_;
    py::gil_scoped_release no_gil;
    server->Shutdown(grace);
  }

  // Garbage collection or interpreter exit: stop without holding the GIL
  // for the grace period (gRPC's threads never need it), unless the
  // interpreter is finalizing and the GIL must not be let go.
  ~EmbeddedServer() {
    std::unique_ptr<PlannerServer> server = std::move(server_);
    if (server == nullptr) return;
    if (Py_IsInitialized() && !_Py_IsFinalizing() && PyGILState_Check()) {
      py::gil_scoped_release no_gil;
      server->Shutdown(shutdown_grace_);
      server.reset();
    }
  }

 private:
  const PlannerServer& Server() const {
    if (server_ == nullptr) throw std::runtime_error("FAILED_PRECONDITION: the server was shut down");
    return *server_;
  }

  std::unique_ptr<PlannerServer> server_;
  absl::Duration shutdown_grace_ = absl::Seconds(5);
};

}  // namespace

void BindServer(py::module_& m) {
  py::class_<EmbeddedServer>(m, "_PlannerServer")
      .def(py::init<const std::vector<std::string>&>(), py::arg("flags"))
      .def_property_readonly("address", &EmbeddedServer::address)
      .def_property_readonly("port", &EmbeddedServer::port)
      .def_property_readonly("metrics_port", &EmbeddedServer::metrics_port)
      .def_property_readonly("running", &EmbeddedServer::running)
      .def("shutdown", &EmbeddedServer::Shutdown, py::arg("grace_seconds") = py::none());
}

}  // namespace python
}  // namespace knapformer
