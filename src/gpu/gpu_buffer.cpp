#include "gpuverbs/gpu/gpu_buffer.hpp"

#include "gpu/cuda/driver_api.hpp"
#include "text.hpp"

#include <cctype>
#include <cstdio>
#include <utility>

namespace gpuverbs {
namespace {

using detail::Status;

constexpr std::size_t gpu_page_size = std::size_t{64} << 10; // GPUDirect RDMA maps GPU memory in 64 KiB pages

[[maybe_unused]] std::size_t round_up(std::size_t n, std::size_t unit) {
    return (n + unit - 1) / unit * unit;
}

std::string describe_range(std::uint64_t address, std::size_t size) {
    return std::to_string(size) + " bytes at " + detail::hex_address(address);
}

// The range [offset, offset + n) must lie inside `gpu`.
bool check_inside(const GpuMemory& gpu, std::size_t offset, std::size_t n, const char* verb, Status& status) {
    if (offset <= gpu.size && n <= gpu.size - offset) return true;
    status.fail(errc::invalid_argument, verb,
                "cannot copy " + std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                    ": the GPU memory (" + describe_range(gpu.address, gpu.size) + ") is smaller; nothing was copied");
    return false;
}

#if GPUVERBS_HAVE_CUDA

using detail::cuda::DriverApi;
using detail::cuda::failed;
using detail::cuda::PrimaryContext;

int device_attribute(const DriverApi& cu, CUdevice_attribute attribute, CUdevice device) {
    int value = 0;
    return cu.cuDeviceGetAttribute(&value, attribute, device) == CUDA_SUCCESS ? value : 0;
}

// The GPU `ordinal` exists; else why not, naming the GPUs there are.
bool check_ordinal(const DriverApi& cu, int ordinal, const char* verb, Status& status) {
    int count = 0;
    if (failed(cu.cuDeviceGetCount(&count), "cuDeviceGetCount", "cannot count GPUs", status)) return false;
    if (ordinal >= 0 && ordinal < count) return true;
    status.fail(errc::invalid_argument, verb,
                "there is no GPU " + std::to_string(ordinal) + ": the driver sees " + std::to_string(count) +
                    " GPU(s), numbered from 0 (CUDA_VISIBLE_DEVICES changes which)");
    return false;
}

// Runs `body` with GPU `ordinal`'s primary context current.
template <class Body>
void with_context(int ordinal, const char* verb, Status& status, Body&& body) {
    const DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr) return;
    PrimaryContext context(*cu, ordinal, status);
    if (!context) return;
    PrimaryContext::Scope scope(*cu, context.get());
    if (!scope.ok()) {
        status.fail(errc::cuda_error, verb, "cannot make GPU " + std::to_string(ordinal) + "'s context current");
        return;
    }
    body(*cu);
}

#endif

} // namespace

std::string_view to_string(GpuAllocation allocation) noexcept {
    switch (allocation) {
        case GpuAllocation::automatic: return "automatic";
        case GpuAllocation::device: return "device";
        case GpuAllocation::vmm: return "vmm";
    }
    return "?";
}

GpuMemory GpuMemory::slice(std::size_t offset, std::size_t n) const noexcept {
    GpuMemory out = *this;
    offset = offset > size ? size : offset;
    out.address = address + offset;
    out.size = n > size - offset ? size - offset : n;
    return out;
}

