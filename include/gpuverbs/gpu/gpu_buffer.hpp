// GPU memory for RDMA: GpuBuffer owns device memory allocated the way
// GPUDirect RDMA wants it; GpuMemory names a range of device memory anyone
// allocated (a cudaMalloc pointer, a PyTorch tensor, an interior pointer).
//
//   gpuverbs::GpuBuffer buffer(1 << 20);                  // GPU 0, the best allocation for RDMA
//   buffer.copy_from_host(std::as_bytes(std::span(input)));
//   auto mr = gpuverbs::register_gpu_memory(pd, buffer, gpuverbs::access_all);   // gpu_direct.hpp
//
//   auto tensor = gpuverbs::GpuMemory::from_pointer(ptr, bytes);   // memory someone else owns
//
// libcuda is loaded on first use: without an NVIDIA driver these calls fail
// with errc::no_gpu_driver and the loader's reason; nothing else is affected.
// Device addresses are CUdeviceptr values, carried as std::uint64_t so that
// users of this header do not need cuda.h.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/gpu/gpu.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

namespace gpuverbs {

/// How a GpuBuffer's memory is allocated.
enum class GpuAllocation {
    automatic, ///< vmm where the GPU supports GPUDirect RDMA on VMM memory, else device
    device,    ///< cuMemAlloc, rounded up to 64 KiB GPU pages, with CU_POINTER_ATTRIBUTE_SYNC_MEMOPS set
    vmm,       ///< cuMemCreate with gpuDirectRDMACapable=1, rounded up to the allocation granularity
};
/// "automatic", "device" or "vmm".
std::string_view to_string(GpuAllocation allocation) noexcept;

/// A range of GPU device memory, not owned: the allocation it lies in, and
/// the GPU that holds it. A plain value; the memory must outlive its uses.
struct GpuMemory {
    std::uint64_t address = 0;                        ///< device address (CUdeviceptr) of the first byte
    std::size_t size = 0;                             ///< bytes
    int gpu = 0;                                      ///< CUDA device ordinal
    std::uint64_t allocation_base = 0;                ///< start of the allocation the range lies in
    std::size_t allocation_size = 0;                  ///< size of that allocation
    GpuAllocation allocation = GpuAllocation::device; ///< device (cuMemAlloc-like) or vmm
    bool gpu_direct_rdma_capable = false;             ///< CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
    /// CU_POINTER_ATTRIBUTE_BUFFER_ID: unique per allocation for the process's
    /// life, so a new allocation at a freed one's address has another id (0 when the driver cannot say).
    std::uint64_t buffer_id = 0;

    /// Describes `size` bytes at device pointer `address`: finds the
    /// allocation with cuMemGetAddressRange and the GPU that holds it. Fails
    /// with errc::not_gpu_memory for host, managed or unmapped memory, and
    /// errc::invalid_argument when the range runs past its allocation.
    static GpuMemory from_pointer(const void* address, std::size_t size);
    static GpuMemory from_pointer(const void* address, std::size_t size, std::error_code& ec);
    static GpuMemory from_address(std::uint64_t address, std::size_t size);
    static GpuMemory from_address(std::uint64_t address, std::size_t size, std::error_code& ec);

    /// A sub-range [offset, offset + size) of this one (clamped to it).
    [[nodiscard]] GpuMemory slice(std::size_t offset, std::size_t size) const noexcept;
    /// Where the range starts inside its allocation.
    [[nodiscard]] std::size_t offset_in_allocation() const noexcept {
        return static_cast<std::size_t>(address - allocation_base);
    }
    [[nodiscard]] void* pointer() const noexcept {
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)); // NOLINT(performance-no-int-to-ptr)
    }
};

/// Host <-> GPU copies (synchronous; cuMemcpyHtoD / cuMemcpyDtoH), for users
/// and tests. `host` and the range [offset, offset + host.size()) must fit in
/// `gpu` (errc::invalid_argument otherwise; nothing is copied).
void copy_to_gpu(const GpuMemory& gpu, std::size_t offset, std::span<const std::byte> host);
void copy_to_gpu(const GpuMemory& gpu, std::size_t offset, std::span<const std::byte> host, std::error_code& ec);
void copy_from_gpu(const GpuMemory& gpu, std::size_t offset, std::span<std::byte> host);
void copy_from_gpu(const GpuMemory& gpu, std::size_t offset, std::span<std::byte> host, std::error_code& ec);
/// Sets `size` bytes from `offset` to `value` (cuMemsetD8, synchronous).
void fill_gpu(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value);
void fill_gpu(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value, std::error_code& ec);
void fill_gpu(const GpuMemory& gpu, std::size_t offset, std::size_t size, std::byte value, std::error_code& ec,
              Diagnostics& diagnostics);

