// GPU memory from Python: what the CUDA driver says of a tensor's memory, the
// registration decision with its reasons (also without a protection domain),
// and GpuBuffer, exported to PyTorch and CuPy through DLPack.
#include "binding.hpp"
#include "dlpack.hpp"

#include <cstring>

namespace gpuverbs::python {

namespace {

/// What an exported DLPack tensor holds: the buffer (through its Python object) and its shape.
struct Export {
    dlpack::ManagedTensor tensor{};
    std::int64_t shape = 0;
    py::object owner;
};

void delete_export(dlpack::ManagedTensor* t) {
    auto* e = static_cast<Export*>(t->manager_ctx);
    py::gil_scoped_acquire gil;
    delete e; // NOLINT(cppcoreguidelines-owning-memory): made in dlpack_of
}

py::capsule dlpack_of(const py::object& owner, const GpuBuffer& buffer) {
    auto* e = new Export(); // NOLINT(cppcoreguidelines-owning-memory): freed by its deleter
    e->owner = owner;
    e->shape = static_cast<std::int64_t>(buffer.size());
    e->tensor.dl_tensor.data = buffer.pointer();
    e->tensor.dl_tensor.device = {dlpack::cuda, buffer.gpu()};
    e->tensor.dl_tensor.ndim = 1;
    e->tensor.dl_tensor.dtype = {dlpack::uint_code, 8, 1};
    e->tensor.dl_tensor.shape = &e->shape;
    e->tensor.dl_tensor.strides = nullptr;
    e->tensor.dl_tensor.byte_offset = 0;
    e->tensor.manager_ctx = e;
    e->tensor.deleter = delete_export;
    // An unconsumed capsule frees the tensor itself (DLPack's rule).
    PyCapsule_Destructor unconsumed = [](PyObject* capsule) {
        if (PyCapsule_IsValid(capsule, "dltensor") != 0) {
            auto* t = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
            if (t != nullptr && t->deleter != nullptr) t->deleter(t);
        }
    };
    return py::capsule(&e->tensor, "dltensor", unconsumed);
}

py::dict memory_dict(const GpuMemory& g) {
    py::dict d;
    d["address"] = g.address;
    d["size"] = g.size;
    d["gpu"] = g.gpu;
    d["allocation_base"] = g.allocation_base;
    d["allocation_size"] = g.allocation_size;
    d["allocation"] = std::string(to_string(g.allocation));
    d["gpu_direct_rdma_capable"] = g.gpu_direct_rdma_capable;
    d["buffer_id"] = g.buffer_id;
    return d;
}

GpuMemory gpu_memory_of(const py::object& obj, const std::string& via) {
    Borrowed b = borrow(obj, via, false);
    if (!b.cuda) {
        throw py::value_error("obj is " + b.device + " memory, not CUDA device memory: register it as host memory");
    }
    py::gil_scoped_release release;
    return GpuMemory::from_address(b.address, b.size);
}

py::dict check_dict(const Check& c) {
    py::dict d;
    d["ok"] = c.ok;
    d["reason"] = c.reason;
    return d;
}

py::dict probes_dict(const GpuDirectProbes& p) {
    py::dict d;
    d["gpu_direct_rdma"] = check_dict(p.gpu_direct_rdma);
    d["memory"] = check_dict(p.memory);
    d["gpu_dmabuf"] = check_dict(p.gpu_dmabuf);
    d["nic_dmabuf"] = check_dict(p.nic_dmabuf);
    d["peermem"] = check_dict(p.peermem);
    return d;
}

/// The plan's members and the probes, in one dict.
py::dict explanation_dict(const GpuRegistrationExplanation& e) {
    py::dict d;
    d["policy"] = std::string(to_string(e.plan.policy));
    py::list order;
    for (Registration r : e.plan.order) order.append(std::string(to_string(r)));
    d["order"] = order;
    py::list rejected;
    for (const Rejection& r : e.plan.rejected)
        rejected.append(py::make_tuple(std::string(to_string(r.method)), r.reason));
    d["rejected"] = rejected;
    d["probes"] = probes_dict(e.probes);
    return d;
}

GpuRegistration policy_of(const std::string& name) {
    std::optional<GpuRegistration> p = parse_gpu_registration(name);
    if (!p) throw py::value_error("policy must be 'auto', 'dmabuf' or 'peermem', not '" + name + "'");
    return *p;
}

} // namespace

void bind_gpu(py::module_& m) {
    record_fields(m, "GpuMemory", memory_dict(GpuMemory{}));
    record_fields(m, "Check", check_dict(Check{}));
    record_fields(m, "GpuDirectProbes", probes_dict(GpuDirectProbes{}));
    record_fields(m, "GpuRegistrationExplanation", explanation_dict(GpuRegistrationExplanation{}));

    m.def(
        "gpu_memory",
        [](const py::object& obj, const std::string& via) { return memory_dict(gpu_memory_of(obj, via)); },
        py::arg("obj"), py::arg("via") = "auto",
        "What the CUDA driver says of obj's memory (a CUDA tensor or GpuBuffer): address, size, gpu, its "
        "allocation, whether it is GPUDirect RDMA capable, and buffer_id (which changes when an address is "
        "freed and reused: the registration cache's key).");

    m.def(
        "explain_gpu_registration",
        [](const py::object& obj, const std::shared_ptr<ProtectionDomain>& pd, const std::string& policy,
           const std::string& via) {
            GpuMemory memory = gpu_memory_of(obj, via);
            py::gil_scoped_release release;
            GpuRegistrationExplanation e = pd ? explain_gpu_registration(*pd, memory, policy_of(policy))
                                              : explain_gpu_registration(memory, policy_of(policy));
            py::gil_scoped_acquire gil;
            return explanation_dict(e);
        },
        py::arg("obj"), py::arg("pd") = nullptr, py::arg("policy") = "auto", py::arg("via") = "auto",
        "The registration decision for obj's GPU memory: each probe's answer, the methods in the order they would "
        "be tried and each one rejected with its reason. Without pd the NIC is not probed.");

    py::class_<GpuBuffer, std::shared_ptr<GpuBuffer>>(m, "GpuBuffer",
                                                      "GPU memory allocated for GPUDirect RDMA (cuMemAlloc or VMM).")
        .def(py::init([](std::size_t size, int gpu) {
                 if (size == 0) throw py::value_error("GpuBuffer: size must be positive");
                 GpuBufferOptions o;
                 o.gpu = gpu;
                 return std::make_shared<GpuBuffer>(size, o);
             }),
             py::arg("size"), py::arg("gpu") = GpuBufferOptions{}.gpu)
        .def_property_readonly("size", &GpuBuffer::size)
        .def_property_readonly("gpu", &GpuBuffer::gpu)
        .def_property_readonly("address", &GpuBuffer::address)
        .def_property_readonly("memory", [](const GpuBuffer& b) { return memory_dict(b.memory()); })
        .def(
            "copy_from",
            [](const GpuBuffer& b, const py::buffer& data, std::size_t offset) {
                Py_buffer view{};
                if (PyObject_GetBuffer(data.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
                    PyErr_Clear();
                    throw py::value_error("copy_from: data must be contiguous bytes (numpy.ascontiguousarray)");
                }
                std::span<const std::byte> host(static_cast<const std::byte*>(view.buf),
                                                static_cast<std::size_t>(view.len));
                try {
                    py::gil_scoped_release release;
                    b.copy_from_host(host, offset);
                } catch (...) {
                    PyBuffer_Release(&view);
                    throw;
                }
                PyBuffer_Release(&view);
            },
            py::arg("data"), py::arg("offset") = 0, "Copies host bytes into the buffer at offset.")
        .def(
            "to_bytes",
            [](const GpuBuffer& b) {
                std::string out(b.size(), '\0');
                {
                    py::gil_scoped_release release;
                    b.copy_to_host(std::as_writable_bytes(std::span(out.data(), out.size())));
                }
                return py::bytes(out);
            },
            "The buffer's bytes, copied to the host.")
        .def("__len__", &GpuBuffer::size)
        .def("__dlpack_device__", [](const GpuBuffer& b) { return py::make_tuple(dlpack::cuda, b.gpu()); })
        .def(
            "__dlpack__",
            [](const py::object& self, const py::object& /*stream*/) {
                return dlpack_of(self, self.cast<const GpuBuffer&>());
            },
            py::arg("stream") = py::none(),
            "A DLPack capsule of the buffer as uint8 (torch.from_dlpack, cupy.from_dlpack): zero copy; the "
            "buffer stays alive while the tensor does. Its bytes are ready (copies here are synchronous).");
}

} // namespace gpuverbs::python
