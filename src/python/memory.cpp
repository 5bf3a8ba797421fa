// Memory from Python objects, zero copy: DLPack (PyTorch, CuPy, JAX, NumPy),
// __cuda_array_interface__ and the buffer protocol. A region holds the object
// (and what its protocol lent) for its whole life; a non-contiguous object is
// refused, never copied. CUDA memory goes through register_gpu_memory.
#include "binding.hpp"
#include "dlpack.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>

namespace gpuverbs::python {

// --- Context -----------------------------------------------------------------

Context::Context() : epoll_(::epoll_create1(EPOLL_CLOEXEC)), wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (epoll_ < 0 || wake_ < 0) {
        const int err = errno;
        const char* verb = epoll_ < 0 ? "epoll_create1" : "eventfd";
        if (wake_ >= 0) ::close(wake_);
        if (epoll_ >= 0) ::close(epoll_);
        throw Error({err, std::system_category()}, verb, "for the Python context");
    }
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = wake_;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &event) != 0) {
        const int err = errno;
        ::close(wake_);
        ::close(epoll_);
        throw Error({err, std::system_category()}, "epoll_ctl", "for the Python context");
    }
}

Context::~Context() {
    if (wake_ >= 0) ::close(wake_);
    if (epoll_ >= 0) ::close(epoll_);
}

void Context::wake() noexcept { // NOLINT(readability-make-member-function-const): signals the eventfd
    const std::uint64_t one = 1;
    (void)!::write(wake_, &one, sizeof one);
}

void Context::watch(int fd) { // NOLINT(readability-make-member-function-const): changes the epoll set
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &event) != 0 && errno != EEXIST) {
        throw Error({errno, std::system_category()}, "epoll_ctl", "watching a completion channel");
    }
}

void Context::unwatch(int fd) noexcept { // NOLINT(readability-make-member-function-const): changes the epoll set
    (void)::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
}

std::size_t Context::poll() {
    std::uint64_t woken = 0;
    (void)!::read(wake_, &woken, sizeof woken);
    if (io_.stopped()) io_.restart();
    return io_.poll();
}

std::size_t Context::run_one_for(std::chrono::microseconds timeout) {
    if (io_.stopped()) io_.restart();
    return io_.run_one_for(timeout);
}

// --- Borrowing an object's memory --------------------------------------------

