// Leases on advertised blocks: the memory a peer reads (or writes) cannot be
// reused under it without anyone noticing.
//
// The owner (prefill, holding a request's KV blocks) grants a lease when it
// hands a block list out; the list carries the lease id, a time to live and a
// version (wire::LeasedBlockList, serialized by wire::serialize). The reader
// (decode) checks the list is not older than one it already had from that
// owner (LeaseReader), transfers with a deadline inside the lease, and
// releases the lease with the transfer's notification (TransferOptions::notify
// = the lease id; for a read it is posted after every block was read). The
// owner releases the lease when that notification's receive completes, and
// reuses a block only when no live lease holds it:
//
//   // owner                                        // reader
//   auto list = leases.grant(blocks);               auto list = wire::parse_leased_block_list(bytes);
//   send(wire::serialize(list));                    if (auto ec = reader.accept(owner_id, list)) refuse(ec);
//   ...receive completes with immediate i:          options.notify = list.lease;
//   leases.release(i);                              options.deadline = LeaseReader::deadline(list, received_at);
//   if (!leases.held(block)) reuse(block);          async_transfer(qp, plan, options, ...);
//
// A reader that never releases (it crashed) holds the blocks until the lease
// expires: its time to live plus the owner's grace, which covers the list's
// trip to the reader and the reads still draining at the reader's deadline.
#pragma once

#include "gpuverbs/connections/wire.hpp"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
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

/// The owner's side: which of its blocks are leased to readers.
class BlockLeases {
public:
    explicit BlockLeases(BlockLeasesOptions options = {});

    /// Leases `blocks` to one reader: the list to send (a new version and
    /// lease id; ids are never 0). Throws gpuverbs::Error (invalid_argument)
    /// for a list wire::serialize would refuse.
    LeasedBlockList grant(std::vector<RemoteBlock> blocks);
    /// The reader is done (its notification carried `lease`). False when no
    /// such lease is live (released already, expired, or never granted).
    bool release(std::uint32_t lease);
    /// Whether a live lease holds any byte of `block` (the same region, by its rkey and address).
    [[nodiscard]] bool held(const RemoteBlock& block);
    /// The owner is about to reuse `blocks`: errc::blocks_leased when a live
    /// lease holds any of them, with `why` naming the first block, the lease
    /// and how long it may still last; otherwise no error.
    std::error_code claim(std::span<const RemoteBlock> blocks, std::string* why = nullptr);
    /// Live leases (expired ones are dropped first).
    [[nodiscard]] std::size_t active();
    /// Drops the leases past their time to live and grace; returns their ids
    /// (the readers that never released: worth a log line).
    std::vector<std::uint32_t> expire();

private:
    struct Lease {
        std::vector<RemoteBlock> blocks;
        std::chrono::steady_clock::time_point until;
        std::uint64_t version = 0;
    };
    /// The live lease holding a byte of `block`, or nullptr (under the lock).
    const std::pair<const std::uint32_t, Lease>* holder(const RemoteBlock& block) const;
    void expire_locked(std::chrono::steady_clock::time_point now, std::vector<std::uint32_t>* ids);

    std::mutex mutex_;
    BlockLeasesOptions options_;
    std::uint64_t version_ = 0;
    std::uint32_t next_lease_ = 0;
    std::unordered_map<std::uint32_t, Lease> leases_;
};

/// The reader's side: refuses a list older than one already accepted from
/// the same owner, and one whose lease has run out.
class LeaseReader {
public:
    /// `owner`: how the reader tells owners apart (a rank, a connection id).
    /// errc::stale_block_list when an accepted list from `owner` had a higher
    /// or equal version; otherwise the list's version becomes the newest.
    /// `why`, when given, receives the words (both versions and the owner).
    std::error_code accept(std::uint64_t owner, const LeasedBlockList& list, std::string* why = nullptr);
    /// The latest a transfer under this lease may end (TransferOptions::deadline):
    /// `received` (when the list arrived) plus its time to live.
    static std::chrono::steady_clock::time_point deadline(const LeasedBlockList& list,
                                                          std::chrono::steady_clock::time_point received) {
        return received + list.ttl;
    }

private:
    std::mutex mutex_;
    std::unordered_map<std::uint64_t, std::uint64_t> newest_;
};

} // namespace gpuverbs
