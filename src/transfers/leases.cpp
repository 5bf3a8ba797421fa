// BlockLeases and LeaseReader (transfers/leases.hpp).
#include "gpuverbs/transfers/leases.hpp"

#include "random.hpp"
#include "text.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace gpuverbs {

BlockLeases::BlockLeases(BlockLeasesOptions options) : BlockLeases(options, detail::Outcome{}) {}

BlockLeases::BlockLeases(BlockLeasesOptions options, detail::Outcome outcome) : options_(options) {
    detail::Status status;
    if (options_.ttl.count() <= 0 || options_.grace.count() < 0) {
        refused_ = "ttl must be positive and grace not negative (ttl " + std::to_string(options_.ttl.count()) +
                   " ms, grace " + std::to_string(options_.grace.count()) + " ms)";
        status.fail(make_error_code(errc::invalid_argument), "BlockLeases", refused_);
    }
    outcome.settle(status);
}

BlockLeases::~BlockLeases() {
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
    }
    expiry_changed_.notify_all();
    if (expiry_.joinable()) expiry_.join();
}

void BlockLeases::expire_on_time() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
        // The first lease with regions to deregister; the rest wait for the table's next call.
        std::optional<std::chrono::steady_clock::time_point> next;
        for (const auto& [id, lease] : leases_) {
            if (!lease.regions.empty() && (!next || lease.until < *next)) next = lease.until;
        }
        if (next) {
            expiry_changed_.wait_until(lock, *next);
        } else {
            expiry_changed_.wait(lock);
        }
        expire_locked(std::chrono::steady_clock::now(), &unreported_); // expire() names them
        constexpr std::size_t kept = 65536;                            // an owner that never asks keeps the newest
        if (unreported_.size() > kept) unreported_.erase(unreported_.begin(), unreported_.end() - kept);
    }
}

namespace {

/// [first, end) of a block in the owner's address space, or nothing when the
/// block does not lie inside its region or its range wraps.
std::optional<std::pair<std::uint64_t, std::uint64_t>> range_of(const RemoteBlock& block) {
    const RemoteMemory& m = block.memory;
    if (block.offset > m.length || block.length > m.length - block.offset) return std::nullopt;
    if (m.address > UINT64_MAX - m.length) return std::nullopt;
    const std::uint64_t first = m.address + block.offset;
    return std::pair{first, first + block.length};
}

} // namespace

std::uint32_t BlockLeases::new_id_locked() {
    for (;;) { // 0 is never an id; a live one is never handed out twice
        const auto id = static_cast<std::uint32_t>(detail::system_random());
        if (id != 0 && leases_.count(id) == 0) return id;
    }
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks, Reader reader) {
    return detail::or_throw(
        [&](detail::Status& s) { return grant_impl(std::move(blocks), reader, nullptr, Access::none, s); });
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks, Reader reader, std::error_code& ec) {
    return detail::or_code(
        ec, [&](detail::Status& s) { return grant_impl(std::move(blocks), reader, nullptr, Access::none, s); });
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks, Reader reader, std::error_code& ec,
                                   Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
        return grant_impl(std::move(blocks), reader, nullptr, Access::none, s);
    });
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain& pd,
                                   Access access) {
    return detail::or_throw([&](detail::Status& s) { return grant_impl(std::move(blocks), reader, &pd, access, s); });
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain& pd,
                                   Access access, std::error_code& ec) {
    return detail::or_code(ec,
                           [&](detail::Status& s) { return grant_impl(std::move(blocks), reader, &pd, access, s); });
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain& pd,
                                   Access access, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics,
                           [&](detail::Status& s) { return grant_impl(std::move(blocks), reader, &pd, access, s); });
}