namespace {

std::string type_name(const py::handle& obj) {
    return py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
}

/// Holds a Python object from C++ (releases it under the GIL, from any thread).
std::shared_ptr<void> hold_object(const py::object& obj) {
    auto* held = new py::object(obj); // NOLINT(cppcoreguidelines-owning-memory): owned by the shared_ptr
    return {held, [](void* p) {
                py::gil_scoped_acquire gil;
                delete static_cast<py::object*>(p);
            }};
}

/// Whether `strides` (in units) describe compact row-major storage of `shape`.
bool row_major(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides, std::int64_t unit) {
    std::int64_t expected = unit;
    for (std::size_t i = shape.size(); i-- > 0;) {
        if (shape[i] != 1 && strides[i] != expected) return false;
        expected *= shape[i];
    }
    return true;
}

std::string dims(const std::vector<std::int64_t>& v) {
    std::string s = "(";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + (v.size() == 1 ? ",)" : ")");
}

[[noreturn]] void not_contiguous(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides,
                                 const char* unit) {
    throw py::value_error("register: obj is not contiguous (shape " + dims(shape) + ", strides " + dims(strides) + " " +
                          unit +
                          "): the NIC reads one range of bytes and gpuverbs never copies; pass a contiguous tensor "
                          "(tensor.contiguous(), numpy.ascontiguousarray) and keep that one");
}

void check_size(std::size_t size) {
    if (size == 0) throw py::value_error("register: obj is empty (0 bytes): there is nothing to register");
}

Borrowed from_dlpack(const py::object& obj) {
    py::object capsule = obj.attr("__dlpack__")();
    auto* managed = static_cast<dlpack::ManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    if (managed == nullptr) {
        PyErr_Clear();
        throw py::type_error("register: obj.__dlpack__() did not return a \"dltensor\" capsule (got " +
                             type_name(capsule) + ")");
    }
    // Consumed: we call its deleter when the region goes (DLPack's rule).
    if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
    Borrowed b;
    b.via = "dlpack";
    b.hold = std::shared_ptr<void>(managed, [](void* p) {
        auto* m = static_cast<dlpack::ManagedTensor*>(p);
        if (m->deleter != nullptr) {
            py::gil_scoped_acquire gil;
            m->deleter(m);
        }
    });
    const dlpack::Tensor& t = managed->dl_tensor;
    std::vector<std::int64_t> shape(t.shape,
                                    t.shape + t.ndim); // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
    std::int64_t elements = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    if (t.strides != nullptr) {
        std::vector<std::int64_t> strides(
            t.strides, t.strides + t.ndim); // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
        if (elements > 0 && !row_major(shape, strides, 1)) not_contiguous(shape, strides, "elements");
    }
    const std::size_t bits = std::size_t{t.dtype.bits} * t.dtype.lanes;
    if (bits % 8 != 0)
        throw py::value_error("register: obj's elements are " + std::to_string(bits) +
                              " bits wide: "
                              "only whole bytes can be registered");
    b.size = static_cast<std::size_t>(elements) * bits / 8;
    b.address = reinterpret_cast<std::uintptr_t>(t.data) + t.byte_offset;
    switch (t.device.device_type) {
        case dlpack::cpu: b.device = "cpu"; break;
        case dlpack::cuda_host: b.device = "cuda_host"; break;
        case dlpack::cuda:
            b.cuda = true;
            b.gpu = t.device.device_id;
            b.device = "cuda:" + std::to_string(b.gpu);
            break;
        case dlpack::cuda_managed:
            throw py::value_error(
                "register: obj is in CUDA managed memory, which GPUDirect RDMA cannot reach: "
                "allocate it as device memory (or host memory)");
        default:
            throw py::value_error("register: obj is on DLPack device type " + std::to_string(t.device.device_type) +
                                  ": gpuverbs registers CPU and CUDA memory only");
    }
    return b;
}

Borrowed from_cuda_array_interface(const py::object& obj) {
    py::dict cai = obj.attr("__cuda_array_interface__");
    Borrowed b;
    b.via = "cuda_array_interface";
    b.cuda = true;
    b.gpu = -1; // the driver says (GpuMemory::from_address)
    b.device = "cuda";
    py::tuple data = cai["data"];
    b.address = data[0].cast<std::uint64_t>();
    b.readonly = data[1].cast<bool>();
    std::vector<std::int64_t> shape = cai["shape"].cast<std::vector<std::int64_t>>();
    std::string typestr = cai["typestr"].cast<std::string>();
    std::int64_t itemsize = typestr.size() > 2 ? std::stoll(typestr.substr(2)) : 0;
    if (itemsize <= 0)
        throw py::value_error("register: obj's __cuda_array_interface__ typestr '" + typestr + "' has no item size");
    std::int64_t elements = std::accumulate(shape.begin(), shape.end(), std::int64_t{1}, std::multiplies<>());
    if (cai.contains("strides") && !cai["strides"].is_none()) {
        std::vector<std::int64_t> strides = cai["strides"].cast<std::vector<std::int64_t>>();
        if (elements > 0 && !row_major(shape, strides, itemsize)) not_contiguous(shape, strides, "bytes");
    }
    b.size = static_cast<std::size_t>(elements * itemsize);
    b.hold = hold_object(obj);
    return b;
}

Borrowed from_buffer(const py::object& obj, bool writable) {
    auto view =
        std::shared_ptr<Py_buffer>(new Py_buffer{}, [](Py_buffer* v) { // NOLINT(cppcoreguidelines-owning-memory)
            if (v->obj != nullptr) {
                py::gil_scoped_acquire gil;
                PyBuffer_Release(v);
            }
            delete v; // NOLINT(cppcoreguidelines-owning-memory)
        });
    const int flags = PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), view.get(), flags) != 0) {
        PyErr_Clear();
        if (writable && PyObject_GetBuffer(obj.ptr(), view.get(), PyBUF_STRIDES) == 0) {
            throw py::value_error("register: obj (" + type_name(obj) +
                                  ") is read-only, but access lets the NIC write into it (local_write, remote_write "
                                  "or remote_atomic): register a writable object, or ask for remote_read only");
        }
        PyErr_Clear();
        throw py::value_error("register: obj (" + type_name(obj) + ") refused the buffer protocol");
    }
    if (PyBuffer_IsContiguous(view.get(), 'C') == 0) {
        std::vector<std::int64_t> shape(view->shape, view->shape + view->ndim);       // NOLINT
        std::vector<std::int64_t> strides(view->strides, view->strides + view->ndim); // NOLINT
        not_contiguous(shape, strides, "bytes");
    }
    Borrowed b;
    b.via = "buffer";
    b.device = "cpu";
    b.address = reinterpret_cast<std::uintptr_t>(view->buf);
    b.size = static_cast<std::size_t>(view->len);
    b.readonly = view->readonly != 0;
    b.hold = view;
    return b;
}

