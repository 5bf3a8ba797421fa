// A KV cache registered once and named by block ids: what a serving engine's
// connector moves between a prefill and a decode engine.
//
//   // prefill: one tensor per layer, [2, blocks, block_size, heads, head_dim]
//   gpuverbs::KvLayout layout = gpuverbs::KvLayout::per_layer(32, 16384, 16384);
//   gpuverbs::KvPool pool(layout, std::move(regions));      // one MemoryRegion per tensor
//   side_channel.send(pool.describe());                     // bytes: the engine carries them
//
//   // decode: load the peer's bytes once, then plan by block id
//   gpuverbs::RemoteKvPool theirs = gpuverbs::RemoteKvPool::load(bytes);
//   gpuverbs::TransferPlan plan = pool.plan(gpuverbs::TransferDirection::read, my_ids, theirs, their_ids);
//   gpuverbs::async_transfer(qp, plan, options, handler);
//
// On several NICs (rails), each registers the same tensors in its own
// protection domain: pool.add_rail(regions_on_nic1). describe() then carries
// every rail's keys; a plan names rail 0's, and pool.rail(k, qp_k, theirs)
// gives the transfer rail k with our and the peer's rail-k keys in their place:
//
//   std::array rails{pool.rail(0, qp0, theirs), pool.rail(1, qp1, theirs)};
//   gpuverbs::async_transfer(rails, plan, options, handler);   // striped, failing over
//
// A layout says where block b of half h (K or V) of layer l lies: in tensor
// tensor_of(l), at l' * layer_stride + h * half_stride + b * block_stride
// (l' is l for one tensor of all layers, 0 for a tensor per layer). The
// common layouts have names; any other is given by its strides. Planning
// walks the ids once per layer and half, by stride, straight into the
// plan's requests (no list), coalescing the runs that are contiguous in
// both pools. The caller builds no list and no object per block.
// No Asio here (transfer.hpp moves a plan).
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/transfers/transfer_options.hpp"
#include "gpuverbs/transfers/transfer_plan.hpp"
#include "gpuverbs/verbs/memory_region.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

class ProtectionDomain;

struct KvLayout {
    std::uint32_t layers = 0;
    /// Blocks per layer: the ids are 0 to blocks - 1.
    std::uint32_t blocks = 0;
    /// 2 (K and V) or 1 (one tensor per block, e.g. MLA's latent cache).
    std::uint32_t halves = 2;
    /// One block of one half of one layer: block_size x heads x head_dim x the element size.
    std::uint64_t block_bytes = 0;
    std::uint64_t block_stride = 0;
    std::uint64_t half_stride = 0;
    /// 0: a tensor per layer; otherwise the distance between layers in one tensor.
    std::uint64_t layer_stride = 0;

    /// A tensor per layer shaped [halves, blocks, block_size, heads, head_dim] (vLLM's FlashAttention layout).
    static KvLayout per_layer(std::uint32_t layers, std::uint32_t blocks, std::uint64_t block_bytes,
                              std::uint32_t halves = 2) noexcept;
    /// A tensor per layer shaped [blocks, halves, block_size, heads, head_dim] (FlashInfer's layout).
    static KvLayout blocks_first(std::uint32_t layers, std::uint32_t blocks, std::uint64_t block_bytes,
                                 std::uint32_t halves = 2) noexcept;
    /// One tensor for every layer shaped [layers, halves, blocks, block_size, heads, head_dim].
    static KvLayout one_tensor(std::uint32_t layers, std::uint32_t blocks, std::uint64_t block_bytes,
                               std::uint32_t halves = 2) noexcept;

    /// How many tensors (memory regions) hold the cache.
    [[nodiscard]] std::uint32_t tensors() const noexcept { return layer_stride == 0 ? layers : 1; }
    /// The tensor that holds `layer`.
    [[nodiscard]] std::uint32_t tensor_of(std::uint32_t layer) const noexcept { return layer_stride == 0 ? layer : 0; }
    /// Where block `block` of half `half` of `layer` starts inside its tensor.
    [[nodiscard]] std::uint64_t offset(std::uint32_t layer, std::uint32_t half, std::uint32_t block) const noexcept {
        return (layer_stride == 0 ? 0 : layer * layer_stride) + half * half_stride + block * block_stride;
    }
    /// The bytes each tensor must span from its first byte (the last block's end).
    [[nodiscard]] std::uint64_t tensor_bytes() const noexcept;
    /// Empty for a usable layout; otherwise what is wrong, in words: a count
    /// of 0, a block above 4 GiB - 1 (a request's length), blocks or halves
    /// that overlap, a tensor above 2^63 bytes.
    [[nodiscard]] std::string problem() const;

    friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

/// The layers a transfer moves: [first, first + count); the default is every layer.
struct LayerRange {
    std::uint32_t first = 0;
    std::uint32_t count = UINT32_MAX; ///< UINT32_MAX: to the last layer
};

/// A peer's pool as its describe() bytes say: its layout and, per tensor,
/// what the peer's NIC needs (address, length, rkey). Load it once per peer
/// (and again when the peer's pool changes: a new id).
class RemoteKvPool {
public:
    RemoteKvPool() = default;
    /// Checks and reads a pool's metadata: throws gpuverbs::Error
    /// (errc::malformed_record naming the field, errc::unsupported_version
    /// naming both versions) and never reads past the bytes.
    static RemoteKvPool load(std::span<const std::byte> metadata);
    static RemoteKvPool load(std::span<const std::byte> metadata, std::error_code& ec);
    static RemoteKvPool load(std::span<const std::byte> metadata, std::error_code& ec, Diagnostics& diagnostics);

    /// False when empty (default, or a load that failed).
    explicit operator bool() const noexcept { return !tensors_.empty(); }
    [[nodiscard]] const KvLayout& layout() const noexcept { return layout_; }
    /// One per tensor, in layer order.
    [[nodiscard]] std::span<const RemoteMemory> tensors() const noexcept { return tensors(0); }
    /// The rails (NICs) the owner registered its pool on: 1 or more (0 when empty).
    [[nodiscard]] std::size_t rails() const noexcept { return rails_; }
    /// Each tensor as rail `rail` reaches it (its rkey there); empty past rails().
    [[nodiscard]] std::span<const RemoteMemory> tensors(std::size_t rail) const noexcept {
        if (rail >= rails_) return {};
        return std::span(tensors_).subspan(rail * layout_.tensors(), layout_.tensors());
    }
    /// The owner pool's id: random per KvPool, so a restarted peer's pool differs.
    [[nodiscard]] std::uint64_t pool_id() const noexcept { return pool_id_; }
    /// When the owner made its pool (nanoseconds since the epoch, its wall clock).
    [[nodiscard]] std::uint64_t made_ns() const noexcept { return made_ns_; }
    /// The lease terms the owner announced: how long a reader may use blocks
    /// it was handed (zero: none announced). Read within it (a transfer's deadline).
    [[nodiscard]] std::chrono::milliseconds lease_ttl() const noexcept { return lease_ttl_; }

