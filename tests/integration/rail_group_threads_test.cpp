// A RailGroup shared between threads: one thread replaces its rails and
// reads its executor and health while transfers over the group run on the
// io_context's thread. The thread-sanitizer build runs this suite: any
// unsynchronised access to the group's rails fails the run.
#include "rig.hpp"
#include "rig_pair.hpp"
#include "rig_rails.hpp"
#include "transfer_rig.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>
#include <boost/asio/io_context.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

TEST_SUITE("rail groups across threads" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("a rail group's rails are replaced from another thread while transfers over it run: each lands") {
        using namespace gpuverbs;
        boost::asio::io_context io;
        const test::Scatter s{16, 4096};
        std::vector<std::byte> m0(s.bytes()), m1(s.span());
        // Two wires between the same pools (rxe0 -> rxe1 twice): the group's
        // rail 0 is swapped between them, rail 1 is always the second.
        test::RailWire a("rxe0", "rxe1", io.get_executor(), m0, m1);
        test::RailWire b("rxe0", "rxe1", io.get_executor(), m0, m1);
        const TransferRail rail_a{&a.qp0, {}, {}};
        const TransferRail rail_b = test::second_rail(a, b);
        RailGroup group({rail_a, rail_b});
        const TransferPlan plan = s.plan(a.mr0, a.mr1.remote());
        const boost::asio::any_io_executor io_executor(io.get_executor());

        std::atomic<bool> stop{false};
        std::atomic<int> replaced{0};
        std::atomic<int> wrong_executor{0};
        std::thread replacer([&] {
            for (int i = 0; !stop.load(); ++i) {
                group.replace(0, i % 2 == 0 ? rail_b : rail_a);
                if (group.executor() != io_executor) wrong_executor.fetch_add(1);
                (void)group.health(0);
                replaced.fetch_add(1);
                std::this_thread::yield();
            }
        });
        int landed = 0;
        for (std::uint32_t round = 0; round < 40; ++round) {
            s.fill(m0, round);
            std::optional<boost::system::error_code> done;
            async_transfer(group, plan, {}, [&](boost::system::error_code ec, const TransferResult&) { done = ec; });
            test::run_until(
                io, [&] { return done.has_value(); }, 30s);
            REQUIRE(done.has_value());
            CHECK_MESSAGE(!*done, done->message());
            if (!*done && s.wrong(m1, round) == 0) ++landed;
        }
        stop = true;
        replacer.join();
        CHECK(landed == 40);
        CHECK(replaced.load() > 0);
        CHECK(wrong_executor.load() == 0);
    }
}
