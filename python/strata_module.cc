// strata._strata: the Python binding of strata::Client (pybind11), on which
// the pure-Python package (strata.torch, strata.launch) is built. Float
// buffers are NumPy arrays (CPU torch tensors pass through .numpy() without
// a copy) or, for a worker whose device is a GPU, objects with
// __cuda_array_interface__ (torch CUDA tensors, CuPy arrays) whose memory
// the client reads and writes in place. Errors
// are strata.StrataError whose message starts with the status code name
// ("INVALID_ARGUMENT: ..."). Every call that waits (for peers, servers or
// collectives) releases the GIL.
//
// Thread-safety: that of strata::Client: one thread drives a client.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "strata/client.h"

namespace py = pybind11;

namespace strata {
namespace {

// Thrown for a non-OK absl::Status; registered as strata.StrataError.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(const absl::Status& status) : std::runtime_error(status.ToString()) {}
};

// (name, shape) pairs from Python, in registration order.
using TensorList = std::vector<std::pair<std::string, std::vector<int64_t>>>;

std::vector<TensorSpec> ToSpecs(const TensorList& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, shape] : tensors) specs.push_back(TensorSpec{name, shape});
  return specs;
}

void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

using FloatArray = py::array_t<float, py::array::c_style>;
using DoubleArray = py::array_t<double, py::array::c_style>;

DType ParseDType(const std::string& name) {
  if (name == "fp16") return DType::kFp16;
  if (name == "bf16") return DType::kBf16;
  if (name == "fp32") return DType::kFp32;
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("dtype '", name, "' is not one of fp16, bf16, fp32")));
}

StatePrecision ParseStatePrecision(const std::string& name) {
  if (name == "fp32") return StatePrecision::kFp32;
  if (name == "int8") return StatePrecision::kInt8;
  throw StatusError(absl::InvalidArgumentError(
      absl::StrCat("state_precision '", name, "' is not one of fp32, int8")));
}

// A flat float32 buffer from Python.
struct FloatBuffer {
  float* data;
  uint64_t size;
  size_t ndim;
};

FloatBuffer FromCudaArrayInterface(const py::dict& interface, const char* what, bool writable) {
  auto refuse = [what](absl::string_view why) {
    return StatusError(
        absl::InvalidArgumentError(absl::StrCat(what, ": __cuda_array_interface__ ", why)));
  };
  if (!interface.contains("typestr") || interface["typestr"].cast<std::string>() != "<f4") {
    throw refuse("is not of float32 ('<f4')");
  }
  const auto data = interface["data"].cast<std::pair<uintptr_t, bool>>();
  if (writable && data.second) throw refuse("is read-only");
  uint64_t size = 1;
  std::vector<int64_t> shape;
  for (py::handle d : interface["shape"].cast<py::tuple>()) {
    const int64_t n = d.cast<int64_t>();
    if (n < 0 || (n > 0 && size > std::numeric_limits<uint64_t>::max() / n)) {
      throw refuse("has a bad shape");
    }
    shape.push_back(n);
    size *= static_cast<uint64_t>(n);
  }
  if (interface.contains("strides") && !interface["strides"].is_none()) {
    int64_t expected = sizeof(float);
    const auto strides = interface["strides"].cast<std::vector<int64_t>>();
    for (size_t i = shape.size(); i-- > 0;) {
      if (i >= strides.size() || (shape[i] > 1 && strides[i] != expected)) {
        throw refuse("is not C-contiguous");
      }
      expected *= shape[i];
    }
  }
  if (size > 0 && data.first == 0) throw refuse("has a null pointer");
  return FloatBuffer{reinterpret_cast<float*>(data.first), size, shape.size()};
}

// `obj` as a flat float32 buffer: a C-contiguous float32 NumPy array, or an
// object with __cuda_array_interface__ (GPU memory); else INVALID_ARGUMENT
// naming `what`.
FloatBuffer ToFloatBuffer(const py::object& obj, const char* what, bool writable) {
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    return FromCudaArrayInterface(obj.attr("__cuda_array_interface__").cast<py::dict>(), what,
                                  writable);
  }
  if (!py::isinstance<py::array>(obj) || !py::isinstance<FloatArray>(obj) ||
      !(py::cast<py::array>(obj).flags() & py::array::c_style)) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(what,
                     " must be a C-contiguous float32 NumPy array or a GPU array "
                     "(__cuda_array_interface__)")));
  }
  py::buffer_info info = py::cast<py::array>(obj).request(writable);
  return FloatBuffer{static_cast<float*>(info.ptr), static_cast<uint64_t>(info.size),
                     static_cast<size_t>(info.ndim)};
}

