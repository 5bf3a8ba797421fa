// BlockLeases and LeaseReader (transfers/leases.hpp).
#include "gpuverbs/transfers/leases.hpp"

#include <string>

namespace gpuverbs {

BlockLeases::BlockLeases(BlockLeasesOptions options) : options_(options) {
    if (options_.ttl.count() <= 0 || options_.grace.count() < 0) {
        throw Error(make_error_code(errc::invalid_argument), "BlockLeases",
                    "ttl must be positive and grace not negative (ttl " + std::to_string(options_.ttl.count()) +
                        " ms, grace " + std::to_string(options_.grace.count()) + " ms)");
    }
}

LeasedBlockList BlockLeases::grant(std::vector<RemoteBlock> blocks) {
    if (std::string problem = wire::detail::block_list_problem(blocks); !problem.empty()) {
        throw Error(make_error_code(errc::invalid_argument), "BlockLeases::grant", problem);
    }
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    expire_locked(now, nullptr);
    LeasedBlockList list;
    list.version = ++version_;
    do {
        list.lease = ++next_lease_;
    } while (list.lease == 0 || leases_.count(list.lease) != 0); // 0 is never an id; a wrapped id still live is skipped
    list.ttl = options_.ttl;
    list.blocks = blocks;
    leases_.emplace(list.lease, Lease{std::move(blocks), now + options_.ttl + options_.grace, list.version});
    return list;
}

bool BlockLeases::release(std::uint32_t lease) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    return leases_.erase(lease) != 0;
}

const std::pair<const std::uint32_t, BlockLeases::Lease>* BlockLeases::holder(const RemoteBlock& block) const {
    const std::uint64_t first = block.memory.address + block.offset;
    const std::uint64_t end = first + block.length;
    for (const auto& entry : leases_) {
        for (const RemoteBlock& b : entry.second.blocks) {
            if (b.memory.rkey != block.memory.rkey) continue;
            const std::uint64_t f = b.memory.address + b.offset;
            if (f < end && first < f + b.length) return &entry;
        }
    }
    return nullptr;
}

bool BlockLeases::held(const RemoteBlock& block) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    return holder(block) != nullptr;
}

std::error_code BlockLeases::claim(std::span<const RemoteBlock> blocks, std::string* why) {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    expire_locked(now, nullptr);
    for (std::size_t k = 0; k < blocks.size(); ++k) {
        const auto* h = holder(blocks[k]);
        if (h == nullptr) continue;
        if (why != nullptr) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(h->second.until - now);
            *why = "block " + std::to_string(k) + " (" + std::to_string(blocks[k].length) + " bytes at offset " +
                   std::to_string(blocks[k].offset) + ") is under lease " + std::to_string(h->first) +
                   " (list version " + std::to_string(h->second.version) +
                   "): wait for the reader's release, or at most " + std::to_string(left.count()) +
                   " ms until it expires";
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
    std::vector<std::uint32_t> ids;
    expire_locked(std::chrono::steady_clock::now(), &ids);
    return ids;
}

void BlockLeases::expire_locked(std::chrono::steady_clock::time_point now, std::vector<std::uint32_t>* ids) {
    for (auto it = leases_.begin(); it != leases_.end();) {
        if (now < it->second.until) {
            ++it;
            continue;
        }
        if (ids != nullptr) ids->push_back(it->first);
        it = leases_.erase(it);
    }
}

std::error_code LeaseReader::accept(std::uint64_t owner, const LeasedBlockList& list, std::string* why) {
    std::lock_guard lock(mutex_);
    auto [it, fresh] = newest_.try_emplace(owner, list.version);
    if (!fresh) {
        if (list.version <= it->second) {
            if (why != nullptr) {
                *why = "block list version " + std::to_string(list.version) + " from owner " + std::to_string(owner) +
                       " is not newer than version " + std::to_string(it->second) +
                       " already accepted from it: its blocks may have been reused since";
            }
            return errc::stale_block_list;
        }
        it->second = list.version;
    }
    return {};
}

} // namespace gpuverbs