LeasedBlockList BlockLeases::grant_impl(std::vector<RemoteBlock> blocks, Reader reader, const ProtectionDomain* pd,
                                        Access access, detail::Status& status) {
    const char* verb = "BlockLeases::grant";
    if (!refused_.empty()) {
        status.fail(make_error_code(errc::invalid_argument), verb,
                    "this lease table was refused when created: " + refused_);
        return {};
    }
    if (std::string problem = wire::detail::block_list_problem(blocks); !problem.empty()) {
        status.fail(make_error_code(errc::invalid_argument), verb, std::move(problem));
        return {};
    }
    if (pd == nullptr) {
        std::vector<RemoteBlock> named = blocks;
        return record_lease(std::move(blocks), std::move(named), reader, {}, LeaseScope::whole_regions);
    }
    // The runs of contiguous (or overlapping) blocks, in address order.
    struct Run {
        std::uint64_t first;
        std::uint64_t end;
    };
    std::vector<Run> runs;
    runs.reserve(blocks.size());
    for (const RemoteBlock& b : blocks) {
        const auto range = range_of(b); // block_list_problem checked it lies inside its region
        runs.push_back({range->first, range->second});
    }
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.first < b.first; });
    std::vector<Run> merged;
    for (const Run& r : runs) {
        if (!merged.empty() && r.first <= merged.back().end) {
            merged.back().end = std::max(merged.back().end, r.end);
        } else {
            merged.push_back(r);
        }
    }
    // One region per run, registered before anything is leased: a refused
    // registration leaves no lease behind.
    std::vector<MemoryRegion> regions;
    regions.reserve(merged.size());
    for (const Run& r : merged) {
        std::error_code ec;
        Diagnostics why;
        // NOLINTNEXTLINE(performance-no-int-to-ptr): a block's address is the owner's own pointer
        void* const first = reinterpret_cast<void*>(r.first);
        regions.push_back(MemoryRegion::create(*pd, first, r.end - r.first, access, ec, why));
        if (ec) {
            status.fail(ec, verb,
                        "cannot register a region of the lease over " + std::to_string(r.end - r.first) + " bytes at " +
                            detail::hex_address(r.first) + " (" + why.message() +
                            "); the blocks must be host memory, or GPU memory ibv_reg_mr takes (nvidia-peermem); "
                            "otherwise lease whole regions, one per tenant; nothing was leased");
            return {};
        }
    }
    // The list names each block inside its run's region.
    std::vector<RemoteBlock> named = blocks;
    for (RemoteBlock& b : named) {
        const std::uint64_t first = range_of(b)->first;
        const auto run = std::upper_bound(merged.begin(), merged.end(), first,
                                          [](std::uint64_t a, const Run& r) { return a < r.first; }) -
                         1;
        const MemoryRegion& region = regions[static_cast<std::size_t>(run - merged.begin())];
        b.memory = region.remote();
        b.offset = first - run->first;
    }
    return record_lease(std::move(blocks), std::move(named), reader, std::move(regions), LeaseScope::lease_regions);
}

LeasedBlockList BlockLeases::record_lease(std::vector<RemoteBlock> blocks, std::vector<RemoteBlock> named,
                                          Reader reader, std::vector<MemoryRegion> regions, LeaseScope scope) {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    expire_locked(now, nullptr);
    LeasedBlockList list;
    list.version = ++version_;
    list.lease = new_id_locked();
    list.ttl = options_.ttl;
    list.blocks = std::move(named);
    list.scope = scope;
    const bool own_regions = !regions.empty();
    leases_.emplace(list.lease, Lease{std::move(blocks), now + options_.ttl + options_.grace, list.version, reader,
                                      std::move(regions)});
    ++statistics_.granted;
    if (own_regions) {
        // Deregistered on time, not at the owner's next call (docs/security.md: nothing once expired).
        if (!expiry_.joinable()) expiry_ = std::thread([this] { expire_on_time(); });
        expiry_changed_.notify_all();
    }
    return list;
}

std::error_code BlockLeases::release(std::uint32_t lease, Reader reader) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    const auto it = leases_.find(lease);
    if (it == leases_.end()) {
        ++statistics_.unknown_releases;
        return errc::lease_unknown;
    }
    if (it->second.reader != reader) {
        ++statistics_.refused_releases;
        return errc::lease_not_yours;
    }
    leases_.erase(it);
    ++statistics_.released;
    return {};
}

bool BlockLeases::revoke(std::uint32_t lease) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    if (leases_.erase(lease) == 0) return false;
    ++statistics_.revoked;
    return true;
}

const std::pair<const std::uint32_t, BlockLeases::Lease>* BlockLeases::holder(std::uint64_t first,
                                                                              std::uint64_t end) const {
    for (const auto& entry : leases_) {
        for (const RemoteBlock& b : entry.second.blocks) {
            const auto r = range_of(b); // granted blocks passed block_list_problem: always a range
            if (r && r->first < end && first < r->second) return &entry;
        }
    }
    return nullptr;
}

bool BlockLeases::held(const RemoteBlock& block) {
    const auto r = range_of(block);
    if (!r) return true; // not a block of its region: nothing proves it free
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    return holder(r->first, r->second) != nullptr;
}