// A buffer of exactly `n` elements, or INVALID_ARGUMENT.
void CheckSize(const FloatBuffer& buffer, uint64_t n, const char* what) {
  if (buffer.size != n) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(what, " has ", buffer.size, " elements; the model has ", n)));
  }
}

std::unique_ptr<Client> Connect(const std::string& coordinator, const std::string& job,
                                const std::string& worker_id, const TensorList& tensors,
                                uint32_t world_size, uint64_t chunk_params, float lr,
                                std::pair<float, float> betas, float eps, float weight_decay,
                                bool adamw, const std::string& dtype, const std::string& params,
                                py::object loss_scale, double max_grad_norm,
                                py::object initial_params, const std::string& restore_from,
                                double timeout_s, const std::string& tls_ca,
                                const std::string& tls_cert, const std::string& tls_key,
                                const std::string& token_file, const std::string& collective_host,
                                uint64_t bucket_params, const std::vector<uint32_t>& tensor_groups,
                                const std::vector<float>& group_weight_decays, uint32_t replicas,
                                const std::string& device, const std::string& state_precision) {
  ClientOptions options;
  options.coordinator_address = coordinator;
  options.tls_ca_file = tls_ca;
  options.tls_cert_file = tls_cert;
  options.tls_key_file = tls_key;
  options.token_file = token_file;
  options.collective_hostname = collective_host;
  options.job_id = job;
  options.worker_id = worker_id;
  options.job.tensors = ToSpecs(tensors);
  if (!tensor_groups.empty()) {
    if (tensor_groups.size() != options.job.tensors.size()) {
      throw StatusError(absl::InvalidArgumentError(
          absl::StrCat("tensor_groups has ", tensor_groups.size(), " entries for ",
                       options.job.tensors.size(), " tensors")));
    }
    for (size_t i = 0; i < tensor_groups.size(); ++i)
      options.job.tensors[i].group = tensor_groups[i];
  }
  for (float decay : group_weight_decays) options.job.groups.push_back(ParamGroup{decay});
  options.job.world_size = world_size;
  options.job.chunk_num_params = chunk_params;
  options.bucket_num_params = bucket_params;
  options.job.replicas = replicas;
  options.job.adam = AdamConfig{lr, betas.first, betas.second, eps, weight_decay, adamw};
  options.job.dtype = ParseDType(dtype);
  options.job.state_precision = ParseStatePrecision(state_precision);
  if (params == "on_demand") {
    options.params = ParamResidency::kOnDemand;
  } else if (params != "replicated") {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat("params '", params, "' is not \"replicated\" or \"on_demand\"")));
  }
  if (py::isinstance<py::str>(loss_scale)) {
    if (loss_scale.cast<std::string>() != "dynamic") {
      throw StatusError(absl::InvalidArgumentError("loss_scale must be \"dynamic\" or a number"));
    }
  } else {
    options.loss_scale.dynamic = false;
    options.loss_scale.initial_scale = loss_scale.cast<float>();
  }
  options.max_grad_norm = max_grad_norm;
  if (!initial_params.is_none()) {
    FloatArray params = initial_params.cast<FloatArray>();
    options.initial.params.assign(params.data(), params.data() + params.size());
  }
  options.initial.checkpoint = restore_from;
  // The buffers on a GPU are reduced by NCCL there; host buffers by Gloo.
  options.device = device;
  options.collective = device == "cpu" ? "gloo" : "nccl";
  options.rendezvous_timeout = absl::Seconds(timeout_s);
  options.collective_timeout = absl::Seconds(timeout_s);
  py::gil_scoped_release release;
  return ValueOrThrow(Client::Connect(std::move(options)));
}

py::dict StepResultToDict(const StepResult& r) {
  py::dict d;
  d["step"] = r.step;
  d["skipped"] = r.skipped;
  d["grad_norm"] = r.grad_norm;
  d["clip_factor"] = r.clip_factor;
  d["loss_scale"] = r.loss_scale;
  d["collective_seconds"] = r.collective_seconds;
  d["push_pull_seconds"] = r.push_pull_seconds;
  d["generation"] = r.generation;
  d["world_size"] = r.world_size;
  return d;
}

py::dict ReformStatsToDict(const ReformStats& r) {
  py::dict d;
  d["count"] = r.count;
  d["generation"] = r.generation;
  d["seconds"] = r.seconds;
  d["param_pull_seconds"] = r.param_pull_seconds;
  d["steps_lost"] = r.steps_lost;
  return d;
}

// The Python classes and functions of _strata, bound in parts.
void BindPendingGather(py::module_& m) {
  py::class_<PendingGather>(m, "PendingGather")
      .def(
          "wait",
          [](PendingGather& g) {
            absl::Status s;
            {
              py::gil_scoped_release release;
              s = g.Wait();
            }
            ThrowIfError(s);
          },
          "Blocks until the gather is done; raises StrataError if it failed");
}