bool dlpack_refused(const py::error_already_set& e) {
    return e.matches(PyExc_BufferError);
}

} // namespace

Borrowed borrow(const py::object& obj, const std::string& via, bool writable) {
    const bool automatic = via == "auto";
    if (!automatic && via != "dlpack" && via != "cuda_array_interface" && via != "buffer") {
        throw py::value_error("register: via must be 'auto', 'dlpack', 'cuda_array_interface' or 'buffer', not '" +
                              via + "'");
    }
    if (via == "dlpack" || (automatic && py::hasattr(obj, "__dlpack__"))) {
        if (!py::hasattr(obj, "__dlpack__")) {
            throw py::type_error("register: obj (" + type_name(obj) + ") has no __dlpack__");
        }
        try {
            return from_dlpack(obj);
        } catch (py::error_already_set& e) {
            // NumPy refuses read-only arrays through DLPack: the buffer protocol takes them.
            if (!(automatic && dlpack_refused(e) && PyObject_CheckBuffer(obj.ptr()) != 0)) {
                if (e.matches(PyExc_TypeError) || e.matches(PyExc_ValueError)) throw;
                throw py::value_error("register: obj.__dlpack__() failed: " + std::string(e.what()));
            }
        }
    }
    if (via == "cuda_array_interface" || (automatic && py::hasattr(obj, "__cuda_array_interface__"))) {
        if (!py::hasattr(obj, "__cuda_array_interface__")) {
            throw py::type_error("register: obj (" + type_name(obj) + ") has no __cuda_array_interface__");
        }
        Borrowed b = from_cuda_array_interface(obj);
        if (b.readonly && writable) {
            throw py::value_error(
                "register: obj's __cuda_array_interface__ says it is read-only, but access lets "
                "the NIC write into it");
        }
        return b;
    }
    if (via == "buffer" || automatic) {
        if (PyObject_CheckBuffer(obj.ptr()) == 0) {
            throw py::type_error(
                "register: obj must expose __dlpack__, __cuda_array_interface__ or the buffer "
                "protocol (a NumPy array, a PyTorch or CuPy tensor, a bytearray, ...), not " +
                type_name(obj));
        }
        return from_buffer(obj, writable);
    }
    throw py::type_error("register: obj (" + type_name(obj) + ") cannot be registered via " + via);
}

Region::~Region() {
    close();
    try {
        py::gil_scoped_acquire gil;
        forget_cached();
        memory.hold.reset();
        owner = py::object();
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor never throws; only at interpreter exit
    }
}

Slice to_slice(const py::handle& arg, const char* name) {
    if (py::isinstance<Slice>(arg)) return arg.cast<Slice>();
    if (py::isinstance<Region>(arg)) {
        auto region = arg.cast<std::shared_ptr<Region>>();
        return Slice{region, 0, region->length};
    }
    throw py::type_error(std::string(name) +
                         " must be a gpuverbs.MemoryRegion or a LocalBuffer (region.slice()), not " + type_name(arg));
}

