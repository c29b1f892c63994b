// knapformer.PlannerServer: the planner service hosted in a Python process
// (e.g. a trainer's rank 0), configured with `knapformer serve`'s flags.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "python/bindings.h"
#include "python/status_exception.h"
#include "common/embedded_service.h"

namespace knapformer {
namespace python {
namespace {

namespace py = pybind11;

// The embedded planner service with the GIL let go while it starts and stops.
class PyPlannerServer {
 public:
  explicit PyPlannerServer(const std::vector<std::string>& flags) {
    py::gil_scoped_release no_gil;
    server_ = ValueOrThrow(StartEmbeddedPlanner(flags));
  }

  std::string address() const { return Server().address(); }
  int port() const { return Server().port(); }
  int metrics_port() const { return Server().metrics_port(); }
  bool running() const { return server_ != nullptr; }

  // Taken out of the object while the GIL is held, so that another thread
  // sees a stopped server, not one being destroyed.
  void Shutdown(std::optional<double> grace_seconds) {
    std::unique_ptr<EmbeddedService> server = std::move(server_);
    if (server == nullptr) return;
    py::gil_scoped_release no_gil;
    if (grace_seconds.has_value()) {
      server->Shutdown(absl::Seconds(*grace_seconds));
    } else {
      server->Shutdown();
    }
  }

  // Garbage collection or interpreter exit: stop without holding the GIL
  // for the grace period (gRPC's threads never need it), unless the
  // interpreter is finalizing and the GIL must not be let go.
  ~PyPlannerServer() {
    std::unique_ptr<EmbeddedService> server = std::move(server_);
    if (server == nullptr) return;
    if (HoldsReleasableGil()) {
      py::gil_scoped_release no_gil;
      server.reset();
    }
  }

 private:
  const EmbeddedService& Server() const {
    if (server_ == nullptr) throw std::runtime_error("FAILED_PRECONDITION: the server was shut down");
    return *server_;
  }

  std::unique_ptr<EmbeddedService> server_;
};

}  // namespace

void BindServer(py::module_& m) {
  py::class_<PyPlannerServer>(m, "_PlannerServer")
      .def(py::init<const std::vector<std::string>&>(), py::arg("flags"))
      .def_property_readonly("address", &PyPlannerServer::address)
      .def_property_readonly("port", &PyPlannerServer::port)
      .def_property_readonly("metrics_port", &PyPlannerServer::metrics_port)
      .def_property_readonly("running", &PyPlannerServer::running)
      .def("shutdown", &PyPlannerServer::Shutdown, py::arg("grace_seconds") = py::none());
}

}  // namespace python
}  // namespace knapformer
