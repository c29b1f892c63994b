// knapformer._C.NcclTransport: the raw NCCL transport (transport/
// nccl_transport.h) from Python, for `python -m knapformer.gpu_check` and
// trainers that want the exchange without a ProcessGroup. Compiled only
// where the build found CUDA and NCCL (Bazel --config=cuda, or pip against
// a CUDA torch): KNAPFORMER_HAVE_NCCL.
#include "python/bindings.h"

#ifdef KNAPFORMER_HAVE_NCCL

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "absl/strings/str_cat.h"
#include "python/status_exception.h"
#include "transport/nccl_transport.h"

namespace knapformer {
namespace python {
namespace {

namespace py = pybind11;

void CheckNccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) {
    throw std::runtime_error(
        absl::StrCat("INTERNAL: ", what, ": ", ncclGetErrorString(result)));
  }
}

py::bytes UniqueId() {
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return py::bytes(id.internal, sizeof(id.internal));
}

// The transport on its own stream, ordered after the stream the caller
// names on each call (PyTorch's current stream, read in Python: this
// module needs no c10_cuda).
class PyNcclTransport {
 public:
  PyNcclTransport(const py::bytes& unique_id, int rank, int size, int device,
                  double timeout_seconds, bool check_counts) {
    const std::string bytes = unique_id;
    ncclUniqueId id;
    if (bytes.size() != sizeof(id.internal)) {
      throw py::value_error(absl::StrCat("unique_id: needs the ", sizeof(id.internal),
                                         " bytes of nccl_unique_id(), got ", bytes.size()));
    }
    if (!(timeout_seconds > 0)) {
      throw py::value_error(
          absl::StrCat("timeout_seconds: needs a time > 0, got ", timeout_seconds));
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
    NcclTransportOptions options;
    options.check_counts = check_counts;
    options.timeout = absl::Seconds(timeout_seconds);
    auto caller = caller_stream_;
    options.caller_stream = [caller] { return *caller; };
    py::gil_scoped_release no_gil;
    if (cudaSetDevice(device) != cudaSuccess) {
      throw py::value_error(absl::StrCat("device: no CUDA device ", device));
    }
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      throw std::runtime_error("INTERNAL: cudaStreamCreateWithFlags failed");
    }
    stream_ = stream;
    absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
        NcclTransport::CreateFromUniqueId(id, rank, size, device, stream, options);
    if (!transport.ok()) {
      cudaStreamDestroy(stream_);
      stream_ = nullptr;
    }
    transport_ = ValueOrThrow(std::move(transport));
  }

  // Destroying a communicator can wait for the device: without the GIL,
  // unless the interpreter is finalizing.
  ~PyNcclTransport() {
    if (HoldsReleasableGil()) {
      py::gil_scoped_release no_gil;
      Release();
    } else {
      Release();
    }
  }

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  int device() const { return transport_->device(); }
  bool aborted() const { return transport_->aborted(); }

  void AllToAllRows(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                    at::Tensor& recv, const std::vector<int64_t>& recv_rows,
                    std::uintptr_t stream) {
    CheckTensor(send, "send", send_rows);
    CheckTensor(recv, "recv", recv_rows);
    const int64_t row_bytes = RowBytes(send);
    if (RowBytes(recv) != row_bytes) {
      throw py::value_error(absl::StrCat("recv: rows of ", RowBytes(recv),
                                         " bytes, but send's are ", row_bytes));
    }
    *caller_stream_ = reinterpret_cast<cudaStream_t>(stream);
    py::gil_scoped_release no_gil;
    ThrowIfError(transport_->AllToAll(send.numel() > 0 ? send.data_ptr() : nullptr, send_rows,
                                      recv.numel() > 0 ? recv.data_ptr() : nullptr, recv_rows,
                                      row_bytes));
  }

  std::vector<py::bytes> AllGatherBytes(const py::bytes& data) {
    const std::string mine = data;
    std::vector<std::string> gathered;
    {
      py::gil_scoped_release no_gil;
      gathered = ValueOrThrow(transport_->AllGatherBytes(mine));
    }
    return std::vector<py::bytes>(gathered.begin(), gathered.end());
  }

 private:
  void CheckTensor(const at::Tensor& tensor, const char* name,
                   const std::vector<int64_t>& rows) const {
    if (tensor.dim() == 0) {
      throw py::value_error(absl::StrCat(name, ": needs a tensor of rows (dim >= 1)"));
    }
    int64_t total = 0;
    for (int64_t n : rows) total += n;
    if (total != tensor.size(0)) {
      throw py::value_error(absl::StrCat(name, ": ", tensor.size(0),
                                         " rows, but its row counts add up to ", total));
    }
    if (tensor.numel() == 0) return;
    if (!tensor.is_cuda() || tensor.get_device() != transport_->device()) {
      throw py::value_error(absl::StrCat(name, ": needs a tensor on cuda:",
                                         transport_->device(), ", got one on ",
                                         tensor.device().str()));
    }
    if (!tensor.is_contiguous()) {
      throw py::value_error(absl::StrCat(name, ": needs a contiguous tensor"));
    }
  }

  // From the shape, not nbytes / rows: a rank with no rows to move still
  // states the row size its peers' count check compares.
  static int64_t RowBytes(const at::Tensor& tensor) {
    int64_t bytes = static_cast<int64_t>(tensor.element_size());
    for (int64_t d = 1; d < tensor.dim(); ++d) bytes *= tensor.size(d);
    return bytes;
  }

  void Release() {
    transport_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  std::shared_ptr<cudaStream_t> caller_stream_ = std::make_shared<cudaStream_t>(nullptr);
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<NcclTransport> transport_;
};

}  // namespace

void BindNccl(py::module_& m) {
  m.attr("nccl_transport_available") = true;
  m.def("nccl_unique_id", &UniqueId,
        "A new NCCL unique id (128 bytes) for NcclTransport; made by one rank, shared by all");
  py::class_<PyNcclTransport>(m, "NcclTransport")
      .def(py::init<const py::bytes&, int, int, int, double, bool>(), py::arg("unique_id"),
           py::arg("rank"), py::arg("size"), py::arg("device"),
           py::arg("timeout_seconds") = 600.0, py::arg("check_counts") = true)
      .def_property_readonly("rank", &PyNcclTransport::rank)
      .def_property_readonly("size", &PyNcclTransport::size)
      .def_property_readonly("device", &PyNcclTransport::device)
      .def_property_readonly("aborted", &PyNcclTransport::aborted)
      .def("all_to_all_rows", &PyNcclTransport::AllToAllRows, py::arg("send"),
           py::arg("send_rows"), py::arg("recv"), py::arg("recv_rows"), py::arg("stream"))
      .def("all_gather_bytes", &PyNcclTransport::AllGatherBytes, py::arg("data"));
}

}  // namespace python
}  // namespace knapformer

#else  // !KNAPFORMER_HAVE_NCCL

namespace knapformer {
namespace python {

void BindNccl(pybind11::module_& m) { m.attr("nccl_transport_available") = false; }

}  // namespace python
}  // namespace knapformer

#endif  // KNAPFORMER_HAVE_NCCL
