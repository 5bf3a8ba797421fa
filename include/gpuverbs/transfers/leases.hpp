// Leases on advertised blocks: the memory a peer reads (or writes) cannot be
// reused under it without anyone noticing, and only that peer can end it.
//
// The owner (prefill, holding a request's KV blocks) grants a lease to one
// reader when it hands a block list out; the list carries the lease id, a
// time to live and a version (wire::LeasedBlockList, serialized by
// wire::serialize). The reader (decode) checks the list is not older than one
// it already had from that owner (LeaseReader), transfers with a deadline
// inside the lease, and releases the lease with the transfer's notification
// (TransferOptions::notify = the lease id; for a read it is posted after every
// block was read). The owner releases the lease when that notification's
// receive completes, naming the reader it arrived from (the peer behind the
// queue pair the receive was posted on), and reuses a block only when no live
// lease holds it:
//
//   // owner                                        // reader
//   auto list = leases.grant(blocks, peer);         auto list = wire::parse_leased_block_list(bytes);
//   send(wire::serialize(list));                    if (auto ec = reader.accept(owner_id, list)) refuse(ec);
//   ...receive on peer's queue pair, immediate i:   options.notify = list.lease;
//   leases.release(i, peer);                        options.deadline = LeaseReader::deadline(list, received_at);
//   if (!leases.held(block)) reuse(block);          async_transfer(qp, plan, options, ...);
//
// Least authority: a lease id is drawn from the system's random source (not
// 1, 2, 3…), and a release from any reader but the one it was granted to is
// refused (errc::lease_not_yours) and counted, so one reader's notification
// can never free the blocks another is still reading. held() and claim()
// compare address ranges, whatever rkey a block names.
//
// A reader that never releases (it crashed) holds the blocks until the lease
// expires: its time to live plus the owner's grace, which covers the list's
// trip to the reader and the reads still draining at the reader's deadline.
// A lease with regions of its own (LeaseScope::lease_regions) has them
// deregistered when it expires, on time, by a thread of the table's (started
// by the first such lease): its key reads nothing from then on, whether or
// not the owner calls the table again.
#pragma once

#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/verbs/memory_region.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace gpuverbs {

struct BlockLeasesOptions {
    /// What each lease tells its reader: how long it may use the blocks after receiving the list.
    std::chrono::milliseconds ttl{10000};
    /// How much longer the owner keeps an unreleased lease: the list's trip
    /// to the reader, and the requests still in flight when the reader's
    /// deadline stops its transfer (up to the transport's retry time).
    std::chrono::milliseconds grace{5000};
};

/// What a BlockLeases has done (statistics()): a refused release is a
/// reader trying to end a lease that is not its own — worth an alert.
struct BlockLeasesStatistics {
    std::uint64_t granted = 0;
    std::uint64_t released = 0;         ///< by the reader they were granted to
    std::uint64_t revoked = 0;          ///< by the owner (revoke())
    std::uint64_t expired = 0;          ///< past their time to live and grace, never released
    std::uint64_t refused_releases = 0; ///< releases named by another reader (errc::lease_not_yours)
    std::uint64_t unknown_releases = 0; ///< releases of no live lease (errc::lease_unknown)
};

/// The owner's side: which of its blocks are leased to which reader.
class BlockLeases {
public:
    /// How the owner knows a reader: a rank, a connection id — whatever the
    /// owner can tell from where a notification arrived (the queue pair its
    /// receive was posted on). Readers must have distinct ids.
    using Reader = std::uint64_t; // UINT64_MAX is BlockLeases::nobody

    /// Throws gpuverbs::Error (errc::invalid_argument) for a ttl that is not
    /// positive or a negative grace.
    explicit BlockLeases(BlockLeasesOptions options = {});
    BlockLeases(const BlockLeases&) = delete;
    BlockLeases& operator=(const BlockLeases&) = delete;
    /// Stops the expiry thread; the leases' regions are deregistered.
    ~BlockLeases();
    /// The same without throwing. A refused table grants nothing (grant
    /// fails with the same words) and holds no lease; not movable (it has a
    /// lock), it is returned in place: `BlockLeases leases = BlockLeases::create(options, ec);`.
    static BlockLeases create(BlockLeasesOptions options, std::error_code& ec) {
        return BlockLeases(options, detail::Outcome{&ec, nullptr});
    }
    static BlockLeases create(BlockLeasesOptions options, std::error_code& ec, Diagnostics& diagnostics) {
        return BlockLeases(options, detail::Outcome{&ec, &diagnostics});
    }
    /// False for a table create() refused.
    explicit operator bool() const noexcept { return refused_.empty(); }

