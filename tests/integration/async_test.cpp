// The asynchronous data path on Asio executors, on rxe0 <-> rxe1, in both
// completion modes: every handler runs exactly once, with the right result or error.
#include "allocation_counter.hpp"
#include "rig_pair.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <atomic>
#include <optional>
#include <thread>

using namespace gpuverbs;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

using test::mode_name;
using test::modes;
using test::Pair;
using test::shared_modes;

const auto aborted = boost::asio::error::operation_aborted;

} // namespace

TEST_SUITE("asynchronous operations on real RDMA" * doctest::skip(!gpuverbs::test::rig_present())) {
    TEST_CASE("a callback gets the result of an RDMA write once, and run() returns when it is done") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            CHECK(p.a.qp.get_executor() == io.get_executor());
            gpuverbs::test::fill_pattern(std::span(p.a.memory).first(5000), 1);
            int calls = 0;
            boost::system::error_code got;
            std::size_t bytes = 0;
            p.a.qp.async_write(p.a.mr.slice(0, 5000), p.b.mr.remote(), 0,
                               [&](boost::system::error_code ec, std::size_t n) {
                                   ++calls;
                                   got = ec;
                                   bytes = n;
                               });
            CHECK(calls == 0); // never from inside the initiating function
            io.run();
            CHECK(calls == 1);
            CHECK_FALSE(got);
            CHECK(bytes == 5000);
            CHECK(gpuverbs::test::has_pattern(std::span(p.b.memory).first(5000), 1));
        }
    }

    TEST_CASE("the same exchange with use_future, the io_context running in another thread") {
        for (const auto& mode : shared_modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            auto guard = asio::make_work_guard(io);
            std::thread runner([&] { io.run(); });
            {
                Pair p(io.get_executor(), mode);
                gpuverbs::test::fill_pattern(std::span(p.b.memory).first(3000), 2);
                auto receive = p.b.qp.async_receive(p.b.mr.slice(8192, 64), asio::use_future);
                auto read = p.a.qp.async_read(p.a.mr.slice(0, 3000), p.b.mr.remote(), 0, asio::use_future);
                CHECK(read.get() == 3000);
                CHECK(gpuverbs::test::has_pattern(std::span(p.a.memory).first(3000), 2));
                auto send = p.a.qp.async_send_with_imm(p.a.mr.slice(0, 10), 77, asio::use_future);
                CHECK(send.get() == 10);
                Received r = receive.get();
                CHECK(r.bytes == 10);
                CHECK(r.immediate == 77u);
            }
            guard.reset();
            runner.join();
        }
    }

    TEST_CASE("the same exchange as C++20 coroutines with use_awaitable, atomics included") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            bool finished = false;
            asio::co_spawn(
                io,
                [&]() -> asio::awaitable<void> {
                    gpuverbs::test::fill_pattern(std::span(p.a.memory).first(1000), 3);
                    std::size_t n =
                        co_await p.a.qp.async_write(p.a.mr.slice(0, 1000), p.b.mr.remote(), 100, asio::use_awaitable);
                    CHECK(n == 1000);
                    CHECK(gpuverbs::test::has_pattern(std::span(p.b.memory).subspan(100, 1000), 3));
                    std::uint64_t start = 40;
                    std::memcpy(p.b.memory.data() + 4096, &start, 8);
                    std::uint64_t old = co_await p.a.qp.async_fetch_add(p.a.mr.slice(2048, 8), p.b.mr.remote(), 4096, 2,
                                                                        asio::use_awaitable);
                    CHECK(old == 40);
                    old = co_await p.a.qp.async_compare_swap(p.a.mr.slice(2048, 8), p.b.mr.remote(), 4096, 42, 7,
                                                             asio::use_awaitable);
                    CHECK(old == 42);
                    std::uint64_t now = 0;
                    std::memcpy(&now, p.b.memory.data() + 4096, 8);
                    CHECK(now == 7);
                    // The default token (deferred) can be awaited too.
                    std::size_t m = co_await p.a.qp.async_write(p.a.mr.slice(0, 8), p.b.mr.remote());
                    CHECK(m == 8);
                    finished = true;
                },
                asio::detached);
            io.run();
            CHECK(finished);
        }
    }

    TEST_CASE("10,000 mixed operations from several coroutines on a 2-thread io_context: all complete once") {
        for (const auto& mode : shared_modes) {
            CAPTURE(mode_name(mode));
            asio::thread_pool pool(2);
            QueuePairOptions options;
            options.max_send_wr = 64;
            options.max_recv_wr = 64;
            Pair p(pool.get_executor(), mode, 1 << 20, options);
            constexpr int coroutines = 4;
            constexpr int per_coroutine = 2500;
            std::atomic<int> handlers{0}, failures{0};
            std::atomic<int> done{0};
            std::memset(p.b.memory.data(), 0, 64);
            for (int c = 0; c < coroutines; ++c) {
                asio::co_spawn(
                    pool,
                    [&, c]() -> asio::awaitable<void> {
                        const std::size_t base = 65536 + static_cast<std::size_t>(c) * 65536;
                        for (int i = 0; i < per_coroutine; ++i) {
                            try {
                                switch (i % 3) {
                                    case 0:
                                        (void)co_await p.a.qp.async_write(p.a.mr.slice(base, 512), p.b.mr.remote(),
                                                                          base, asio::use_awaitable);
                                        break;
                                    case 1:
                                        (void)co_await p.a.qp.async_read(p.a.mr.slice(base + 4096, 512),
                                                                         p.b.mr.remote(), base, asio::use_awaitable);
                                        break;
                                    default:
                                        (void)co_await p.a.qp.async_fetch_add(
                                            p.a.mr.slice(base + 8192, 8), p.b.mr.remote(), 8, 1, asio::use_awaitable);
                                }
                            } catch (const std::system_error&) {
                                ++failures;
                            }
                            ++handlers;
                        }
                        ++done;
                    },
                    asio::detached);
            }
            auto deadline = std::chrono::steady_clock::now() + 120s;
            while (done < coroutines && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
            CHECK(done == coroutines);
            CHECK(handlers == coroutines * per_coroutine);
            CHECK(failures == 0);
            std::uint64_t counter = 0;
            std::memcpy(&counter, p.b.memory.data() + 8, 8);
            // Operations 2, 5, 8, … of each coroutine are atomic adds.
            CHECK(counter == static_cast<std::uint64_t>(coroutines) * ((per_coroutine + 0) / 3));
            pool.join();
        }
    }

    TEST_CASE("back-pressure: far more operations than the send queue holds all run, in order") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            QueuePairOptions options;
            options.max_send_wr = 8;
            Pair p(io.get_executor(), mode, 1 << 20, options);
            std::vector<int> order;
            int errors = 0;
            for (int i = 0; i < 300; ++i) {
                p.a.qp.async_write(p.a.mr.slice(0, 256), p.b.mr.remote(), static_cast<std::uint64_t>(i) * 256,
                                   [&, i](boost::system::error_code ec, std::size_t) {
                                       if (ec) ++errors;
                                       order.push_back(i);
                                   });
            }
            io.run();
            CHECK(errors == 0); // never a spurious "queue full"
            REQUIRE(order.size() == 300);
            CHECK(std::is_sorted(order.begin(), order.end()));
        }
    }

    TEST_CASE("a request refused by the local checks completes with that error, not inline") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            boost::system::error_code got;
            int calls = 0;
            p.a.qp.async_write(p.a.mr.slice(0, 64), p.b.mr.remote(), p.b.mr.length(),
                               [&](boost::system::error_code ec, std::size_t) {
                                   got = ec;
                                   ++calls;
                               });
            CHECK(calls == 0);
            io.run();
            CHECK(calls == 1);
            CHECK(got == errc::remote_range_outside_region);
        }
    }

    TEST_CASE("a QP forced into error flushes its waiting receives to their handlers") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            std::vector<std::error_code> results;
            for (int i = 0; i < 5; ++i) {
                p.b.qp.async_receive(p.b.mr.slice(0, 64),
                                     [&](boost::system::error_code ec, Received) { results.push_back(ec); });
            }
            io.poll(); // posts them
            REQUIRE_FALSE(p.b.qp.force_error());
            io.run();
            REQUIRE(results.size() == 5);
            for (auto& ec : results) CHECK(ec == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        }
    }

    TEST_CASE("reset is refused while asynchronous operations are outstanding, and works once they are done") {
        asio::io_context io;
        Pair p(io.get_executor(), modes[0]);
        std::optional<boost::system::error_code> result;
        p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) { result = ec; });
        io.poll(); // posted
        try {
            (void)std::move(p.b.qp).reset();
            FAIL("reset went ahead with a receive outstanding");
        } catch (const Error& e) {
            CHECK(e.code() == errc::invalid_argument);
            CHECK(std::string(e.what()).find("has asynchronous operations outstanding") != std::string::npos);
        }
        REQUIRE(p.b.qp); // left as it was
        REQUIRE_FALSE(p.b.qp.force_error());
        io.run();
        REQUIRE(result.has_value());
        CHECK(*result == make_wc_error(IBV_WC_WR_FLUSH_ERR));
        PreparedQueuePair again = std::move(p.b.qp).reset();
        CHECK(again);
    }

    TEST_CASE("an operation started right after a QueuePair is dropped still gets its completion (event-driven)") {
        asio::io_context io;
        Pair p(io.get_executor(), modes[0]);
        // A second pair on the same completion queues.
        PreparedQueuePair pa(p.a.pd, p.a.cq, p.a.cq), pb(p.b.pd, p.b.cq, p.b.cq);
        (void)pa.advertise(p.a.mr);
        (void)pb.advertise(p.b.mr);
        Endpoint ea = pa.endpoint(), eb = pb.endpoint();
        QueuePair qa = std::move(pa).connect(eb), qb = std::move(pb).connect(ea);
        std::optional<boost::system::error_code> first, second;
        p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) { first = ec; });
        io.poll(); // posted: b's driver now waits on its completion channel
        // Dropping the QP aborts the receive and cancels the idle wait; before the
        // cancelled wait's handler runs, a new receive relies on that wait.
        p.b.qp = QueuePair();
        qb.async_receive(p.b.mr.slice(64, 64), [&](boost::system::error_code ec, Received) { second = ec; });
        std::memset(p.a.memory.data(), 0x5a, 64);
        qa.async_send(p.a.mr.slice(0, 64), [](boost::system::error_code, std::size_t) {});
        io.run_for(std::chrono::seconds(10)); // returns early once everything completed
        REQUIRE(first.has_value());
        CHECK(*first == aborted);
        REQUIRE(second.has_value()); // the bug this guards against: never completed
        CHECK_FALSE(*second);
        CHECK(p.b.memory[64] == std::byte{0x5a});
    }

    TEST_CASE("destroying the QueuePair aborts its outstanding operations once each") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            int calls = 0, aborted_calls = 0;
            for (int i = 0; i < 4; ++i) {
                p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) {
                    ++calls;
                    if (ec == aborted) ++aborted_calls;
                });
            }
            io.poll();
            p.b.qp = QueuePair();
            io.run();
            CHECK(calls == 4);
            CHECK(aborted_calls == 4);
        }
    }

    TEST_CASE("destroying the CompletionQueue aborts what is outstanding on it") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            int aborted_calls = 0;
            for (int i = 0; i < 3; ++i) {
                p.b.qp.async_receive(p.b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) {
                    if (ec == aborted) ++aborted_calls;
                });
            }
            io.poll();
            p.b.cq = CompletionQueue();
            io.run();
            CHECK(aborted_calls == 3);
        }
    }

    TEST_CASE("an io_context stopped with work pending: objects destroyed, handlers run once when it runs again") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            auto p = std::make_unique<Pair>(io.get_executor(), mode);
            int calls = 0;
            for (int i = 0; i < 3; ++i) {
                p->b.qp.async_receive(p->b.mr.slice(0, 64), [&](boost::system::error_code ec, Received) {
                    CHECK(ec == aborted);
                    ++calls;
                });
            }
            io.poll();
            io.stop();
            p.reset(); // everything destroyed while the io_context is stopped
            CHECK(calls == 0);
            io.restart();
            io.run();
            CHECK(calls == 3);
        }
    }

    TEST_CASE("an io_context destroyed with work pending destroys the handlers without running them") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            auto token = std::make_shared<int>(0);
            int calls = 0;
            {
                auto io = std::make_unique<asio::io_context>();
                auto p = std::make_unique<Pair>(io->get_executor(), mode);
                for (int i = 0; i < 3; ++i) {
                    p->b.qp.async_receive(p->b.mr.slice(0, 64),
                                          [&, token](boost::system::error_code, Received) { ++calls; });
                }
                io->poll();
                CHECK(token.use_count() == 4);
                p.reset();
                io.reset();
            }
            CHECK(calls == 0);
            CHECK(token.use_count() == 1); // every handler was destroyed: nothing leaked
        }
    }

    TEST_CASE("a peer that dies fails the outstanding operations, nothing hangs") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            ConnectOptions fast;
            fast.timeout = 8;
            fast.retry_count = 1;
            Pair p(io.get_executor(), mode, 1 << 20, {}, fast);
            p.b.qp = QueuePair(); // the peer's QP is gone
            io.poll();
            io.restart(); // poll() ran out of work, which stops an io_context
            int calls = 0, failed = 0;
            for (int i = 0; i < 10; ++i) {
                p.a.qp.async_write(p.a.mr.slice(0, 4096), p.b.mr.remote(), 0,
                                   [&](boost::system::error_code ec, std::size_t) {
                                       ++calls;
                                       if (ec) ++failed;
                                   });
            }
            io.run_for(30s);
            CAPTURE(calls);
            CAPTURE(failed);
            CHECK(calls == 10);
            CHECK(failed == 10);
        }
    }

    TEST_CASE("a QP whose CQ is not bound to an executor refuses asynchronous operations clearly") {
        gpuverbs::test::Pair plain;
        asio::io_context io;
        boost::system::error_code got;
        plain.a.qp.async_write(plain.a.mr.slice(0, 8), plain.b.mr.remote(), 0,
                               asio::bind_executor(io, [&](boost::system::error_code ec, std::size_t) { got = ec; }));
        io.run();
        CHECK(got == errc::no_executor);
        CHECK(got.message().find("bound to an executor") != std::string::npos);
    }

    TEST_CASE("steady state allocates nothing per operation") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io(1);
            Pair p(io.get_executor(), mode);
            int remaining = 0;
            std::function<void()> next; // allocated once, before measuring
            auto run_ops = [&](int count) {
                remaining = count;
                struct Step {
                    Pair* p;
                    int* remaining;
                    void operator()(boost::system::error_code ec, std::size_t) const {
                        REQUIRE_FALSE(ec);
                        if (--*remaining > 0) p->a.qp.async_write(p->a.mr.slice(0, 64), p->b.mr.remote(), 0, *this);
                    }
                };
                p.a.qp.async_write(p.a.mr.slice(0, 64), p.b.mr.remote(), 0, Step{&p, &remaining});
                io.restart();
                io.run();
            };
            run_ops(200); // warm Asio's recycling caches
            std::size_t before = gpuverbs::test::allocations();
            run_ops(2000);
            std::size_t after = gpuverbs::test::allocations();
            CHECK(remaining == 0);
            MESSAGE("allocations per operation: " << double(after - before) / 2000);
            CHECK(after - before == 0);
        }
    }

    TEST_CASE("async_receive on a QP that receives through an SRQ gets the same clear error as post_receive") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Device dev = Device::open(gpuverbs::test::rig_devices()->dev1);
            Device other = Device::open(gpuverbs::test::rig_devices()->dev0);
            ProtectionDomain pd(dev), pd0(other);
            CompletionQueue cq(dev, 64, io.get_executor(), mode), cq0(other, 64);
            SharedReceiveQueue srq(pd, 16);
            std::vector<std::byte> m(4096);
            MemoryRegion mr(pd, m, access_all);
            PreparedQueuePair a(pd, cq, cq, srq), b(pd0, cq0, cq0);
            Endpoint ea = a.endpoint(), eb = b.endpoint();
            QueuePair qp = std::move(a).connect(eb);
            QueuePair peer = std::move(b).connect(ea);
            const std::error_code sync = qp.post_receive(mr.slice(0, 64));
            boost::system::error_code async;
            int calls = 0;
            qp.async_receive(mr.slice(0, 64), [&](boost::system::error_code ec, Received) {
                async = ec;
                ++calls;
            });
            io.run();
            CHECK(calls == 1);
            CHECK(sync == errc::receives_through_srq);
            CHECK(async == boost::system::error_code(sync));
            CHECK(async.message() == sync.message());
        }
    }

    TEST_CASE("an async inline write carries its payload, verified byte for byte, from an unregistered buffer") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            QueuePairOptions options;
            options.max_inline_data = 64;
            Pair p(io.get_executor(), mode, 1 << 16, options);
            std::array<std::byte, 48> payload{};
            gpuverbs::test::fill_pattern(payload, 21);
            boost::system::error_code got = asio::error::would_block;
            std::size_t bytes = 0;
            p.a.qp.async_post(WorkRequest::write(unregistered(payload), p.b.mr.remote(), 100).inline_data(),
                              [&](boost::system::error_code ec, std::size_t n) {
                                  got = ec;
                                  bytes = n;
                              });
            payload.fill(std::byte{0}); // inline: the payload was copied when posted
            io.run();
            CHECK_FALSE(got);
            CHECK(bytes == 48);
            CHECK(gpuverbs::test::has_pattern(std::span(p.b.memory).subspan(100, 48), 21));
            // Too long for inline: the same error as the synchronous form.
            std::array<std::byte, 65> big{};
            p.a.qp.async_post(WorkRequest::write(unregistered(big), p.b.mr.remote()).inline_data(),
                              [&](boost::system::error_code ec, std::size_t) { got = ec; });
            io.restart();
            io.run();
            CHECK(got == errc::inline_too_large);
        }
    }

    TEST_CASE("an async gather write and a scatter receive move every byte where the lists say") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            QueuePairOptions options;
            options.max_send_sge = 3;
            options.max_recv_sge = 3;
            Pair p(io.get_executor(), mode, 1 << 16, options);
            gpuverbs::test::fill_pattern(std::span(p.a.memory).first(3000), 5);
            const std::array<LocalBuffer, 3> gather{p.a.mr.slice(0, 1000), p.a.mr.slice(1000, 1500),
                                                    p.a.mr.slice(2500, 500)};
            boost::system::error_code wrote = asio::error::would_block;
            std::size_t bytes = 0;
            p.a.qp.async_post(WorkRequest::write(gather, p.b.mr.remote(), 4096),
                              [&](boost::system::error_code ec, std::size_t n) {
                                  wrote = ec;
                                  bytes = n;
                              });
            io.run();
            CHECK_FALSE(wrote);
            CHECK(bytes == 3000);
            CHECK(std::memcmp(p.a.memory.data(), p.b.memory.data() + 4096, 3000) == 0);
            // A scatter receive of a send: three pieces, reassembled.
            const std::array<LocalBuffer, 3> scatter{p.b.mr.slice(20000, 100), p.b.mr.slice(30000, 200),
                                                     p.b.mr.slice(40000, 700)};
            Received got{};
            boost::system::error_code received = asio::error::would_block;
            p.b.qp.async_receive(std::span<const LocalBuffer>(scatter), [&](boost::system::error_code ec, Received r) {
                received = ec;
                got = r;
            });
            p.a.qp.async_send(p.a.mr.slice(0, 1000), [](boost::system::error_code, std::size_t) {});
            io.restart();
            io.run();
            CHECK_FALSE(received);
            CHECK(got.bytes == 1000);
            CHECK(std::memcmp(p.b.memory.data() + 20000, p.a.memory.data(), 100) == 0);
            CHECK(std::memcmp(p.b.memory.data() + 30000, p.a.memory.data() + 100, 200) == 0);
            CHECK(std::memcmp(p.b.memory.data() + 40000, p.a.memory.data() + 300, 700) == 0);
        }
    }

    TEST_CASE("cancelling an operation still waiting for a slot completes it with operation_aborted, unposted") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            QueuePairOptions options;
            options.max_send_wr = 2;
            Pair p(io.get_executor(), mode, 1 << 16, options);
            const std::size_t depth = p.a.qp.capabilities().max_send_wr;
            std::vector<boost::system::error_code> results(depth + 2, asio::error::would_block);
            asio::cancellation_signal cancel_last;
            std::fill_n(p.b.memory.begin(), 8192, std::byte{0});
            std::fill_n(p.a.memory.begin(), 8192, std::byte{0x77});
            for (std::size_t i = 0; i < depth + 2; ++i) {
                auto handler = [&results, i](boost::system::error_code ec, std::size_t) { results[i] = ec; };
                const LocalBuffer src = p.a.mr.slice(i * 64, 64);
                if (i == depth + 1) {
                    p.a.qp.async_write(src, p.b.mr.remote(), i * 64,
                                       asio::bind_cancellation_slot(cancel_last.slot(), handler));
                } else {
                    p.a.qp.async_write(src, p.b.mr.remote(), i * 64, handler);
                }
            }
            // The last one waits behind a full queue: cancel it before anything completes.
            cancel_last.emit(asio::cancellation_type::terminal);
            io.run();
            for (std::size_t i = 0; i <= depth; ++i) CHECK_FALSE(results[i]);
            CHECK(results[depth + 1] == aborted);
            CHECK(p.b.memory[(depth + 1) * 64] == std::byte{0}); // never posted, never written
            CHECK(p.b.memory[depth * 64] == std::byte{0x77});
            CHECK(p.a.cq.async_statistics().cancelled == 1);
        }
    }

    TEST_CASE("a cancellation of an operation already posted is ignored: it completes with its result") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            asio::cancellation_signal cancel;
            boost::system::error_code got = asio::error::would_block;
            std::size_t bytes = 0;
            p.a.qp.async_write(
                p.a.mr.slice(0, 512), p.b.mr.remote(), 0,
                asio::bind_cancellation_slot(cancel.slot(), [&](boost::system::error_code ec, std::size_t n) {
                    got = ec;
                    bytes = n;
                }));
            cancel.emit(asio::cancellation_type::terminal);
            io.run();
            CHECK_FALSE(got);
            CHECK(bytes == 512);
            CHECK(p.a.cq.async_statistics().cancelled == 0);
        }
    }

    TEST_CASE("the initiation exposes the queue pair's executor to the token machinery") {
        asio::io_context io;
        Pair p(io.get_executor(), modes[0]);
        // async_initiate hands the initiation to the token: a deferred operation
        // launched later still runs on the CQ's executor.
        auto op = p.a.qp.async_write(p.a.mr.slice(0, 64), p.b.mr.remote(), 0, asio::deferred);
        bool ran_on_io = false;
        std::move(op)([&](boost::system::error_code ec, std::size_t) {
            CHECK_FALSE(ec);
            ran_on_io = io.get_executor().running_in_this_thread();
        });
        io.run();
        CHECK(ran_on_io);
    }

    TEST_CASE("a deferred operation launched after its QueuePair was destroyed completes once with operation_aborted") {
        for (const auto& mode : modes) {
            CAPTURE(mode_name(mode));
            asio::io_context io;
            Pair p(io.get_executor(), mode);
            // Made while the QueuePair exists, launched after it is gone (the
            // initiation must not reach the destroyed queue pair: ASan checks).
            auto write = p.a.qp.async_write(p.a.mr.slice(0, 64), p.b.mr.remote(), 0, asio::deferred);
            auto receive = p.a.qp.async_receive(p.a.mr.slice(64, 64), asio::deferred);
            p.a.qp = QueuePair();
            int writes = 0, receives = 0;
            boost::system::error_code write_ec, receive_ec;
            std::move(write)([&](boost::system::error_code ec, std::size_t n) {
                ++writes;
                write_ec = ec;
                CHECK(n == 0);
            });
            std::move(receive)([&](boost::system::error_code ec, Received) {
                ++receives;
                receive_ec = ec;
            });
            CHECK(writes == 0); // never from inside the launching call
            io.run();
            CHECK(writes == 1);
            CHECK(receives == 1);
            CHECK(write_ec == aborted);
            CHECK(receive_ec == aborted);
        }
    }
}