// Client's read-only properties.
void BindClientProperties(py::class_<Client>& cls) {
  cls.def_property_readonly("rank", &Client::rank)
      .def_property_readonly("world_size", &Client::world_size)
      .def_property_readonly("generation", &Client::generation)
      .def_property_readonly("num_servers", &Client::num_servers)
      .def_property_readonly("applied_step", &Client::step)
      .def_property_readonly("loss_scale", &Client::loss_scale)
      .def_property_readonly("loss_scale_good_steps", &Client::loss_scale_good_steps)
      .def_property_readonly("num_params", [](const Client& c) { return c.layout().num_params(); })
      .def_property_readonly("resident_param_bytes", &Client::resident_param_bytes)
      .def_property_readonly("peak_grad_bytes", &Client::peak_grad_bytes)
      .def_property_readonly(
          "last_reform", [](const Client& c) { return ReformStatsToDict(c.last_reform()); },
          "How the group last formed (at connect or a membership change): count, generation, "
          "seconds, param_pull_seconds, steps_lost (steps undone by a resume from an older "
          "checkpoint after a shard server was lost)");
}

// Client's parameters in and gradients out.
void BindClientTransfers(py::class_<Client>& cls) {
  cls.def(
         "copy_params",
         [](const Client& c, py::object out) {
           FloatBuffer buffer = ToFloatBuffer(out, "copy_params' array", /*writable=*/true);
           CheckSize(buffer, c.layout().num_params(), "copy_params' array");
           py::gil_scoped_release release;
           ThrowIfError(c.CopyParams(absl::MakeSpan(buffer.data, buffer.size)));
         },
         py::arg("out"), "Writes the current parameters (the job's dtype, as float32) into `out`")
      .def(
          "start_gather",
          [](Client& c, uint64_t begin, uint64_t end, py::object out) {
            FloatBuffer buffer = ToFloatBuffer(out, "start_gather's array", /*writable=*/true);
            // Replicated, the gather waits here for the all-gather to reach the range.
            py::gil_scoped_release release;
            return c.StartGather(FlatRange{begin, end}, absl::MakeSpan(buffer.data, buffer.size));
          },
          py::arg("begin"), py::arg("end"), py::arg("out"), py::keep_alive<0, 1>(),
          py::keep_alive<0, 4>(),
          "Starts gathering parameters [begin, end) as float32 into `out`; returns a "
          "PendingGather (on demand: a collective every worker starts in the same order)")
      .def(
          "accumulate_gradients",
          [](Client& c, py::object grads, bool scaled) {
            FloatBuffer buffer =
                ToFloatBuffer(grads, "accumulate_gradients' array", /*writable=*/false);
            CheckSize(buffer, c.layout().num_params(), "accumulate_gradients' array");
            auto span = absl::MakeConstSpan(buffer.data, buffer.size);
            py::gil_scoped_release release;
            ThrowIfError(scaled ? c.AccumulateScaledGradients(span) : c.AccumulateGradients(span));
          },
          py::arg("grads"), py::arg("scaled") = false,
          "Adds one micro-batch's float32 gradient (flat) to the accumulator; scaled: it is "
          "already multiplied by the loss scale")
      .def(
          "gradients_ready",
          [](Client& c, uint64_t begin, py::object grads, bool scaled) {
            FloatBuffer buffer =
                ToFloatBuffer(grads, "gradients_ready's array", /*writable=*/false);
            if (buffer.ndim != 1) {
              throw StatusError(absl::InvalidArgumentError("gradients_ready's array is not flat"));
            }
            const uint64_t n = buffer.size;
            if (begin > c.layout().num_params() || n > c.layout().num_params() - begin) {
              throw StatusError(absl::InvalidArgumentError(
                  absl::StrCat("gradients_ready of [", begin, ", +", n, "): the flat space has ",
                               c.layout().num_params(), " parameters")));
            }
            auto span = absl::MakeConstSpan(buffer.data, n);
            FlatRange range{begin, begin + n};
            py::gil_scoped_release release;
            ThrowIfError(scaled ? c.ScaledGradientsReady(range, span)
                                : c.GradientsReady(range, span));
          },
          py::arg("begin"), py::arg("grads"), py::arg("scaled") = false,
          "The streamed step: the last micro-batch's float32 gradient of the flat range from "
          "`begin` (Client::GradientsReady); scaled: already multiplied by the loss scale");
}