    /// … refusing a record not newer than `previous`, the one already loaded
    /// from this peer (errc::stale_metadata, naming both pools and when each
    /// was made): a record of the pool the peer had before it made it again
    /// (restarted, re-registered). An empty `previous` refuses nothing.
    /// "Newer" is by the owner's wall clock: one stepped back across a
    /// restart makes a genuine new pool look stale (load it without
    /// `previous` once you know the peer restarted).
    static RemoteKvPool load(std::span<const std::byte> metadata, const RemoteKvPool& previous);
    static RemoteKvPool load(std::span<const std::byte> metadata, const RemoteKvPool& previous, std::error_code& ec);
    static RemoteKvPool load(std::span<const std::byte> metadata, const RemoteKvPool& previous, std::error_code& ec,
                             Diagnostics& diagnostics);

private:
    friend class KvPool;
    static RemoteKvPool load_impl(std::span<const std::byte> metadata, detail::Status& status);
    static RemoteKvPool load_newer_impl(std::span<const std::byte> metadata, const RemoteKvPool& previous,
                                        detail::Status& status);
    KvLayout layout_;
    std::vector<RemoteMemory> tensors_; ///< rail by rail: rails_ x layout_.tensors()
    std::size_t rails_ = 0;
    std::uint64_t pool_id_ = 0;
    std::uint64_t made_ns_ = 0;
    std::chrono::milliseconds lease_ttl_{0};
};

namespace detail {
/// The metadata record of a pool with this layout, id and tensors (what
/// KvPool::describe returns; tests make records with it). `tensors` lists
/// rail 0's tensors, then rail 1's…, `rails` x layout.tensors() in all (the
/// address and length are rail 0's; each rail adds its rkey). Nothing is checked.
std::vector<std::byte> kv_pool_record(const KvLayout& layout, std::uint64_t pool_id,
                                      std::span<const RemoteMemory> tensors, std::uint64_t made_ns = 0,
                                      std::chrono::milliseconds lease_ttl = {}, std::size_t rails = 1);
} // namespace detail

/// Our pool: a layout over registered memory, one MemoryRegion per tensor.
class KvPool {
public:
    KvPool() = default;
    /// `regions[t]` holds tensor t from its first byte (layout.tensors() of
    /// them, each at least layout.tensor_bytes() long). Register GPU tensors
    /// with register_gpu_memory, host ones with MemoryRegion, each once.
    /// Throws gpuverbs::Error (errc::invalid_argument) naming the problem.
    KvPool(KvLayout layout, std::vector<MemoryRegion> regions);
    static KvPool create(KvLayout layout, std::vector<MemoryRegion> regions, std::error_code& ec);
    static KvPool create(KvLayout layout, std::vector<MemoryRegion> regions, std::error_code& ec,
                         Diagnostics& diagnostics);
    /// … over regions registered and kept alive elsewhere (the Python
    /// package's regions): the pool only refers to them, and they must outlive
    /// it. Each must start at its tensor's first byte (not a larger covering
    /// registration, such as a RegistrationCache may return).
    KvPool(KvLayout layout, std::span<const MemoryRegion* const> regions);
    static KvPool create(KvLayout layout, std::span<const MemoryRegion* const> regions, std::error_code& ec);
    static KvPool create(KvLayout layout, std::span<const MemoryRegion* const> regions, std::error_code& ec,
                         Diagnostics& diagnostics);

    /// False when empty (default, moved from, or a create() that failed).
    explicit operator bool() const noexcept { return !regions_.empty(); }
    [[nodiscard]] const KvLayout& layout() const noexcept { return layout_; }
    /// The region of each tensor, in layer order (rail 0's).
    [[nodiscard]] std::span<const MemoryRegion* const> regions() const noexcept {
        return std::span(regions_).first(std::min(regions_.size(), std::size_t{layout_.tensors()}));
    }
    /// The rails the pool is registered on (0 when empty; 1 + add_rail calls).
    [[nodiscard]] std::size_t rails() const noexcept {
        const std::size_t per_rail = layout_.tensors(); // never 0 once created; said so for the analyzer too
        return regions_.empty() || per_rail == 0 ? 0 : regions_.size() / per_rail;
    }
    /// Rail `rail`'s region of each tensor; empty past rails().
    [[nodiscard]] std::span<const MemoryRegion* const> regions(std::size_t rail) const noexcept {
        if (rail >= rails()) return {};
        return std::span(regions_).subspan(rail * layout_.tensors(), layout_.tensors());
    }

    /// Another rail (NIC): `regions[t]` is tensor t registered in that NIC's
    /// protection domain, over the same bytes as rail 0's region (same
    /// address, at least the tensor's length). Returns the rail's index.
    /// Throws gpuverbs::Error (errc::invalid_argument) naming the region that
    /// does not match, or a pool that has 16 rails already; nothing changes then.
    std::size_t add_rail(std::vector<MemoryRegion> regions);
    std::size_t add_rail(std::vector<MemoryRegion> regions, std::error_code& ec);
    std::size_t add_rail(std::vector<MemoryRegion> regions, std::error_code& ec, Diagnostics& diagnostics);
    /// … over regions kept alive elsewhere (they must outlive the pool).
    std::size_t add_rail(std::span<const MemoryRegion* const> regions);
    std::size_t add_rail(std::span<const MemoryRegion* const> regions, std::error_code& ec);
    std::size_t add_rail(std::span<const MemoryRegion* const> regions, std::error_code& ec, Diagnostics& diagnostics);
    /// Our blocks `ids`, both halves of each layer in `layers`, as a peer
    /// addresses them (rail 0's keys): one RemoteBlock per id, half and layer,
    /// layer by layer. What BlockLeases::grant leases to the reader of a
    /// request's blocks (BlockLeases::claim checks them before reuse).
    /// Throws gpuverbs::Error (errc::invalid_argument) naming an id outside
    /// the pool or layers outside it.
    [[nodiscard]] std::vector<RemoteBlock> remote_blocks(std::span<const std::uint32_t> ids,
                                                         LayerRange layers = {}) const;
    [[nodiscard]] std::vector<RemoteBlock> remote_blocks(std::span<const std::uint32_t> ids, LayerRange layers,
                                                         std::error_code& ec) const;
    /// Most rails a pool (and its metadata) carries.
    static constexpr std::size_t max_rails = 16;

