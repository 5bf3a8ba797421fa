// Transfers across the rig's two rails (rxe0 -> rxe1 and rxe2 -> rxe3):
// striped, failed over when a rail is struck mid-way, grouped with cooldowns
// and health, and counted in Prometheus text. Every scenario runs through
// transfer_over(); those that strike a rail are rows of RailScenario.
#include "prometheus_parse.hpp"
#include "rig.hpp"
#include "rig_faults.hpp"
#include "rig_pair.hpp"
#include "rig_rails.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/bind_allocator.hpp>

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <array>
#include <chrono>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

using namespace gpuverbs;
using namespace std::chrono_literals;
namespace asio = boost::asio;

namespace {

using test::Rails;
using test::Scatter;

/// What strikes the rails mid-transfer, once the transfer is under way.
enum class Strike {
    nothing,
    queue_pair, ///< rail 1's writing queue pair is destroyed
    link,       ///< rail 1's link goes down (setup-rxe rail-down)
    both_links, ///< rail 1's link and rail 0's go down: no rail is left
};

/// What a transfer over the rails came back with (its result: Outcome::transfer).
struct RailRun : test::Outcome {
    std::array<std::uint64_t, 2> per_rail{}; ///< the result's report.rails[k].bytes
    std::optional<std::uint32_t> notified;
    std::chrono::milliseconds waited{}; ///< from the strike (or the start) to the handler
    std::size_t wrong = 0;              ///< run_scenario: bytes of landed blocks not as written
};

/// Runs one transfer of `plan` over `over` (the rails, or a group of them) on
/// `r`, counting each rail's bytes, reporting, and with the notification of
/// `options` to rail 0's peer; `strike` hits once the transfer is under way
/// (and is healed before this returns). Waits for the handler and the
/// notification; after a strike, a little longer, so that a second
/// completion would show.
template <class Over>
void transfer_over(RailRun& run, asio::io_context& io, Rails& r, Over& over, const TransferPlan& plan,
                   TransferOptions options, Strike strike = Strike::nothing) {
    options.report_blocks = true;
    if (options.notify) {
        r.rail0.qp1.async_receive(r.rail0.mr1.slice(0, 0), [&run](boost::system::error_code ec, Received got) {
            CHECK_FALSE(ec);
            run.notified = got.immediate;
        });
    }
    async_transfer(over, plan, options, run.handler());
    std::deque<test::Heal> heals; // healed from the front: the link that went down last first
    if (strike != Strike::nothing) {
        // Let the first chains go out, then strike while rail 1 still has requests with the device
        // (waiting longer let rail 1 finish its half first in one run: nothing left to fail).
        io.run_for(10ms);
        REQUIRE(run.calls == 0);
        if (strike != Strike::both_links) REQUIRE(r.rail1.qp0.outstanding_sends() > 0);
    }
    switch (strike) {
        case Strike::nothing: break;
        case Strike::queue_pair: r.rail1.qp0 = QueuePair(); break;
        case Strike::both_links:
            heals.emplace_front("rail-up");
            heals.emplace_front("link-up");
            REQUIRE(test::fault("rail-down") == 0);
            REQUIRE(test::fault("link-down") == 0);
            break;
        case Strike::link:
            heals.emplace_front("rail-up");
            REQUIRE(test::fault("rail-down") == 0);
            break;
    }
    const bool notifies = options.notify.has_value();
    run.waited = test::run_until(
        io, [&] { return run.calls > 0 && (!notifies || run.notified); }, 60s);
    const auto& rails = run.transfer.report.rails;
    for (std::size_t k = 0; k < run.per_rail.size(); ++k) run.per_rail[k] = k < rails.size() ? rails[k].bytes : 0;
    if (strike == Strike::nothing) return;
    io.run_for(100ms);
    for (test::Heal& heal : heals) CHECK(heal.now() == 0);
}

/// A transfer that a rail scenario strikes: its blocks, their pattern's seed,
/// what strikes, the notification asked for and whether rails take over.
struct RailScenario {
    const char* name;
    Scatter blocks;
    std::uint32_t seed;
    Strike strike;
    std::optional<std::uint32_t> notify{};
    bool failover = true;
};

/// Runs `s` on fresh rails (the second wire up); its destination checked
/// against the report: `wrong` counts the bytes of the blocks it calls landed
/// that are not as written.
RailRun run_scenario(const RailScenario& s) {
    asio::io_context io;
    Rails r(io.get_executor(), s.blocks.span());
    s.blocks.fill(r.m0, s.seed);
    const TransferPlan plan = s.blocks.plan(r.rail0.mr0, r.rail0.mr1.remote());
    std::vector<TransferRail> rails = r.spec();
    TransferOptions options;
    options.notify = s.notify;
    options.failover = s.failover;
    RailRun run;
    transfer_over(run, io, r, rails, plan, options, s.strike);
    run.wrong = s.blocks.wrong(r.m1, s.seed, &run.transfer.report);
    return run;
}

std::string summary(const RailRun& run) {
    return std::to_string(run.transfer.report.landed) + " blocks landed, " +
           std::to_string(run.transfer.report.uncertain) + " uncertain, " +
           std::to_string(run.transfer.report.not_posted) + " never posted";
}

} // namespace