namespace {

GpuMemory describe_impl(std::uint64_t address, std::size_t size, Status& status) {
    GpuMemory out;
    const char* verb = "cuPointerGetAttribute";
    if (size == 0) {
        status.fail(errc::invalid_argument, "GpuMemory",
                    "GPU memory of 0 bytes at " + detail::hex_address(address) + " is empty");
        return out;
    }
#if GPUVERBS_HAVE_CUDA
    const DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr) return out;
    auto ptr = static_cast<CUdeviceptr>(address);
    CUmemorytype type{};
    CUresult r = cu->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr);
    if (r != CUDA_SUCCESS) {
        status.fail(errc::not_gpu_memory, verb,
                    detail::hex_address(address) + " is not memory CUDA knows (" + detail::cuda::describe(r) +
                        "): pass a device pointer from cudaMalloc, cuMemAlloc or cuMemMap, or a GpuBuffer; register "
                        "host memory with MemoryRegion");
        return out;
    }
    unsigned managed = 0;
    (void)cu->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr);
    if (managed != 0) {
        status.fail(errc::not_gpu_memory, verb,
                    detail::hex_address(address) +
                        " is managed memory (cudaMallocManaged), which GPUDirect RDMA cannot use: allocate "
                        "it with cudaMalloc or GpuBuffer");
        return out;
    }
    if (type != CU_MEMORYTYPE_DEVICE) {
        status.fail(errc::not_gpu_memory, verb,
                    detail::hex_address(address) +
                        " is host memory known to CUDA (cudaMallocHost or cudaHostRegister), not GPU "
                        "memory: register it with MemoryRegion");
        return out;
    }
    int ordinal = 0;
    if (failed(cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr), verb,
               "cannot tell which GPU holds " + detail::hex_address(address), status)) {
        return out;
    }
    with_context(ordinal, "cuMemGetAddressRange", status, [&](const DriverApi& api) {
        CUdeviceptr base = 0;
        std::size_t length = 0;
        if (failed(api.cuMemGetAddressRange(&base, &length, ptr), "cuMemGetAddressRange",
                   "cannot find the allocation holding " + detail::hex_address(address), status)) {
            return;
        }
        std::uint64_t end = base + length;
        if (size > end - address) {
            status.fail(errc::invalid_argument, "GpuMemory",
                        "the range of " + describe_range(address, size) + " runs " +
                            std::to_string(size - (end - address)) + " bytes past the end of its allocation (" +
                            describe_range(base, length) + ")");
            return;
        }
        CUmemGenericAllocationHandle handle = 0;
        // NOLINTNEXTLINE(performance-no-int-to-ptr): the driver takes the device address as void*.
        bool vmm = api.cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(ptr)) == CUDA_SUCCESS;
        if (vmm) (void)api.cuMemRelease(handle);
        int capable = 0;
        if (api.cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, ptr) != CUDA_SUCCESS) {
            capable = vmm ? 0 : 1; // drivers before 11.6 cannot say; cuMemAlloc memory always is
        }
        out.address = address;
        out.size = size;
        out.gpu = ordinal;
        out.allocation_base = base;
        out.allocation_size = length;
        out.allocation = vmm ? GpuAllocation::vmm : GpuAllocation::device;
        out.gpu_direct_rdma_capable = capable != 0;
        unsigned long long id = 0; // NOLINT(google-runtime-int): the attribute's type
        if (api.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) == CUDA_SUCCESS) out.buffer_id = id;
    });
    if (!status.ok()) out = GpuMemory{};
#else
    (void)detail::cuda::driver_api(status);
    (void)verb;
#endif
    return out;
}

void copy_to_impl(const GpuMemory& gpu, std::size_t offset, std::span<const std::byte> host, Status& status) {
    if (!check_inside(gpu, offset, host.size(), "cuMemcpyHtoD", status) || host.empty()) return;
#if GPUVERBS_HAVE_CUDA
    with_context(gpu.gpu, "cuMemcpyHtoD", status, [&](const DriverApi& cu) {
        (void)failed(cu.cuMemcpyHtoD(gpu.address + offset, host.data(), host.size()), "cuMemcpyHtoD",
                     "cannot copy " + std::to_string(host.size()) + " bytes to GPU memory at " +
                         detail::hex_address(gpu.address + offset),
                     status);
    });
#else
    (void)detail::cuda::driver_api(status);
#endif
}

void copy_from_impl(const GpuMemory& gpu, std::size_t offset, std::span<std::byte> host, Status& status) {
    if (!check_inside(gpu, offset, host.size(), "cuMemcpyDtoH", status) || host.empty()) return;
#if GPUVERBS_HAVE_CUDA
    with_context(gpu.gpu, "cuMemcpyDtoH", status, [&](const DriverApi& cu) {
        (void)failed(cu.cuMemcpyDtoH(host.data(), gpu.address + offset, host.size()), "cuMemcpyDtoH",
                     "cannot copy " + std::to_string(host.size()) + " bytes from GPU memory at " +
                         detail::hex_address(gpu.address + offset),
                     status);
    });
#else
    (void)detail::cuda::driver_api(status);
#endif
}

} // namespace