    /// Leases `blocks` to `reader`: the list to send (a new version, and a
    /// lease id from the system's random source: never 0, never one live).
    /// Throws gpuverbs::Error (invalid_argument) for a list wire::serialize
    /// would refuse (empty, too long, a block outside its region).
    LeasedBlockList grant(std::vector<RemoteBlock> blocks, Reader reader);
    /// The same without throwing: on failure `ec` is set, nothing is leased
    /// and the list returned is empty.
    LeasedBlockList grant(std::vector<RemoteBlock> blocks, Reader reader, std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    LeasedBlockList grant(std::vector<RemoteBlock> blocks, Reader reader, std::error_code& ec,
                          Diagnostics& diagnostics);
    /// … through regions of this lease alone (LeaseScope::lease_regions):
    /// each run of contiguous blocks is registered anew in `pd` with
    /// `access` (Access::remote_read for a reader that reads them;
    /// local_write | remote_write for one that writes), and the list names
    /// those regions instead of the blocks' own. The reader can reach exactly
    /// the leased bytes — a request outside them fails at its NIC with a
    /// remote access error — and nothing once the lease ends (released,
    /// revoked or expired: its regions are deregistered, so a late request
    /// fails the same way). Costs one registration per run on the set-up
    /// path. The memory must be host memory, or GPU memory that ibv_reg_mr
    /// takes (nvidia-peermem); otherwise the registration's error is thrown
    /// (a DMA-BUF-only GPU: one region per tenant instead, docs/security.md)
    /// and nothing is leased.
    LeasedBlockList grant(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain& pd, Access access);
    /// The same without throwing: on failure `ec` is set, nothing is leased
    /// (no region stays registered) and the list returned is empty.
    LeasedBlockList grant(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain& pd, Access access,
                          std::error_code& ec);
    /// … with the words of the failure in `diagnostics` (cleared on success).
    LeasedBlockList grant(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain& pd, Access access,
                          std::error_code& ec, Diagnostics& diagnostics);
    /// `reader` is done (its notification carried `lease`): no error, and the
    /// blocks are free of it; errc::lease_not_yours when the lease is another
    /// reader's (refused, counted, the lease stays); errc::lease_unknown when
    /// no such lease is live (released already, expired, or never granted).
    std::error_code release(std::uint32_t lease, Reader reader);
    /// The owner ends a lease itself (the reader is gone, the request was
    /// cancelled). False when no such lease is live.
    bool revoke(std::uint32_t lease);
    /// Whether a live lease holds any byte of `block` (by address range,
    /// whatever its rkey). A block that does not lie inside its region, or
    /// whose range wraps, counts as held: nothing proves it free.
    [[nodiscard]] bool held(const RemoteBlock& block);
    /// The owner is about to reuse `blocks`: errc::blocks_leased when a live
    /// lease holds any of them; errc::invalid_argument for a block that does
    /// not lie inside its region; otherwise no error. (Its answer is the
    /// error_code: there is no throwing form.)
    std::error_code claim(std::span<const RemoteBlock> blocks);
    /// … with the words in `diagnostics`: the first block held, the lease and
    /// how long it may still last (cleared when the blocks are free).
    std::error_code claim(std::span<const RemoteBlock> blocks, Diagnostics& diagnostics);
    /// 0.3's form: the detail's words in `*why`.
    [[deprecated("claim(blocks, diagnostics): Diagnostics::detail() has these words")]] std::error_code claim(
        std::span<const RemoteBlock> blocks, std::string* why);
    /// Live leases (expired ones are dropped first).
    [[nodiscard]] std::size_t active();
    /// Drops the leases past their time to live and grace; returns their ids
    /// (the readers that never released: worth a log line).
    std::vector<std::uint32_t> expire();
    [[nodiscard]] BlockLeasesStatistics statistics();

    /// The reader of the deprecated grant(blocks): no reader can release
    /// such a lease (only revoke, or the deprecated release, ends it).
    static constexpr Reader nobody = UINT64_MAX;
    /// Before 0.3 a lease belonged to nobody and anyone could release it.
    [[deprecated("grant(blocks, reader): a lease belongs to the reader it is granted to")]] LeasedBlockList grant(
        std::vector<RemoteBlock> blocks) {
        return grant(std::move(blocks), nobody);
    }
    /// The owner's release, as before 0.3. Note that release(lease, reader)
    /// returns an error_code: true there means refused.
    [[deprecated("release(lease, reader) for the reader's notification, or revoke(lease) for the owner")]] bool release(
        std::uint32_t lease) {
        return revoke(lease);
    }

private:
    BlockLeases(BlockLeasesOptions options, detail::Outcome outcome);
    /// The answer; the words only where `words` is given (the plain form builds none).
    std::error_code claim_impl(std::span<const RemoteBlock> blocks, detail::Status* words);
    /// Either grant: `pd` null leases the blocks' own regions.
    LeasedBlockList grant_impl(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain* pd,
                               Access access, detail::Status& status);
    struct Lease {
        std::vector<RemoteBlock> blocks; ///< as the owner named them (held() compares these)
        std::chrono::steady_clock::time_point until;
        std::uint64_t version = 0;
        Reader reader = 0;
        std::vector<MemoryRegion> regions; ///< LeaseScope::lease_regions: deregistered when the lease ends
    };
    LeasedBlockList record_lease(std::vector<RemoteBlock> blocks, std::vector<RemoteBlock> named, Reader reader,
                                 std::vector<MemoryRegion> regions, LeaseScope scope);
    /// The live lease holding a byte of [first, end), or nullptr (under the lock).
    const std::pair<const std::uint32_t, Lease>* holder(std::uint64_t first, std::uint64_t end) const;
    void expire_locked(std::chrono::steady_clock::time_point now, std::vector<std::uint32_t>* ids);
    std::uint32_t new_id_locked();
    /// The expiry thread: deregisters each lease's own regions when it expires.
    void expire_on_time();

    std::mutex mutex_;
    std::condition_variable expiry_changed_; ///< a lease with regions was recorded, or the table is going
    bool stopping_ = false;
    std::thread expiry_;                    ///< started by the first lease with regions of its own
    std::vector<std::uint32_t> unreported_; ///< leases the expiry thread dropped, for the next expire()
    BlockLeasesOptions options_;
    std::string refused_; ///< why create() refused the options (grant says it again); empty when usable
    std::uint64_t version_ = 0;
    std::unordered_map<std::uint32_t, Lease> leases_;
    BlockLeasesStatistics statistics_;
};

/// The reader's side: refuses a list older than one already accepted from
/// the same owner, and one whose lease has run out.
class LeaseReader {
public:
    /// `owner`: how the reader tells owners apart (a rank, a connection id).
    /// errc::stale_block_list when an accepted list from `owner` had a higher
    /// or equal version; otherwise the list's version becomes the newest.
    /// (Its answer is the error_code: there is no throwing form.)
    std::error_code accept(std::uint64_t owner, const LeasedBlockList& list);
    /// … with the words in `diagnostics` (both versions and the owner).
    std::error_code accept(std::uint64_t owner, const LeasedBlockList& list, Diagnostics& diagnostics);
    /// 0.3's form: the detail's words in `*why`.
    [[deprecated("accept(owner, list, diagnostics): Diagnostics::detail() has these words")]] std::error_code accept(
        std::uint64_t owner, const LeasedBlockList& list, std::string* why);
    /// The latest a transfer under this lease may end (TransferOptions::deadline):
    /// `received` (when the list arrived) plus its time to live.
    static std::chrono::steady_clock::time_point deadline(const LeasedBlockList& list,
                                                          std::chrono::steady_clock::time_point received) {
        return received + list.ttl;
    }

private:
    /// The answer; the words only where `words` is given (the plain form builds none).
    std::error_code accept_impl(std::uint64_t owner, const LeasedBlockList& list, detail::Status* words);
    std::mutex mutex_;
    std::unordered_map<std::uint64_t, std::uint64_t> newest_;
};

} // namespace gpuverbs