namespace {

std::shared_ptr<Region> register_object(const ProtectionDomain& pd, const py::object& obj, unsigned access_bits,
                                        const std::string& via, const std::string& policy_name) {
    if ((access_bits & ~static_cast<unsigned>(access_all | Access::relaxed_ordering)) != 0) {
        throw py::value_error("register: access has unknown bits " + std::to_string(access_bits) +
                              ": combine gpuverbs.Access flags");
    }
    auto access = static_cast<Access>(access_bits);
    std::optional<GpuRegistration> policy = parse_gpu_registration(policy_name);
    if (!policy)
        throw py::value_error("register: policy must be 'auto', 'dmabuf' or 'peermem', not '" + policy_name + "'");
    const bool writable =
        has(access, Access::local_write) || has(access, Access::remote_write) || has(access, Access::remote_atomic);
    auto region = std::make_shared<Region>();
    region->memory = borrow(obj, via, writable);
    check_size(region->memory.size);
    region->length = region->memory.size;
    region->owner = obj;
    const Borrowed& b = region->memory;
    if (!b.cuda) {
        py::gil_scoped_release release;
        region->own = MemoryRegion(pd, reinterpret_cast<void*>(static_cast<std::uintptr_t>(b.address)), // NOLINT
                                   b.size, access);
        return region;
    }
    py::gil_scoped_release release;
    GpuMemory memory = GpuMemory::from_address(b.address, b.size);
    GpuRegistrationExplanation why = explain_gpu_registration(pd, memory, *policy);
    region->reasons = why.plan.rejected;
    region->policy = to_string(why.plan.policy);
    region->own = register_gpu_memory(pd, memory, access, *policy);
    region->memory.gpu = memory.gpu;
    region->memory.device = "cuda:" + std::to_string(memory.gpu);
    return region;
}

/// A registration cache and the protection domain it registers in (held).
struct Cache {
    std::shared_ptr<ProtectionDomain> pd;
    std::unique_ptr<RegistrationCache> cache;
    /// Host entries: how many live regions (objects) use each. The C++ cache
    /// cannot see free(); here each object is held by its region, so the
    /// last region gone is the moment its memory may go.
    std::map<const MemoryRegion*, std::size_t> host_users;
};

std::shared_ptr<Region> cached_region(const std::shared_ptr<Cache>& cache, const py::object& obj,
                                      unsigned access_bits) {
    Cache& c = *cache;
    const auto access = static_cast<Access>(access_bits);
    const bool writable =
        has(access, Access::local_write) || has(access, Access::remote_write) || has(access, Access::remote_atomic);
    auto region = std::make_shared<Region>();
    region->memory = borrow(obj, "auto", writable);
    check_size(region->memory.size);
    region->length = region->memory.size;
    region->owner = obj;
    const Borrowed& b = region->memory;
    // The cache is not thread-safe: it is used with the GIL held.
    if (b.cuda) {
        GpuMemory memory = GpuMemory::from_address(b.address, b.size);
        region->cached = c.cache->get(memory, access);
        region->base =
            static_cast<std::size_t>(memory.address - reinterpret_cast<std::uintptr_t>(region->cached->address()));
        region->memory.device = "cuda:" + std::to_string(memory.gpu);
    } else {
        auto* p =
            reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(b.address)); // NOLINT(performance-no-int-to-ptr)
        region->cached = c.cache->get(std::span<std::byte>(p, b.size), access);
        region->base = static_cast<std::size_t>(p - static_cast<std::byte*>(region->cached->address()));
        // The hook holds the entry's region: its address cannot be reused by
        // another region (and so its count) before the hook has run.
        std::shared_ptr<const MemoryRegion> entry = region->cached;
        region->forget = [weak = std::weak_ptr<Cache>(cache), entry] {
            const std::shared_ptr<Cache> owner = weak.lock();
            if (!owner) return;
            auto it = owner->host_users.find(entry.get());
            if (it == owner->host_users.end() || --it->second > 0) return;
            owner->host_users.erase(it);
            owner->cache->invalidate(entry->address(), entry->length());
        };
        ++c.host_users[entry.get()]; // after the hook exists: it is the one that takes it back
    }
    return region;
}

py::dict cache_statistics_dict(const RegistrationCacheStatistics& s) {
    py::dict d;
    d["hits"] = s.hits;
    d["misses"] = s.misses;
    d["evictions"] = s.evictions;
    d["merges"] = s.merges;
    d["invalidations"] = s.invalidations;
    d["stale"] = s.stale;
    d["regions"] = s.regions;
    d["bytes_pinned"] = s.bytes_pinned;
    return d;
}