GpuMemory GpuMemory::from_address(std::uint64_t address, std::size_t size) {
    return detail::or_throw([&](Status& s) { return describe_impl(address, size, s); });
}

GpuMemory GpuMemory::from_address(std::uint64_t address, std::size_t size, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return describe_impl(address, size, s); });
}

GpuMemory GpuMemory::from_pointer(const void* address, std::size_t size) {
    return from_address(reinterpret_cast<std::uintptr_t>(address), size);
}

GpuMemory GpuMemory::from_pointer(const void* address, std::size_t size, std::error_code& ec) {
    return from_address(reinterpret_cast<std::uintptr_t>(address), size, ec);
}

void copy_to_gpu(const GpuMemory& gpu, std::size_t offset, std::span<const std::byte> host) {
    Status status;
    copy_to_impl(gpu, offset, host, status);
    status.check();
}

void copy_to_gpu(const GpuMemory& gpu, std::size_t offset, std::span<const std::byte> host, std::error_code& ec) {
    Status status;
    copy_to_impl(gpu, offset, host, status);
    ec = status.code;
}

void copy_from_gpu(const GpuMemory& gpu, std::size_t offset, std::span<std::byte> host) {
    Status status;
    copy_from_impl(gpu, offset, host, status);
    status.check();
}

void copy_from_gpu(const GpuMemory& gpu, std::size_t offset, std::span<std::byte> host, std::error_code& ec) {
    Status status;
    copy_from_impl(gpu, offset, host, status);
    ec = status.code;
}

namespace {

bool fill_impl(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value, Status& status) {
    if (check_inside(gpu, offset, size, "cuMemsetD8", status) && size != 0) {
#if GPUVERBS_HAVE_CUDA
        with_context(gpu.gpu, "cuMemsetD8", status, [&](const DriverApi& cu) {
            (void)failed(cu.cuMemsetD8(gpu.address + offset, static_cast<unsigned char>(value), size), "cuMemsetD8",
                         "cannot fill " + describe_range(gpu.address + offset, size), status);
            (void)failed(cu.cuCtxSynchronize(), "cuCtxSynchronize", "cannot wait for the fill", status);
        });
#else
        (void)value;
        (void)detail::cuda::driver_api(status);
#endif
    }
    return status.ok();
}

std::string pci_bus_id_impl(int gpu, Status& status) {
    std::string out;
#if GPUVERBS_HAVE_CUDA
    const DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr || !check_ordinal(*cu, gpu, "cuDeviceGetPCIBusId", status)) return out;
    CUdevice device = 0;
    char bus[32] = {};
    if (failed(cu->cuDeviceGet(&device, gpu), "cuDeviceGet", "GPU " + std::to_string(gpu), status) ||
        failed(cu->cuDeviceGetPCIBusId(bus, sizeof bus, device), "cuDeviceGetPCIBusId", "GPU " + std::to_string(gpu),
               status)) {
        return out;
    }
    for (char* c = bus; *c != '\0'; ++c) *c = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
    out = bus;
#else
    (void)gpu;
    (void)detail::cuda::driver_api(status);
#endif
    return out;
}

} // namespace

void fill_gpu(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value) {
    detail::or_throw([&](Status& s) { return fill_impl(gpu, offset, size, value, s); });
}

void fill_gpu(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value, std::error_code& ec) {
    detail::or_code(ec, [&](Status& s) { return fill_impl(gpu, offset, size, value, s); });
}

void fill_gpu(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value, std::error_code& ec,
              Diagnostics& diagnostics) {
    detail::or_code(ec, diagnostics, [&](Status& s) { return fill_impl(gpu, offset, size, value, s); });
}

std::string gpu_pci_bus_id(int gpu) {
    return detail::or_throw([&](Status& s) { return pci_bus_id_impl(gpu, s); });
}

