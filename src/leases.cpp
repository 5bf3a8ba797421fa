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
    leases_.emplace(list.lease, Lease{std::move(blocks), now + options_.ttl + options_.grace});
    return list;
}

bool BlockLeases::release(std::uint32_t lease) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    return leases_.erase(lease) != 0;
}

bool BlockLeases::held(const RemoteBlock& block) {
    std::lock_guard lock(mutex_);
    expire_locked(std::chrono::steady_clock::now(), nullptr);
    const std::uint64_t first = block.memory.address + block.offset;
    const std::uint64_t end = first + block.length;
    for (const auto& [id, lease] : leases_) {
        for (const RemoteBlock& b : lease.blocks) {
            if (b.memory.rkey != block.memory.rkey) continue;
            const std::uint64_t f = b.memory.address + b.offset;
            if (f < end && first < f + b.length) return true;
        }
    }
    return false;
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

std::error_code LeaseReader::accept(std::uint64_t owner, const LeasedBlockList& list) {
    std::lock_guard lock(mutex_);
    auto [it, fresh] = newest_.try_emplace(owner, list.version);
    if (!fresh) {
        if (list.version <= it->second) return errc::stale_block_list;
        it->second = list.version;
    }
    return {};
}

} // namespace gpuverbs