namespace {
/// Counts what a handler's associated allocator hands out.
template <class T>
struct CountingAllocator {
    using value_type = T;
    std::size_t* count;
    explicit CountingAllocator(std::size_t* c) noexcept : count(c) {}
    template <class U>
    CountingAllocator(const CountingAllocator<U>& other) noexcept
        : count(other.count) {} // NOLINT(google-explicit-constructor)
    T* allocate(std::size_t n) {
        ++*count;
        return std::allocator<T>().allocate(n);
    }
    void deallocate(T* p, std::size_t n) noexcept { std::allocator<T>().deallocate(p, n); }
    template <class U>
    bool operator==(const CountingAllocator<U>& other) const noexcept {
        return count == other.count;
    }
};
} // namespace

TEST_SUITE("transfers across rails" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "one transfer striped over two rails: each rail's bytes reported, every byte verified; a rail "
        "that goes down mid-transfer fails it once, naming the rail") {
        const auto wire = test::second_wire();
        if (!wire) return;
        {
            asio::io_context io;
            const test::Layout l = test::layout(2000, 9000, 31);
            Rails r(io.get_executor(), l.bytes * 2 + 8000);
            for (std::size_t i = 0; i < l.bytes; ++i) r.m0[i] = test::pattern(i, 31);
            auto [local, remote] = test::write_lists(l, r.rail0.mr0, r.rail0.mr1.remote());
            TransferPlan plan = TransferPlan(TransferDirection::write, local, remote, TransferLimits{1});
            std::vector<TransferRail> rails = r.spec();
            TransferOptions options;
            options.notify = 42;
            RailRun run;
            transfer_over(run, io, r, rails, plan, options);
            const auto& per_rail = run.per_rail;
            CHECK(run.calls == 1);
            CHECK_MESSAGE(!run.result, run.result.message());
            CHECK(run.moved == l.bytes);
            CHECK(per_rail[0] + per_rail[1] == l.bytes);
            // Halves of equal bytes, to within one block.
            CHECK(per_rail[0] > l.bytes / 2 - 9000);
            CHECK(per_rail[1] > l.bytes / 2 - 9000);
            CHECK(run.notified == 42u);
            CHECK(test::wrong_bytes(l, r.m1, 31) == 0);
            MESSAGE("2 rails: " << plan.requests().size() << " requests, rail 0 " << per_rail[0] << " bytes, rail 1 "
                                << per_rail[1] << " bytes");

            // A rail without its own keys, on another device, is refused before anything is posted.
            std::vector<TransferRail> unmapped{TransferRail{&r.rail0.qp0, {}, {}}, TransferRail{&r.rail1.qp0, {}, {}}};
            RailRun refused;
            transfer_over(refused, io, r, unmapped, plan, {});
            CHECK(refused.calls == 1);
            CHECK(refused.result == detail::to_asio_error(make_error_code(errc::invalid_argument)));
            CHECK_MESSAGE(
                refused.transfer.failed_blocks.find("rail 1's queue pair is on another protection domain") == 0,
                refused.transfer.failed_blocks);
        }
        // A large transfer; the second wire goes down while it runs. No failover: it fails fast (the next
        // case moves the requests instead).
        const RailScenario s{"rail 1's link down, no failover", {3000, 16384}, 77, Strike::link, {}, false};
        CAPTURE(s.name);
        const RailRun run = run_scenario(s);
        const std::size_t bytes = s.blocks.bytes();
        const TransferReport& report = run.transfer.report;
        CHECK(run.calls == 1);
        CHECK(run.result);
        CHECK_MESSAGE(run.transfer.failed_blocks.find("on rail 1") != std::string::npos, run.transfer.failed_blocks);
        CHECK(run.per_rail[0] + run.per_rail[1] < bytes);
        // Some blocks may or may not have landed: the report adds up to the
        // plan, its landed blocks are the bytes reported, and every block
        // it calls landed is at the peer, byte for byte.
        CHECK(report.landed + report.uncertain + report.not_posted == s.blocks.blocks);
        CHECK(report.landed > 0);
        // Not everything landed. Whether rail 1's unfinished requests were in
        // flight (uncertain) or refused at posting (not posted: gpuverbs had
        // already seen the port go down) depends on when the link fell.
        CHECK(report.uncertain + report.not_posted > 0);
        CHECK(report.landed * s.blocks.block == run.per_rail[0] + run.per_rail[1]); // bytes count what landed
        CHECK(run.wrong == 0);
        MESSAGE("report: " << summary(run));
        MESSAGE("rail 1 down: the transfer failed after " << run.waited.count() << " ms with '" << run.result.message()
                                                          << "' (" << run.transfer.failed_blocks << "); rail 0 moved "
                                                          << run.per_rail[0] << " bytes, rail 1 " << run.per_rail[1]);
    }

    TEST_CASE(
        "failover: a rail whose queue pair is destroyed, or whose link goes down, mid-transfer hands its "
        "unfinished requests to the other rail; the transfer succeeds, every byte verified, and the report "
        "names the rail and why") {
        const auto wire = test::second_wire();
        if (!wire) return;
        const RailScenario taken_over[] = {
            {"rail 1's queue pair destroyed", {10000, 4096}, 91, Strike::queue_pair, 77},
            {"rail 1's link down", {10000, 4096}, 91, Strike::link, 77},
        };
        for (const RailScenario& s : taken_over) {
            CAPTURE(s.name);
            const RailRun run = run_scenario(s);
            const TransferReport& report = run.transfer.report;
            CHECK(run.calls == 1);
            CHECK_MESSAGE(!run.result, run.result.message() << " (" << run.transfer.failed_blocks << ")");
            CHECK(run.moved == s.blocks.bytes());
            CHECK(run.per_rail[0] + run.per_rail[1] == s.blocks.bytes());
            CHECK(run.notified == 77u);
            CHECK(report.landed == s.blocks.blocks); // every block: `wrong` checked them all
            REQUIRE(report.rails.size() == 2);
            CHECK_FALSE(report.rails[0].error);
            CHECK(report.rails[1].error);
            CHECK_MESSAGE(report.rails[1].failure.find("on rail 1") != std::string::npos, report.rails[1].failure);
            CHECK(report.rails[1].taken_over > 0);
            CHECK(report.rails[0].took_over == report.rails[1].taken_over);
            CHECK(report.rails[0].bytes == run.per_rail[0]);
            CHECK(run.wrong == 0);
            MESSAGE(s.name << ": the transfer succeeded " << run.waited.count() << " ms later; rail 0 moved "
                           << run.per_rail[0] << " bytes, rail 1 " << run.per_rail[1] << "; rail 0 took over "
                           << report.rails[0].took_over << " requests; rail 1: " << report.rails[1].failure);
        }
        // Both links down: no rail is left; the transfer fails once, naming both.
        const RailScenario s{"both links down", {10000, 4096}, 93, Strike::both_links};
        CAPTURE(s.name);
        const RailRun run = run_scenario(s);
        CHECK(run.calls == 1);
        CHECK(run.result);
        CHECK_MESSAGE(run.transfer.failed_blocks.find("every rail failed: rail 0: ") == 0, run.transfer.failed_blocks);
        CHECK_MESSAGE(run.transfer.failed_blocks.find("; rail 1: ") != std::string::npos, run.transfer.failed_blocks);
        REQUIRE(run.transfer.report.rails.size() == 2);
        CHECK(run.transfer.report.rails[0].error);
        CHECK(run.transfer.report.rails[1].error);
        CHECK(run.transfer.report.landed + run.transfer.report.uncertain + run.transfer.report.not_posted ==
              s.blocks.blocks);
        CHECK(run.wrong == 0);
        MESSAGE("both links down: " << run.transfer.failed_blocks << "; " << summary(run));
    }

    TEST_CASE(
        "a rail group: a rail that failed is left out until its cooldown has passed, then tried again; "
        "replace() brings a reconnected rail back; health counts each rail's bytes, failures and throughput") {
        const auto wire = test::second_wire();
        if (!wire) return;
        const Scatter s{1000, 16384};
        asio::io_context io;
        Rails r(io.get_executor(), s.span());
        const TransferPlan plan = s.plan(r.rail0.mr0, r.rail0.mr1.remote());
        RailGroupOptions go;
        // Long enough that transfers 2 and 3 fit in it even under ASan (300 ms did not, in one CI run).
        go.cooldown = 4s;
        go.min_measured_bytes = 1 << 20;
        RailGroup group(r.spec(), go);
        RailRun run;
        auto transfer = [&](std::uint32_t seed) {
            s.fill(r.m0, seed);
            run = {};
            transfer_over(run, io, r, group, plan, {});
            REQUIRE(run.calls == 1);
            CHECK_MESSAGE(!run.result, run.result.message());
            CHECK(run.moved == s.bytes());
            CHECK(s.wrong(r.m1, seed, nullptr, 97) == 0);
            CHECK(run.per_rail[0] + run.per_rail[1] == s.bytes());
            REQUIRE(run.transfer.report.rails.size() == 2); // in the group's numbering
        };
        const auto& per_rail = run.per_rail;
        const TransferReport& report = run.transfer.report;

        transfer(1); // both healthy: both carry bytes and are measured
        CHECK(per_rail[0] > 0);
        CHECK(per_rail[1] > 0);
        CHECK(group.health(0).transfers == 1);
        CHECK(group.health(1).bytes == per_rail[1]);
        CHECK(group.health(0).bytes_per_second > 0);
        CHECK(group.health(1).bytes_per_second > 0);

        {
            test::Heal up("rail-up");
            REQUIRE(test::fault("rail-down") == 0);
            transfer(2); // rail 1 fails at once; rail 0 takes its share over
            CHECK(report.rails[1].error);
            const RailHealth h = group.health(1);
            CHECK(h.cooling);
            CHECK(h.failures == 1);
            CHECK(h.last_error == report.rails[1].error);
            CHECK_MESSAGE(h.last_failure.find("on rail 1") != std::string::npos, h.last_failure);

            transfer(3); // within the cooldown: rail 1 is left out, rail 0 carries everything
            CHECK(per_rail[1] == 0);
            CHECK(per_rail[0] == s.bytes());
            CHECK_FALSE(report.rails[1].error);
            CHECK(group.health(1).failures == 1);

            std::this_thread::sleep_until(group.health(1).failed_at + go.cooldown + 50ms);
            CHECK_FALSE(group.health(1).cooling);
            transfer(4); // tried again: its queue pair is in the error state, so it fails again; rail 0 takes over
            CHECK(group.health(1).failures == 2);
            CHECK(up.now() == 0);
        }

        // Reconnected: a new queue pair on the same devices replaces rail 1.
        Rails::Wire fresh("rxe2", "rxe3", io.get_executor(), r.m0, r.m1);
        group.replace(1, test::second_rail(r.rail0, fresh));
        CHECK(group.health(1).failures == 0);
        transfer(5);
        CHECK(per_rail[1] > 0);
        CHECK_FALSE(report.rails[1].error);
        MESSAGE("measured: rail 0 " << group.health(0).bytes_per_second / 1e6 << " MB/s, rail 1 "
                                    << group.health(1).bytes_per_second / 1e6 << " MB/s");
        CHECK_THROWS_WITH_AS(group.health(2), "RailGroup::health: no rail 2 (the group has 2)", Error);
    }

    TEST_CASE(
        "observable: a queue pair's and a rail group's counters match the work done, and their Prometheus "
        "text parses with the reference parser") {
        const auto wire = test::second_wire();
        if (!wire) return;
        const Scatter s{2000, 4096};
        asio::io_context io;
        Rails r(io.get_executor(), s.span());
        const TransferPlan plan = s.plan(r.rail0.mr0, r.rail0.mr1.remote());
        RailGroup group(r.spec());
        const QueuePairCounters before = r.rail0.qp0.counters();
        for (int round = 0; round < 3; ++round) {
            RailRun run;
            transfer_over(run, io, r, group, plan, {});
            REQUIRE(run.calls == 1);
            REQUIRE_FALSE(run.result);
        }
        // The group's transfer keeps the handler's executor and allocator: the
        // initiation's executor is the group's first rail's, and the state it
        // holds until the handler runs comes from the handler's allocator.
        const asio::any_io_executor io_executor(io.get_executor());
        CHECK(group.executor() == io_executor);
        CHECK(detail::InitiateGroupTransfer{&group, &plan, {}}.get_executor() == io_executor);
        std::size_t allocations = 0;
        std::optional<boost::system::error_code> done;
        async_transfer(group, plan, {},
                       asio::bind_allocator(CountingAllocator<void>(&allocations),
                                            [&](boost::system::error_code ec, std::size_t) { done = ec; }));
        test::run_until(
            io, [&] { return done.has_value(); }, 30s);
        REQUIRE(done.has_value());
        CHECK_FALSE(*done);
        CHECK(allocations >= 2); // the group's state and the transfer's job
        // Rail 0's queue pair posted its share of each transfer, one request per block, and all completed.
        const QueuePairCounters c = r.rail0.qp0.counters();
        const RailHealth h0 = group.health(0), h1 = group.health(1);
        CHECK(h0.bytes + h1.bytes == 4 * s.bytes());
        CHECK(h0.transfers == 4);
        CHECK(c.sends_posted - before.sends_posted == h0.bytes / s.block);
        CHECK(c.sends_completed == c.sends_posted);
        CHECK(c.errors[IBV_WC_REM_ACCESS_ERR] == 0);
        // One write to a wrong key: one REM_ACCESS_ERR (the queue pair then goes to the error state).
        RemoteMemory wrong = r.rail0.mr1.remote();
        wrong.rkey ^= 0x5a5a00;
        std::optional<boost::system::error_code> failed;
        r.rail0.qp0.async_write(r.rail0.mr0.slice(0, 64), wrong, 0,
                                [&](boost::system::error_code ec, std::size_t) { failed = ec; });
        test::run_until(
            io, [&] { return failed.has_value(); }, 10s);
        REQUIRE(failed.has_value());
        CHECK(*failed);
        const QueuePairCounters after = r.rail0.qp0.counters();
        CHECK(after.errors[IBV_WC_REM_ACCESS_ERR] == 1);
        CHECK(after.sends_posted == c.sends_posted + 1);

        PrometheusText metrics;
        metrics.add("rail0", r.rail0.qp0);
        metrics.add("kv", group);
        metrics.add_port(r.rail0.d0);
        const std::string text = metrics.text();
        const test::ParsedMetrics parsed = test::parse_prometheus(text);
        REQUIRE_MESSAGE(parsed.error.empty(), parsed.error << "\n" << text);
        auto at = [&](const std::string& key) {
            auto it = parsed.samples.find(key);
            if (it == parsed.samples.end()) FAIL_CHECK("no sample " << key);
            return it == parsed.samples.end() ? -1.0 : it->second;
        };
        const std::pair<const char*, double> samples[] = {
            {R"(gpuverbs_qp_requests_posted_total{qp="rail0",queue="send"})", static_cast<double>(after.sends_posted)},
            {R"(gpuverbs_qp_requests_completed_total{qp="rail0",queue="send"})",
             static_cast<double>(after.sends_completed)},
            {R"(gpuverbs_qp_errors_total{qp="rail0",status="REM_ACCESS_ERR"})", 1},
            {R"(gpuverbs_rail_bytes_total{group="kv",rail="0"})", static_cast<double>(h0.bytes)},
            {R"(gpuverbs_rail_bytes_total{group="kv",rail="1"})", static_cast<double>(h1.bytes)},
            {R"(gpuverbs_rail_transfers_total{group="kv",rail="1"})", 4},
            {R"(gpuverbs_rail_failures_total{group="kv",rail="0"})", 0},
            {R"(gpuverbs_rail_throughput_bytes_per_second{group="kv",rail="0"})", h0.bytes_per_second},
        };
        for (const auto& [key, value] : samples) {
            CAPTURE(key);
            CHECK(at(key) == value);
        }
        CHECK(at(R"(gpuverbs_rail_busy_seconds_total{group="kv",rail="0"})") > 0);
        std::size_t hw = 0;
        for (const auto& [key, value] : parsed.samples) hw += key.rfind("gpuverbs_port_hw_counter{", 0) == 0 ? 1 : 0;
        CHECK(hw > 0); // rxe exports its own counters (sent_pkts, retry_exceeded_err, ...)
        MESSAGE(parsed.samples.size() << " samples parsed, " << hw << " of them the device's hardware counters");
    }
}
