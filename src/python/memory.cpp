// Registering Python objects' memory (MemoryRegion from Python): a region
// holds the object it borrowed (borrow.cpp) for its whole life; CUDA memory
// goes through register_gpu_memory; the registration cache's Python face.
#include "binding.hpp"

#include <cstdint>
#include <map>
#include <string>

namespace gpuverbs::python {

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
                if (r.proxies != 0) {
                    throw py::value_error(
                        "MemoryRegion.close: a DeviceQueueProxy reads it as a window: let the proxy go first");
                }
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
             py::arg("pd"), py::kw_only(), py::arg("max_regions") = RegistrationCacheOptions{}.max_regions,
             py::arg("max_bytes") = RegistrationCacheOptions{}.max_bytes)
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