    /// Rail `rail` of a transfer whose plan came from plan(): `qp` (on that
    /// rail's NIC) with our rail-`rail` lkeys and the peer's rail-`rail`
    /// rkeys in place of the rail-0 keys the plan names. Throws
    /// gpuverbs::Error (errc::invalid_argument) when either pool has no such
    /// rail, or `remote` is empty.
    [[nodiscard]] TransferRail rail(std::size_t rail, QueuePair& qp, const RemoteKvPool& remote) const;
    [[nodiscard]] TransferRail rail(std::size_t rail, QueuePair& qp, const RemoteKvPool& remote,
                                    std::error_code& ec) const;
    [[nodiscard]] std::uint64_t pool_id() const noexcept { return pool_id_; }
    /// When it was made (nanoseconds since the epoch): a pool made again is newer.
    [[nodiscard]] std::uint64_t made_ns() const noexcept { return made_ns_; }

    /// The metadata a peer loads (RemoteKvPool::load): a versioned, checksummed
    /// record of the layout, the pool's id, when it was made, the lease terms
    /// (`lease_ttl`: how long a reader may use blocks it is handed; zero:
    /// none) and each tensor's address, length and rkey on every rail:
    /// 88 + tensors x (16 + 4 x rails) bytes (728 for 32 layers on one rail),
    /// whatever the number of blocks. Empty for an empty pool.
    [[nodiscard]] std::vector<std::byte> describe(std::chrono::milliseconds lease_ttl = {}) const;

    /// Plans moving block local_ids[i] of ours and remote_ids[i] of `remote`
    /// (write: ours to theirs; read: theirs to ours), both halves of every
    /// layer in `layers`, in one pass. Refused (errc::invalid_argument,
    /// naming the index and the id) when the lists differ in length or are
    /// empty, an id is outside its pool, the layers are outside either pool,
    /// or the two layouts' blocks differ in size or halves.
    [[nodiscard]] TransferPlan plan(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                                    const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids,
                                    LayerRange layers = {}, const TransferLimits& limits = {}) const;
    [[nodiscard]] TransferPlan plan(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                                    const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids,
                                    LayerRange layers, const TransferLimits& limits, std::error_code& ec) const;
    [[nodiscard]] TransferPlan plan(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                                    const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids,
                                    LayerRange layers, const TransferLimits& limits, std::error_code& ec,
                                    Diagnostics& diagnostics) const;

private:
    static KvPool create_impl(KvLayout layout, std::vector<MemoryRegion> owned,
                              std::vector<const MemoryRegion*> regions, detail::Status& status);
    static KvPool create_owning(KvLayout layout, std::vector<MemoryRegion> owned, detail::Status& status);
    std::size_t add_rail_impl(std::vector<MemoryRegion> owned, std::vector<const MemoryRegion*> regions,
                              detail::Status& status);
    TransferRail rail_impl(std::size_t rail, QueuePair& qp, const RemoteKvPool& remote, detail::Status& status) const;
    std::vector<RemoteBlock> remote_blocks_impl(std::span<const std::uint32_t> ids, LayerRange layers,
                                                detail::Status& status) const;
    TransferPlan plan_impl(TransferDirection direction, std::span<const std::uint32_t> local_ids,
                           const RemoteKvPool& remote, std::span<const std::uint32_t> remote_ids, LayerRange layers,
                           const TransferLimits& limits, detail::Status& status) const;
    KvLayout layout_;
    /// Per rail, the regions the pool owns (empty for regions kept elsewhere);
    /// regions_ points into the inner buffers, which moving the outer keeps.
    std::vector<std::vector<MemoryRegion>> owned_;
    std::vector<const MemoryRegion*> regions_; ///< rail by rail, one per tensor
    std::uint64_t pool_id_ = 0;
    std::uint64_t made_ns_ = 0;
};

} // namespace gpuverbs
