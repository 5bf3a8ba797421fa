// MemoryRegion: memory the NIC may read and write (ibv_mr), and the two views
// of it the data path uses: LocalBuffer (a range of our own region, for work
// requests) and RemoteMemory (what a peer needs to read or write a region).
//
//   std::vector<std::byte> buf(1 << 20);
//   gpuverbs::MemoryRegion mr(pd, buf, gpuverbs::Access::local_write | gpuverbs::Access::remote_write);
//   qp.post_write(mr.slice(0, 4096), peer_memory);          // peer_memory: a RemoteMemory
//   send_to_peer(prepared.advertise(mr));                   // let the peer write here
//                                     // (mr.remote(), and the queue pair grants what mr allows)
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

namespace gpuverbs {

/// What the NIC may do with a region; combine with |.
enum class Access : unsigned {
    none = 0,
    local_write = IBV_ACCESS_LOCAL_WRITE,           ///< the NIC writes here for our receives and reads
    remote_write = IBV_ACCESS_REMOTE_WRITE,         ///< peers may RDMA-write here (needs local_write)
    remote_read = IBV_ACCESS_REMOTE_READ,           ///< peers may RDMA-read from here
    remote_atomic = IBV_ACCESS_REMOTE_ATOMIC,       ///< peers may run atomics here (needs local_write)
    relaxed_ordering = IBV_ACCESS_RELAXED_ORDERING, ///< allow PCIe relaxed ordering (faster; see docs)
};
constexpr Access operator|(Access a, Access b) noexcept {
    return static_cast<Access>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr Access operator&(Access a, Access b) noexcept {
    return static_cast<Access>(static_cast<unsigned>(a) & static_cast<unsigned>(b));
}
constexpr bool has(Access set, Access flag) noexcept {
    return (set & flag) == flag;
}
/// Everything a peer may do plus local write. Grant it only to peers that
/// need all of it: a buffer peers only read wants local_write | remote_read
/// (docs/security.md: register with the least access).
inline constexpr Access access_all =
    Access::local_write | Access::remote_write | Access::remote_read | Access::remote_atomic;

/// How a memory region was registered.
enum class Registration {
    host,    ///< ibv_reg_mr on host memory
    dmabuf,  ///< ibv_reg_dmabuf_mr on a dma-buf exported by the GPU driver
    peermem, ///< ibv_reg_mr on a GPU pointer, through nvidia_peermem
};
/// "host", "DMA-BUF" or "peermem".
std::string_view to_string(Registration registration) noexcept;

/// A range of one of our memory regions, as a work request uses it. Plain
/// value: it records the region's bounds, so a range outside them is caught
/// when posted (errc::local_range_outside_region). It does not keep the
/// region alive: post it only while its MemoryRegion lives (a buffer of a
/// destroyed region carries a stale lkey, which the NIC refuses, or which a
/// new region may have taken).
struct LocalBuffer {
    std::uint64_t address = 0;
    std::uint32_t length = 0;
    std::uint32_t lkey = 0;
    std::uint64_t region_begin = 0;
    std::uint64_t region_end = 0;

    /// Inside the region it was cut from (an empty buffer is always inside).
    [[nodiscard]] constexpr bool in_region() const noexcept {
        return address >= region_begin && address <= region_end && length <= region_end - address;
    }
};

/// What a peer needs to RDMA-read, -write or run atomics on a region: its
/// address (as the peer's work requests must name it), length and rkey.
/// RemoteMemory crosses the network; see wire.hpp for its serialized form.
struct RemoteMemory {
    std::uint64_t address = 0;
    std::uint64_t length = 0;
    std::uint32_t rkey = 0;

    /// Whether [offset, offset + size) lies inside this memory.
    [[nodiscard]] constexpr bool contains(std::uint64_t offset, std::uint64_t size) const noexcept {
        return offset <= length && size <= length - offset;
    }
    friend bool operator==(const RemoteMemory&, const RemoteMemory&) = default;
};

/// A range of a peer's memory: `length` bytes at `offset` in `memory` (the
/// remote side of a block-list transfer, transfer.hpp; wire.hpp serializes lists).
struct RemoteBlock {
    RemoteMemory memory;
    std::uint64_t offset = 0;
    std::uint64_t length = 0;
    friend bool operator==(const RemoteBlock&, const RemoteBlock&) = default;
};

class MemoryRegion;

namespace detail {

/// The registered ibv_mr; keeps its protection domain (and device) alive.
class MrCore {
public:
    MrCore(std::shared_ptr<PdCore> pd, ibv_mr* mr) noexcept : pd_(std::move(pd)), mr_(mr) {}
    MrCore(const MrCore&) = delete;
    MrCore& operator=(const MrCore&) = delete;
    ~MrCore() { (void)ibv_dereg_mr(mr_); }
    [[nodiscard]] ibv_mr* mr() const noexcept { return mr_; }

private:
    std::shared_ptr<PdCore> pd_;
    ibv_mr* mr_;
};

/// "; what to do" for an errno from ibv_reg_mr, given the access asked for.
std::string reg_mr_hint(int err, Access access);
/// The checks every registration makes first: a non-empty protection domain,
/// and local_write wherever remote_write or remote_atomic is asked for.
bool check_registration(const ProtectionDomain& pd, std::string_view what, Access access, std::string_view verb,
                        Status& status);

/// Wraps a registered ibv_mr (GPU registrations build theirs in gpu_direct).
MemoryRegion adopt_memory_region(const ProtectionDomain& pd, ibv_mr* mr, void* address, std::size_t length,
                                 std::uint64_t iova, Access access, Registration registration);

} // namespace detail

/// A registered memory region of host memory. Move-only; keeps its protection
/// domain alive. The memory itself stays the caller's: it must outlive the region.
class MemoryRegion {
public:
    MemoryRegion() noexcept = default;
    /// Registers `memory` with the given access (throws gpuverbs::Error, e.g.
    /// EFAULT when the range is not mapped, EINVAL for inconsistent access flags).
    MemoryRegion(const ProtectionDomain& pd, std::span<std::byte> memory, Access access);
    MemoryRegion(const ProtectionDomain& pd, void* address, std::size_t length, Access access);
    /// The error_code form: an empty MemoryRegion on failure.
    static MemoryRegion create(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                               std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    static MemoryRegion create(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                               std::error_code& ec, Diagnostics& diagnostics);

    MemoryRegion(MemoryRegion&&) noexcept = default;
    MemoryRegion& operator=(MemoryRegion&&) noexcept = default;
    MemoryRegion(const MemoryRegion&) = delete;
    MemoryRegion& operator=(const MemoryRegion&) = delete;
    ~MemoryRegion() = default;

    explicit operator bool() const noexcept { return core_ != nullptr; }
    [[nodiscard]] void* address() const noexcept { return address_; }
    [[nodiscard]] std::size_t length() const noexcept { return length_; }
    [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {static_cast<std::byte*>(address_), length_}; }
    [[nodiscard]] std::uint32_t lkey() const noexcept { return lkey_; }
    [[nodiscard]] std::uint32_t rkey() const noexcept { return rkey_; }
    [[nodiscard]] Access access() const noexcept { return access_; }
    /// The address peers and work requests use for byte 0 of the region:
    /// address() for host memory and peermem, the GPU address for DMA-BUF
    /// (where rdma-core leaves the dma-buf offset in ibv_mr::addr instead).
    [[nodiscard]] std::uint64_t iova() const noexcept { return iova_; }
    /// host, dmabuf or peermem.
    [[nodiscard]] Registration registration() const noexcept { return registration_; }

    /// [offset, offset + length) of this region for a work request. Not checked
    /// here: a range outside the region fails when posted, with nothing posted.
    /// A length above 2^32 - 1 (a request's length field) gives a buffer
    /// that is inside no region: posting it is refused with
    /// errc::local_range_outside_region, never cut to its low 32 bits.
    [[nodiscard]] LocalBuffer slice(std::size_t offset, std::size_t length) const noexcept {
        if (length > UINT32_MAX) return LocalBuffer{iova_ + offset, UINT32_MAX, lkey_, iova_, iova_};
        return LocalBuffer{iova_ + offset, static_cast<std::uint32_t>(length), lkey_, iova_, iova_ + length_};
    }
    /// The whole region.
    [[nodiscard]] LocalBuffer all() const noexcept { return slice(0, length_); }
    /// What a peer needs to access [offset, offset + length) of this region;
    /// the range is clamped to the region.
    [[nodiscard]] RemoteMemory remote(std::size_t offset = 0, std::size_t length = SIZE_MAX) const noexcept {
        offset = offset > length_ ? length_ : offset;
        length = length > length_ - offset ? length_ - offset : length;
        return RemoteMemory{iova_ + offset, length, rkey_};
    }

    [[nodiscard]] ibv_mr* native_handle() const noexcept { return core_ ? core_->mr() : nullptr; }

private:
    static MemoryRegion create_impl(const ProtectionDomain& pd, void* address, std::size_t length, Access access,
                                    detail::Status& status);

    friend MemoryRegion detail::adopt_memory_region(const ProtectionDomain&, ibv_mr*, void*, std::size_t, std::uint64_t,
                                                    Access, Registration);

    std::shared_ptr<detail::MrCore> core_;
    void* address_ = nullptr;
    std::size_t length_ = 0;
    std::uint64_t iova_ = 0;
    std::uint32_t lkey_ = 0;
    std::uint32_t rkey_ = 0;
    Access access_ = Access::none;
    Registration registration_ = Registration::host;
};

} // namespace gpuverbs