std::error_code BlockLeases::claim(std::span<const RemoteBlock> blocks) {
    return claim_impl(blocks, nullptr);
}

std::error_code BlockLeases::claim(std::span<const RemoteBlock> blocks, Diagnostics& diagnostics) {
    detail::Status status;
    const std::error_code ec = claim_impl(blocks, &status);
    status.report(diagnostics);
    return ec;
}

std::error_code BlockLeases::claim(std::span<const RemoteBlock> blocks, std::string* why) {
    detail::Status status;
    const std::error_code ec = claim_impl(blocks, why != nullptr ? &status : nullptr);
    if (why != nullptr && ec) *why = status.detail;
    return ec;
}

std::error_code BlockLeases::claim_impl(std::span<const RemoteBlock> blocks, detail::Status* words) {
    for (std::size_t k = 0; k < blocks.size(); ++k) {
        if (range_of(blocks[k])) continue;
        if (words != nullptr) {
            words->fail(errc::invalid_argument, "BlockLeases::claim",
                        "block " + std::to_string(k) + " (" + std::to_string(blocks[k].length) + " bytes at offset " +
                            std::to_string(blocks[k].offset) + ") does not lie inside its region of " +
                            std::to_string(blocks[k].memory.length) + " bytes: it cannot be claimed");
        }
        return errc::invalid_argument;
    }
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    expire_locked(now, nullptr);
    for (std::size_t k = 0; k < blocks.size(); ++k) {
        const auto r = range_of(blocks[k]);
        const auto* h = holder(r->first, r->second);
        if (h == nullptr) continue;
        if (words != nullptr) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(h->second.until - now);
            words->fail(errc::blocks_leased, "BlockLeases::claim",
                        "block " + std::to_string(k) + " (" + std::to_string(blocks[k].length) + " bytes at offset " +
                            std::to_string(blocks[k].offset) + ") is under lease " + std::to_string(h->first) +
                            " (list version " + std::to_string(h->second.version) +
                            "): wait for the reader's release, or at most " + std::to_string(left.count()) +
                            " ms until it expires");
        }
        return errc::blocks_leased;
    }
    return {};
}

std::size_t BlockLeases::active() {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    return leases_.size();
}

std::vector<std::uint32_t> BlockLeases::expire() {
    std::lock_guard lock(mutex_);
    // Those the expiry thread dropped since the last call first: they never released either.
    std::vector<std::uint32_t> ids = std::exchange(unreported_, {});
    expire_locked(std::chrono::steady_clock::now(), &ids);
    return ids;
}

BlockLeasesStatistics BlockLeases::statistics() {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    return statistics_;
}

void BlockLeases::expire_locked(std::chrono::steady_clock::time_point now, std::vector<std::uint32_t>* ids) {
    for (auto it = leases_.begin(); it != leases_.end();) {
        if (now < it->second.until) {
            ++it;
            continue;
        }
        if (ids != nullptr) ids->push_back(it->first);
        ++statistics_.expired;
        it = leases_.erase(it);
    }
}

std::error_code LeaseReader::accept(std::uint64_t owner, const LeasedBlockList& list) {
    return accept_impl(owner, list, nullptr);
}

std::error_code LeaseReader::accept(std::uint64_t owner, const LeasedBlockList& list, Diagnostics& diagnostics) {
    detail::Status status;
    const std::error_code ec = accept_impl(owner, list, &status);
    status.report(diagnostics);
    return ec;
}

std::error_code LeaseReader::accept(std::uint64_t owner, const LeasedBlockList& list, std::string* why) {
    detail::Status status;
    const std::error_code ec = accept_impl(owner, list, why != nullptr ? &status : nullptr);
    if (why != nullptr && ec) *why = status.detail;
    return ec;
}

std::error_code LeaseReader::accept_impl(std::uint64_t owner, const LeasedBlockList& list, detail::Status* words) {
    std::lock_guard lock(mutex_);
    auto [it, fresh] = newest_.try_emplace(owner, list.version);
    if (!fresh) {
        if (list.version <= it->second) {
            if (words != nullptr) {
                words->fail(errc::stale_block_list, "LeaseReader::accept",
                            "block list version " + std::to_string(list.version) + " from owner " +
                                std::to_string(owner) + " is not newer than version " + std::to_string(it->second) +
                                " already accepted from it: its blocks may have been reused since");
            }
            return errc::stale_block_list;
        }
        it->second = list.version;
    }
    return {};
}

} // namespace gpuverbs