// Client's step, its settings, and leaving.
void BindClientStep(py::class_<Client>& cls) {
  cls.def(
         "step",
         [](Client& c) {
           absl::StatusOr<StepResult> result;
           {
             py::gil_scoped_release release;
             result = c.Step();
           }
           return StepResultToDict(ValueOrThrow(std::move(result)));
         },
         "One optimizer step over the accumulated micro-batches; returns its StepResult")
      .def(
          "set_learning_rate", [](Client& c, float lr) { ThrowIfError(c.SetLearningRate(lr)); },
          py::arg("lr"))
      .def(
          "set_group_learning_rates",
          [](Client& c, const std::vector<float>& lrs) {
            ThrowIfError(c.SetGroupLearningRates(lrs));
          },
          py::arg("lrs"), "The learning rate of each parameter group for the next steps")
      .def(
          "restore_loss_scale",
          [](Client& c, float scale, int good_steps) {
            ThrowIfError(c.RestoreLossScale(scale, good_steps));
          },
          py::arg("scale"), py::arg("good_steps"))
      .def(
          "all_reduce_sum",
          [](Client& c, DoubleArray values) {
            py::buffer_info info = values.request(/*writable=*/true);
            py::gil_scoped_release release;
            ThrowIfError(c.AllReduceSum(absl::MakeSpan(static_cast<double*>(info.ptr), info.size)));
          },
          py::arg("values").noconvert(), "Sums a float64 array over the workers, in place")
      .def(
          "read_master_state",
          [](const Client& c) {
            absl::StatusOr<MasterState> state;
            {
              py::gil_scoped_release release;
              state = c.ReadMasterState();
            }
            MasterState s = ValueOrThrow(std::move(state));
            auto array = [](const std::vector<float>& v) {
              return FloatArray(static_cast<py::ssize_t>(v.size()), v.data());
            };
            return py::make_tuple(s.step, array(s.params), array(s.exp_avg), array(s.exp_avg_sq));
          },
          "(step, params, exp_avg, exp_avg_sq): the FP32 master state from the servers")
      .def(
          "leave",
          [](Client& c) {
            py::gil_scoped_release release;
            ThrowIfError(c.Leave());
          },
          "Leaves the job at a step boundary; the others go on without this worker")
      .def("announce_leave", &Client::AnnounceLeave,
           "This worker leaves after its next step: the others are told in that step, so "
           "their next one is not cut short; call leave() right after it");
}

void BindFunctions(py::module_& m) {
  m.def(
      "flat_layout",
      [](const TensorList& tensors, uint64_t chunk_params) {
        FlatLayout layout = ValueOrThrow(FlatLayout::Create(ToSpecs(tensors), chunk_params));
        std::vector<uint64_t> offsets;
        for (size_t i = 0; i < layout.tensors().size(); ++i) {
          offsets.push_back(layout.tensor_range(i).begin);
        }
        return py::make_tuple(offsets, layout.num_params());
      },
      py::arg("tensors"), py::arg("chunk_params"),
      "(offsets, num_params): where each tensor lies in the job's flat space");
  m.def("connect", &Connect, py::arg("coordinator"), py::arg("job"), py::arg("worker_id"),
        py::arg("tensors"), py::arg("world_size"), py::arg("chunk_params"), py::arg("lr"),
        py::arg("betas"), py::arg("eps"), py::arg("weight_decay"), py::arg("adamw"),
        py::arg("dtype"), py::arg("params"), py::arg("loss_scale"), py::arg("max_grad_norm"),
        py::arg("initial_params"), py::arg("restore_from"), py::arg("timeout_s"),
        py::arg("tls_ca") = "", py::arg("tls_cert") = "", py::arg("tls_key") = "",
        py::arg("token_file") = "", py::arg("collective_host") = "127.0.0.1",
        py::arg("bucket_params") = uint64_t{1} << 20,
        py::arg("tensor_groups") = std::vector<uint32_t>(),
        py::arg("group_weight_decays") = std::vector<float>(), py::arg("replicas") = 1,
        py::arg("device") = "cpu", py::arg("state_precision") = "fp32",
        "Creates or joins a job and returns its Client (strata::Client::Connect); device: "
        "where the client's buffers are (\"cpu\", or \"cuda:N\" with NCCL among the workers); "
        "state_precision: how the shard servers store Adam's moments (\"fp32\" or \"int8\")");
}

}  // namespace
}  // namespace strata

PYBIND11_MODULE(_strata, m) {
  using namespace strata;
  m.doc() = "strata's client (strata::Client); use strata.torch for torch training loops";
  py::register_exception<StatusError>(m, "StrataError", PyExc_RuntimeError);
  BindPendingGather(m);
  py::class_<Client> client(m, "Client");
  BindClientProperties(client);
  BindClientTransfers(client);
  BindClientStep(client);
  BindFunctions(m);
}
