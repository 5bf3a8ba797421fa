// scan_members (redis_member.hpp): which ranks of a service are present now.
#include "gpuverbs/config.hpp"

#if GPUVERBS_HAVE_HIREDIS
#include "redis_member.hpp"

namespace gpuverbs::detail {

/// The ranks whose member key exists now (one SCAN pass). A reply of
/// another shape is the store misbehaving: errc::rendezvous_unavailable in
/// `status` (and an empty set).
std::set<std::uint32_t> scan_members(RedisMember& m, Status& status) {
    std::string cursor = "0";
    const std::string prefix = m.options_.service + "/member/";
    const std::string pattern = prefix + "*";
    std::set<std::uint32_t> present;
    redis::ScanPage page;
    std::string why;
    // A store that never says the scan is done ("0") must not hold us for ever.
    constexpr int max_pages = 1 << 16; // 65 million keys at COUNT 1000
    int pages = 0;
    do {
        if (++pages > max_pages) {
            status.fail(errc::rendezvous_unavailable, "Redis SCAN",
                        m.name() + " did not finish a SCAN within " + std::to_string(max_pages) +
                            " pages (a cursor that never returns to 0)");
            return {};
        }
        Reply reply = m.checked({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}, "Redis SCAN", status);
        if (!reply) return {};
        if (!redis::parse_scan_reply(*reply, prefix, page, why)) {
            status.fail(errc::rendezvous_unavailable, "Redis SCAN", m.name() + " answered SCAN wrongly: " + why);
            return {};
        }
        present.insert(page.ranks.begin(), page.ranks.end());
        cursor = page.cursor;
    } while (cursor != "0");
    return present;
}

} // namespace gpuverbs::detail
#endif
