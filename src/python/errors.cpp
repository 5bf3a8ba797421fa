// C++ errors as Python exceptions: one hierarchy (gpuverbs/errors.py), the
// C++ library's words as the message, the error code kept (.code, .category).
#include "binding.hpp"

#include <boost/system/system_error.hpp>

namespace gpuverbs::python {

namespace {

py::object error_with_text(const std::error_code& code, std::string_view verb, const std::string& text) {
    py::module_ errors = py::module_::import("gpuverbs.errors");
    const char* kind = "Error";
    py::object value = py::int_(code.value());
    if (code.category() == gpuverbs_category()) {
        auto e = static_cast<errc>(code.value());
        value = py::cast(e);
        if (code == condition::refused_locally) kind = "RequestRefused";
        if (e == errc::gpu_direct_unavailable) kind = "GpuDirectUnavailable";
        if (e == errc::connection_rejected) kind = "ConnectionRejected";
        if (e == errc::peer_closed || e == errc::not_connected) kind = "ConnectionClosed";
    } else if (code.category() == wc_category()) {
        kind = "CompletionError";
    } else if (code == std::errc::timed_out) {
        kind = "TimeoutError";
    } else if (code == std::errc::operation_canceled) {
        kind = "Aborted";
    }
    return errors.attr(kind)(text, value, code.category().name(), std::string(verb));
}

} // namespace

py::object make_error(const std::error_code& code, std::string_view verb, std::string_view detail) {
    return error_with_text(code, verb, Error(code, verb, detail).what());
}

void raise_error(const std::error_code& code, std::string_view verb, std::string_view detail) {
    py::object error = make_error(code, verb, detail);
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
    throw py::error_already_set();
}

namespace {

/// The gpuverbs.Error for a C++ exception (empty for one that is not the library's).
py::object exception_for(const std::exception& error) {
    py::object e;
    if (const auto* gpu = dynamic_cast<const GpuRegistrationError*>(&error)) {
        e = error_with_text(gpu->code(), gpu->verb(), gpu->what());
        py::list rejections;
        for (const Rejection& r : gpu->rejections()) {
            rejections.append(py::make_tuple(std::string(to_string(r.method)), r.reason));
        }
        e.attr("rejections") = rejections;
    } else if (const auto* ours = dynamic_cast<const Error*>(&error)) {
        e = error_with_text(ours->code(), ours->verb(), ours->what());
    } else if (const auto* system = dynamic_cast<const std::system_error*>(&error)) {
        e = error_with_text(system->code(), "", system->what());
    } else if (const auto* asio = dynamic_cast<const boost::system::system_error*>(&error)) {
        e = error_with_text(static_cast<std::error_code>(asio->code()), "", asio->what());
    }
    return e;
}

void set_python_error(const py::object& e) {
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(e.ptr())), e.ptr());
}

} // namespace

void raise_exception(const std::exception& error) {
    py::object e = exception_for(error);
    if (!e) throw std::runtime_error(error.what());
    set_python_error(e);
    throw py::error_already_set();
}

void bind_errors(py::module_& m) {
    py::enum_<errc>(m, "Errc", "gpuverbs' own error conditions (gpuverbs.Error.code when .category is 'gpuverbs')")
        .value("no_rdma_device", errc::no_rdma_device)
        .value("device_not_found", errc::device_not_found)
        .value("port_not_found", errc::port_not_found)
        .value("gid_not_found", errc::gid_not_found)
        .value("built_without_cuda", errc::built_without_cuda)
        .value("no_gpu_driver", errc::no_gpu_driver)
        .value("no_gpu", errc::no_gpu)
        .value("cuda_error", errc::cuda_error)
        .value("unsupported", errc::unsupported)
        .value("invalid_argument", errc::invalid_argument)
        .value("local_range_outside_region", errc::local_range_outside_region)
        .value("remote_range_outside_region", errc::remote_range_outside_region)
        .value("inline_too_large", errc::inline_too_large)
        .value("too_many_sges", errc::too_many_sges)
        .value("send_queue_full", errc::send_queue_full)
        .value("receive_queue_full", errc::receive_queue_full)
        .value("misaligned_atomic", errc::misaligned_atomic)
        .value("batch_full", errc::batch_full)
        .value("receives_through_srq", errc::receives_through_srq)
        .value("invalid_endpoint", errc::invalid_endpoint)
        .value("malformed_record", errc::malformed_record)
        .value("unsupported_version", errc::unsupported_version)
        .value("peer_closed", errc::peer_closed)
        .value("no_executor", errc::no_executor)
        .value("async_needs_one_cq", errc::async_needs_one_cq)
        .value("not_gpu_memory", errc::not_gpu_memory)
        .value("gpu_direct_unavailable", errc::gpu_direct_unavailable)
        .value("rendezvous_unavailable", errc::rendezvous_unavailable)
        .value("rank_taken", errc::rank_taken)
        .value("peer_missing", errc::peer_missing)
        .value("connection_rejected", errc::connection_rejected)
        .value("not_connected", errc::not_connected)
        .value("stale_block_list", errc::stale_block_list)
        .value("blocks_leased", errc::blocks_leased)
        .value("queue_pair_in_error", errc::queue_pair_in_error)
        .value("queue_pair_stalled", errc::queue_pair_stalled)
        .value("port_down", errc::port_down)
        .value("lease_unknown", errc::lease_unknown)
        .value("lease_not_yours", errc::lease_not_yours)
        .value("stale_metadata", errc::stale_metadata)
        .value("device_queue_failed", errc::device_queue_failed)
        .value("reads_not_granted", errc::reads_not_granted);

    // Every C++ exception the library throws reaches Python as its gpuverbs.Error.
    // pybind11's translator type takes the pointer by value.
    py::register_exception_translator([](std::exception_ptr p) { // NOLINT(performance-unnecessary-value-param)
        if (!p) return;
        try {
            std::rethrow_exception(p);
        } catch (const Error& e) {
            set_python_error(exception_for(e));
        } catch (const std::system_error& e) {
            set_python_error(exception_for(e));
        } catch (const boost::system::system_error& e) { // Asio's sockets (the TCP bootstrap)
            set_python_error(exception_for(e));
        }
    });
}

} // namespace gpuverbs::python