std::string gpu_pci_bus_id(int gpu, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return pci_bus_id_impl(gpu, s); });
}

std::string gpu_pci_bus_id(int gpu, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](Status& s) { return pci_bus_id_impl(gpu, s); });
}

// --- GpuBuffer ---------------------------------------------------------------

namespace {

struct Allocation {
    std::uint64_t address = 0;
    std::size_t allocated = 0;
    GpuAllocation kind = GpuAllocation::device;
    std::uint64_t vmm_handle = 0;
};

#if GPUVERBS_HAVE_CUDA

std::string gpu_name(int ordinal) {
    return "GPU " + std::to_string(ordinal);
}

Allocation allocate_device(const DriverApi& cu, int ordinal, std::size_t size, Status& status) {
    Allocation out;
    std::size_t allocated = round_up(size, gpu_page_size);
    CUdeviceptr ptr = 0;
    if (failed(cu.cuMemAlloc(&ptr, allocated), "cuMemAlloc",
               "cannot allocate " + std::to_string(allocated) + " bytes on " + gpu_name(ordinal), status)) {
        return out;
    }
    // Every synchronous CUDA copy on this memory then waits for earlier work
    // on it, so the NIC never sees half-finished copies (GPUDirect RDMA guide).
    unsigned sync = 1;
    if (failed(cu.cuPointerSetAttribute(&sync, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, ptr), "cuPointerSetAttribute",
               "cannot set SYNC_MEMOPS on the memory allocated on " + gpu_name(ordinal), status)) {
        (void)cu.cuMemFree(ptr);
        return out;
    }
    out.address = ptr;
    out.allocated = allocated;
    out.kind = GpuAllocation::device;
    return out;
}

Allocation allocate_vmm(const DriverApi& cu, CUdevice device, int ordinal, std::size_t size, Status& status) {
    Allocation out;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    prop.allocFlags.gpuDirectRDMACapable = 1;
    std::size_t granularity = 0;
    if (failed(cu.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity", "cannot size a VMM allocation on " + gpu_name(ordinal), status)) {
        return out;
    }
    std::size_t allocated = round_up(size, granularity);
    std::string what = std::to_string(allocated) + " bytes of VMM memory on " + gpu_name(ordinal);
    CUmemGenericAllocationHandle handle = 0;
    if (failed(cu.cuMemCreate(&handle, allocated, &prop, 0), "cuMemCreate", "cannot allocate " + what, status)) {
        return out;
    }
    CUdeviceptr ptr = 0;
    if (failed(cu.cuMemAddressReserve(&ptr, allocated, granularity, 0, 0), "cuMemAddressReserve",
               "cannot reserve addresses for " + what, status)) {
        (void)cu.cuMemRelease(handle);
        return out;
    }
    if (failed(cu.cuMemMap(ptr, allocated, 0, handle, 0), "cuMemMap", "cannot map " + what, status)) {
        (void)cu.cuMemAddressFree(ptr, allocated);
        (void)cu.cuMemRelease(handle);
        return out;
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (failed(cu.cuMemSetAccess(ptr, allocated, &access, 1), "cuMemSetAccess", "cannot enable access to " + what,
               status)) {
        (void)cu.cuMemUnmap(ptr, allocated);
        (void)cu.cuMemAddressFree(ptr, allocated);
        (void)cu.cuMemRelease(handle);
        return out;
    }
    out.address = ptr;
    out.allocated = allocated;
    out.kind = GpuAllocation::vmm;
    out.vmm_handle = handle;
    return out;
}

#endif

} // namespace

GpuBuffer GpuBuffer::create_impl(std::size_t size, GpuBufferOptions options, Status& status) {
    GpuBuffer out;
    if (size == 0) {
        status.fail(errc::invalid_argument, "GpuBuffer", "a GpuBuffer needs at least one byte");
        return out;
    }
#if GPUVERBS_HAVE_CUDA
    const DriverApi* cu = detail::cuda::driver_api(status);
    if (cu == nullptr || !check_ordinal(*cu, options.gpu, "GpuBuffer", status)) return out;
    PrimaryContext context(*cu, options.gpu, status);
    if (!context) return out;
    CUdevice device = context.device();
    bool vmm_ok = device_attribute(*cu, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) != 0 &&
                  device_attribute(*cu, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device) != 0;
    GpuAllocation kind = options.allocation;
    if (kind == GpuAllocation::automatic) kind = vmm_ok ? GpuAllocation::vmm : GpuAllocation::device;
    if (kind == GpuAllocation::vmm && !vmm_ok) {
        status.fail(
            errc::unsupported, "cuMemCreate",
            gpu_name(options.gpu) +
                " does not support GPUDirect RDMA on VMM memory "
                "(CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED is 0): use GpuAllocation::device");
        return out;
    }
    Allocation a;
    {
        PrimaryContext::Scope scope(*cu, context.get());
        a = kind == GpuAllocation::vmm ? allocate_vmm(*cu, device, options.gpu, size, status)
                                       : allocate_device(*cu, options.gpu, size, status);
    }
    if (!status.ok()) return out;
    out.address_ = a.address;
    out.size_ = size;
    out.allocated_ = a.allocated;
    out.gpu_ = options.gpu;
    out.allocation_ = a.kind;
    out.vmm_handle_ = a.vmm_handle;
    out.context_ = context.release();
    out.device_ = device;
#else
    (void)options;
    (void)detail::cuda::driver_api(status);
#endif
    return out;
}

GpuBuffer::GpuBuffer(std::size_t size, GpuBufferOptions options)
    : GpuBuffer(detail::or_throw([&](Status& s) { return create_impl(size, options, s); })) {}

GpuBuffer GpuBuffer::create(std::size_t size, GpuBufferOptions options, std::error_code& ec) {
    return detail::or_code(ec, [&](Status& s) { return create_impl(size, options, s); });
}

GpuBuffer::GpuBuffer(GpuBuffer&& other) noexcept
    : address_(std::exchange(other.address_, 0)),
      size_(std::exchange(other.size_, 0)),
      allocated_(std::exchange(other.allocated_, 0)),
      gpu_(other.gpu_),
      allocation_(other.allocation_),
      vmm_handle_(std::exchange(other.vmm_handle_, 0)),
      context_(std::exchange(other.context_, nullptr)),
      device_(other.device_) {}

GpuBuffer& GpuBuffer::operator=(GpuBuffer&& other) noexcept {
    if (this != &other) {
        release();
        address_ = std::exchange(other.address_, 0);
        size_ = std::exchange(other.size_, 0);
        allocated_ = std::exchange(other.allocated_, 0);
        gpu_ = other.gpu_;
        allocation_ = other.allocation_;
        vmm_handle_ = std::exchange(other.vmm_handle_, 0);
        context_ = std::exchange(other.context_, nullptr);
        device_ = other.device_;
    }
    return *this;
}

GpuBuffer::~GpuBuffer() {
    release();
}

void GpuBuffer::release() noexcept {
    if (address_ == 0) return;
#if GPUVERBS_HAVE_CUDA
    // Errors are ignored: at process exit the driver may already be gone, and
    // the memory goes with the process.
    Status status;
    if (const DriverApi* cu = detail::cuda::driver_api(status)) {
        auto* context = static_cast<CUcontext>(context_);
        if (allocation_ == GpuAllocation::vmm) {
            (void)cu->cuMemUnmap(address_, allocated_);
            (void)cu->cuMemAddressFree(address_, allocated_);
            (void)cu->cuMemRelease(vmm_handle_);
        } else {
            PrimaryContext::Scope scope(*cu, context);
            (void)cu->cuMemFree(address_);
        }
        (void)cu->cuDevicePrimaryCtxRelease(device_);
    }
#endif
    address_ = 0;
    context_ = nullptr;
}

GpuMemory GpuBuffer::memory() const noexcept {
    GpuMemory m;
    m.address = address_;
    m.size = size_;
    m.gpu = gpu_;
    m.allocation_base = address_;
    m.allocation_size = allocated_;
    m.allocation = allocation_;
    m.gpu_direct_rdma_capable = address_ != 0;
    return m;
}

} // namespace gpuverbs