/// Lower-case PCI bus id of CUDA device `gpu`, e.g. "0000:00:06.0".
std::string gpu_pci_bus_id(int gpu);
/// The same without throwing: "" with `ec` (and the words) set on failure.
std::string gpu_pci_bus_id(int gpu, std::error_code& ec);
std::string gpu_pci_bus_id(int gpu, std::error_code& ec, Diagnostics& diagnostics);

struct GpuBufferOptions {
    int gpu = 0; ///< CUDA device ordinal
    GpuAllocation allocation = GpuAllocation::automatic;
};

/// Device memory on one GPU, allocated for GPUDirect RDMA. Move-only; frees
/// the memory (and releases the GPU's primary context) when destroyed.
/// Destruction never throws. The memory is not initialised.
class GpuBuffer {
public:
    GpuBuffer() noexcept = default;
    /// Allocates at least `size` bytes (size > 0) on options.gpu (throws gpuverbs::Error).
    explicit GpuBuffer(std::size_t size, GpuBufferOptions options = {});
    /// The error_code form: an empty GpuBuffer on failure.
    static GpuBuffer create(std::size_t size, GpuBufferOptions options, std::error_code& ec);

    GpuBuffer(GpuBuffer&& other) noexcept;
    GpuBuffer& operator=(GpuBuffer&& other) noexcept;
    GpuBuffer(const GpuBuffer&) = delete;
    GpuBuffer& operator=(const GpuBuffer&) = delete;
    ~GpuBuffer();

    /// False for an empty (default, moved-from or failed) buffer.
    explicit operator bool() const noexcept { return address_ != 0; }
    /// The device address (CUdeviceptr) of the first byte.
    [[nodiscard]] std::uint64_t address() const noexcept { return address_; }
    /// The same address as a pointer, for CUDA runtime calls and kernels.
    [[nodiscard]] void* pointer() const noexcept { return memory().pointer(); }
    /// The size asked for.
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    /// The size allocated (rounded up to 64 KiB pages or the VMM granularity).
    [[nodiscard]] std::size_t allocated_size() const noexcept { return allocated_; }
    /// The CUDA device ordinal the memory is on.
    [[nodiscard]] int gpu() const noexcept { return gpu_; }
    /// device or vmm: what `automatic` chose.
    [[nodiscard]] GpuAllocation allocation() const noexcept { return allocation_; }
    /// The GPU's lower-case PCI bus id, to match against NICs (see gpuverbs-doctor).
    [[nodiscard]] std::string pci_bus_id() const { return gpu_pci_bus_id(gpu_); }

    /// The first size() bytes, as a GpuMemory.
    [[nodiscard]] GpuMemory memory() const noexcept;
    // NOLINTNEXTLINE(google-explicit-constructor): a GpuBuffer is usable wherever GPU memory is asked for.
    operator GpuMemory() const noexcept { return memory(); }

    /// Synchronous copies and fill (see copy_to_gpu); ranges outside size() throw errc::invalid_argument.
    void copy_from_host(std::span<const std::byte> host, std::size_t offset = 0) const {
        copy_to_gpu(memory(), offset, host);
    }
    void copy_to_host(std::span<std::byte> host, std::size_t offset = 0) const {
        copy_from_gpu(memory(), offset, host);
    }
    void fill(std::byte value) const { fill_gpu(memory(), 0, size_, value); }

private:
    static GpuBuffer create_impl(std::size_t size, GpuBufferOptions options, detail::Status& status);
    void release() noexcept;

    std::uint64_t address_ = 0;
    std::size_t size_ = 0;
    std::size_t allocated_ = 0;
    int gpu_ = 0;
    GpuAllocation allocation_ = GpuAllocation::device;
    std::uint64_t vmm_handle_ = 0; ///< CUmemGenericAllocationHandle for vmm
    void* context_ = nullptr;      ///< the retained primary context (CUcontext)
    int device_ = 0;               ///< CUdevice, to release the primary context
};

} // namespace gpuverbs
