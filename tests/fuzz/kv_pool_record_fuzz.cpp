// libFuzzer target: RemoteKvPool::load, the GVKV record a peer's KvPool
// describes and every connector loads (src/transfers/kv_pool_record.cpp).
// Checks, for any input:
//  - both forms behave (error_code: no throw, an empty pool on failure;
//    throwing: gpuverbs::Error only, with the same code);
//  - a record that loads describes a sound pool (its layout has no problem,
//    one tensor list per rail, every tensor long enough for the layout, no
//    two tensors of a rail overlapping under one key) and survives a round
//    trip through the writer (detail::kv_pool_record): the same size, and the
//    same pool when loaded again;
//  - the size is checked against the counts before anything is allocated
//    (-malloc_limit_mb catches an allocation sized from a peer's count).
#include "gpuverbs/transfers/kv_pool.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace {

void require(bool ok) {
    if (!ok) __builtin_trap();
}

bool same(const gpuverbs::RemoteKvPool& a, const gpuverbs::RemoteKvPool& b) {
    if (!(a.layout() == b.layout()) || a.rails() != b.rails() || a.pool_id() != b.pool_id() ||
        a.made_ns() != b.made_ns() || a.lease_ttl() != b.lease_ttl()) {
        return false;
    }
    for (std::size_t rail = 0; rail < a.rails(); ++rail) {
        const auto x = a.tensors(rail), y = b.tensors(rail);
        if (x.size() != y.size()) return false;
        for (std::size_t t = 0; t < x.size(); ++t) {
            if (!(x[t] == y[t])) return false;
        }
    }
    return true;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
    std::error_code ec;
    const gpuverbs::RemoteKvPool pool = gpuverbs::RemoteKvPool::load(bytes, ec);
    try {
        const gpuverbs::RemoteKvPool thrown = gpuverbs::RemoteKvPool::load(bytes);
        require(!ec && same(thrown, pool));
    } catch (const gpuverbs::Error& e) {
        require(ec && e.code() == ec);
    }
    if (ec) {
        require(!pool);
        return 0;
    }
    require(static_cast<bool>(pool) && pool.rails() >= 1);
    require(pool.layout().problem().empty());
    std::vector<gpuverbs::RemoteMemory> every;
    for (std::size_t rail = 0; rail < pool.rails(); ++rail) {
        const auto tensors = pool.tensors(rail);
        require(tensors.size() == pool.layout().tensors());
        for (const auto& t : tensors) require(t.length >= pool.layout().tensor_bytes());
        every.insert(every.end(), tensors.begin(), tensors.end());
    }
    require(pool.tensors(pool.rails()).empty());
    const std::vector<std::byte> again = gpuverbs::detail::kv_pool_record(
        pool.layout(), pool.pool_id(), every, pool.made_ns(), pool.lease_ttl(), pool.rails());
    require(again.size() == size);
    std::error_code again_ec;
    const gpuverbs::RemoteKvPool reloaded = gpuverbs::RemoteKvPool::load(again, again_ec);
    require(!again_ec && same(reloaded, pool));
    return 0;
}
