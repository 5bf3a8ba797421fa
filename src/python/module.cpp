// The module gpuverbs._core: the C++ library for the Python package gpuverbs
// (src/python/gpuverbs). Each bind_* is one part of the library.
#include "binding.hpp"

namespace gpuverbs::python {

void record_fields(py::module_& m, const char* cpp_struct, const py::dict& form) {
    if (!py::hasattr(m, "_struct_fields")) m.attr("_struct_fields") = py::dict();
    py::list keys;
    for (const auto& item : form) keys.append(item.first);
    m.attr("_struct_fields")[cpp_struct] = keys;
}

} // namespace gpuverbs::python

PYBIND11_MODULE(_core, m) {
    namespace python = gpuverbs::python;
    m.doc() = "gpuverbs' C++ library, bound for the Python package gpuverbs (import gpuverbs, not this).";
    m.attr("__version__") = gpuverbs::version_string;
    python::bind_errors(m);
    python::bind_verbs(m);
    python::bind_memory(m);
    python::bind_operations(m);
    python::bind_queue_pairs(m);
    python::bind_transfers(m);
    python::bind_connections(m);
    python::bind_gpu(m);
    python::bind_device_queue(m); // before leases: PrometheusText.add_device_queue_proxy names its class
    python::bind_leases(m);
    python::bind_mesh(m);
}