py::list rejections_list(const std::vector<Rejection>& rejected) {
    py::list out;
    for (const Rejection& r : rejected) out.append(py::make_tuple(std::string(to_string(r.method)), r.reason));
    return out;
}

} // namespace

void bind_memory(py::module_& m) {
    record_fields(m, "RegistrationCacheStatistics", cache_statistics_dict(RegistrationCacheStatistics{}));

    py::dict access;
    access["none"] = static_cast<unsigned>(Access::none);
    access["local_write"] = static_cast<unsigned>(Access::local_write);
    access["remote_write"] = static_cast<unsigned>(Access::remote_write);
    access["remote_read"] = static_cast<unsigned>(Access::remote_read);
    access["remote_atomic"] = static_cast<unsigned>(Access::remote_atomic);
    access["relaxed_ordering"] = static_cast<unsigned>(Access::relaxed_ordering);
    m.attr("_access_flags") = access;

    py::class_<RemoteMemory>(m, "RemoteMemory", "A peer's registered memory: address, length and rkey.")
        .def(py::init([](std::uint64_t address, std::uint64_t length, std::uint32_t rkey) {
                 return RemoteMemory{address, length, rkey};
             }),
             py::arg("address"), py::arg("length"), py::arg("rkey"))
        .def_readonly("address", &RemoteMemory::address)
        .def_readonly("length", &RemoteMemory::length)
        .def_readonly("rkey", &RemoteMemory::rkey)
        .def("__len__", [](const RemoteMemory& r) { return r.length; })
        .def("__eq__", [](const RemoteMemory& a, const RemoteMemory& b) { return a == b; })
        .def("__repr__",
             [](const RemoteMemory& r) {
                 return "RemoteMemory(address=" + std::to_string(r.address) + ", length=" + std::to_string(r.length) +
                        ", rkey=" + std::to_string(r.rkey) + ")";
             })
        .def(
            "to_bytes",
            [](const RemoteMemory& r) {
                auto bytes = wire::serialize(r);
                return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
            },
            "The wire form (gpuverbs.wire: what a peer's from_bytes reads).")
        .def_static(
            "from_bytes",
            [](const py::bytes& data) {
                std::string_view v = data;
                return wire::parse_remote_memory(std::as_bytes(std::span(v.data(), v.size())));
            },
            py::arg("data"), "Parses to_bytes' form (gpuverbs.Error malformed_record when it is not one).");

    // Both declared before their members: each names the other in its signatures.
    py::class_<Slice> local_buffer(m, "LocalBuffer",
                                   "A range of a registered region: what an operation reads or writes locally.");
    py::class_<Region, std::shared_ptr<Region>> region(
        m, "MemoryRegion",
        "Memory registered with a protection domain (ProtectionDomain.register). It holds the registered object "
        "for its whole life, so the memory stays valid while the NIC may use it.");

    local_buffer.def_property_readonly("region", [](const Slice& s) { return s.region; })
        .def_readonly("offset", &Slice::offset)
        .def_readonly("length", &Slice::length)
        .def("__len__", [](const Slice& s) { return s.length; });

    region
        .def_property_readonly(
            "obj", [](const Region& r) { return r.owner; }, "The registered object (held).")
        .def_property_readonly("address", [](const Region& r) { return r.memory.address; })
        .def_property_readonly("length", [](const Region& r) { return r.length; })
        .def("__len__", [](const Region& r) { return r.length; })
        .def_property_readonly("lkey", [](const Region& r) { return r.mr().lkey(); })
        .def_property_readonly("rkey", [](const Region& r) { return r.mr().rkey(); })
        .def_property_readonly("access", [](const Region& r) { return static_cast<unsigned>(r.mr().access()); })
        .def_property_readonly(
            "method", [](const Region& r) { return std::string(to_string(r.mr().registration())); },
            "How it was registered: 'host', 'DMA-BUF' or 'peermem' (the C++ library's names).")
        .def_property_readonly(
            "reasons", [](const Region& r) { return rejections_list(r.reasons); },
            "GPU memory: (method, reason) for each method not taken.")
        .def_property_readonly("policy", [](const Region& r) { return r.policy; })
        .def_property_readonly(
            "via", [](const Region& r) { return r.memory.via; },
            "The protocol the memory came through: 'dlpack', 'cuda_array_interface' or 'buffer'.")
        .def_property_readonly(
            "device", [](const Region& r) { return r.memory.device; },
            "Where the memory is: 'cpu', 'cuda_host' or 'cuda:N'.")
        .def(
            "remote",
            [](const Region& r, std::size_t offset, std::optional<std::size_t> length) {
                if (offset > r.length) {
                    throw py::value_error("remote: offset " + std::to_string(offset) + " is past the region's end (" +
                                          std::to_string(r.length) + " bytes)");
                }
                return r.remote(offset, std::min(length.value_or(r.length - offset), r.length - offset));
            },
            py::arg("offset") = 0, py::arg("length") = py::none(),
            "What a peer needs to reach [offset, offset + length) of this region (send it: RemoteMemory.to_bytes).")
        .def(
            "slice",
            [](const std::shared_ptr<Region>& r, std::int64_t offset, std::optional<std::int64_t> length) {
                if (offset < 0)
                    throw py::value_error("slice: offset must not be negative (got " + std::to_string(offset) + ")");
                const auto size = static_cast<std::int64_t>(r->length);
                std::int64_t n = length.value_or(size - std::min(offset, size));
                if (n < 0) throw py::value_error("slice: length must not be negative (got " + std::to_string(n) + ")");
                if (offset + n > size) {
                    throw py::value_error("slice: [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
                                          ") is outside the region's " + std::to_string(size) + " bytes");
                }
                return Slice{r, static_cast<std::size_t>(offset), static_cast<std::size_t>(n)};
            },
            py::arg("offset") = 0, py::arg("length") = py::none(), "A LocalBuffer of [offset, offset + length).")
        .def(
            "close",
            [](Region& r) {
                r.close();
                r.forget_cached();
            },
            "Deregisters now (idempotent); the object stays held until the region is garbage collected, so an "
            "operation still using it fails instead of touching freed memory.");

    py::class_<Cache, std::shared_ptr<Cache>>(
        m, "RegistrationCache",
        "Registrations reused across requests (the C++ RegistrationCache): get() hands back a region covering "
        "the object, registering only on a miss; GPU memory is keyed by its buffer id, and host memory is "
        "forgotten when the last region of it goes, so a freed and reused address is never served a stale "
        "registration.")
        .def(py::init([](const std::shared_ptr<ProtectionDomain>& pd, std::size_t max_regions, std::size_t max_bytes) {
                 RegistrationCacheOptions o;
                 o.max_regions = max_regions;
                 o.max_bytes = max_bytes;
                 auto c = std::make_shared<Cache>();
                 c->pd = pd;
                 c->cache = std::make_unique<RegistrationCache>(*pd, o);
                 return c;
             }),
             py::arg("pd"), py::kw_only(), py::arg("max_regions") = 1024, py::arg("max_bytes") = std::size_t{4} << 30)
        .def(
            "_get",
            [](const std::shared_ptr<Cache>& c, const py::object& obj, unsigned access) {
                return cached_region(c, obj, access);
            },
            py::arg("obj"), py::arg("access"),
            "A MemoryRegion for obj (held, zero copy) from the cache: a hit reuses a registration that covers it.")
        .def(
            "invalidate",
            [](Cache& c, const py::object& obj) {
                Borrowed b = borrow(obj, "auto", false);
                c.cache->invalidate(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(b.address)), // NOLINT
                                    b.size);
            },
            py::arg("obj"), "Drops the cached registrations overlapping obj's memory (call it before freeing it).")
        .def_property_readonly("statistics",
                               [](const Cache& c) { return cache_statistics_dict(c.cache->statistics()); });

    m.def(
        "_register",
        [](const std::shared_ptr<ProtectionDomain>& pd, const py::object& obj, unsigned access, const std::string& via,
           const std::string& policy) { return register_object(*pd, obj, access, via, policy); },
        py::arg("pd"), py::arg("obj"), py::arg("access"), py::arg("via") = "auto", py::arg("policy") = "auto");
}

} // namespace gpuverbs::python
