// The transfer's decisions as a pure state machine, without a device (as
// Boost.Redis tests its exec_fsm): failover, the notification, stopping, the
// end of the transfer and its report — one transition per case, then a model
// of the device that finishes the machine's streams in random order with
// random outcomes (completions of any size, late and doubled events) and
// checks the transfer's promises after every event against its own account,
// safety and progress both. scripts/mutate holds these tests to killing the
// machine's one-line mutants (docs/testing.md lists the survivors).
#include "gpuverbs/detail/transfers/transfer_fsm.hpp"
#include "gpuverbs/detail/async/async_token.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace gpuverbs;
using namespace gpuverbs::detail;
using Kind = TransferFsm::Action::Kind;
using Why = TransferFsm::Why;
using Phase = TransferFsm::Phase;

namespace {

const std::error_code timed_out = std::make_error_code(std::errc::timed_out);

// The world as the machine is told of it: which rails are usable, which reach
// the notification's region (the inputs `usable` and `reaches` view `up` and
// `reach`), and a striping (equal counts over the weighted rails, or random
// cuts when a generator is given).
struct FakeRails final : TransferFsm::Rails {
    std::vector<std::uint8_t> up;
    std::vector<std::uint8_t> reach;
    std::mt19937_64* random = nullptr;
    bool misused = false; ///< asked to stripe into spans of the wrong size (indexes out of range abort under
                          ///< _GLIBCXX_ASSERTIONS, as scripts/mutate builds it)

    explicit FakeRails(std::size_t n) : up(n, 1), reach(n, 1) { view(); }
    FakeRails(const FakeRails& o) : up(o.up), reach(o.reach), random(o.random), misused(o.misused) { view(); }
    FakeRails& operator=(const FakeRails& o) {
        up = o.up;
        reach = o.reach;
        random = o.random;
        misused = o.misused;
        view();
        return *this;
    }
    ~FakeRails() = default;
    void view() {
        usable = up;
        reaches = reach;
    }
    void stripe(std::uint32_t first, std::uint32_t end, std::span<const std::uint64_t> weights,
                std::span<std::uint32_t> bounds) override {
        if (weights.size() != up.size() || bounds.size() != weights.size() + 1 || first >= end) {
            misused = true;
            return;
        }
        std::vector<std::size_t> weighted;
        for (std::size_t k = 0; k < weights.size(); ++k) {
            if (weights[k] > 0) weighted.push_back(k);
        }
        // Each weighted rail's end, in order: equal counts, or random cuts (sorted).
        std::vector<std::uint32_t> ends(weighted.size(), end);
        const std::uint32_t n = end - first;
        for (std::size_t t = 0; t + 1 < weighted.size(); ++t) {
            ends[t] = random != nullptr ? first + static_cast<std::uint32_t>((*random)() % (n + 1))
                                        : first + static_cast<std::uint32_t>(n * (t + 1) / weighted.size());
        }
        std::sort(ends.begin(), ends.end());
        std::uint32_t at = first;
        std::size_t t = 0;
        for (std::size_t k = 0; k < weights.size(); ++k) {
            bounds[k] = at;
            if (weights[k] > 0) at = ends[t++];
        }
        bounds[weights.size()] = end;
    }
};

// A stream's end: every request landed.
TransferFsm::StreamEnd landed(const TransferFsm& fsm, std::uint32_t id) {
    const auto& s = fsm.streams()[id];
    return {id, s.end, s.end, {}, StreamFailure::none, false, false};
}
// … a completion failed with `status` after [first, landed) landed and [landed, posted) went out.
TransferFsm::StreamEnd failed(std::uint32_t id, std::uint32_t landed_end, std::uint32_t posted_end,
                              ibv_wc_status status) {
    const std::error_code ec = make_wc_error(status);
    return {id, landed_end, posted_end, ec, classify_stream_failure(ec, status, false, false), true, false};
}
// … ended from outside (its queue pair destroyed, or stopped).
TransferFsm::StreamEnd aborted(std::uint32_t id, std::uint32_t landed_end, std::uint32_t posted_end) {
    return {id,
            landed_end,
            posted_end,
            aborted_error(),
            classify_stream_failure(aborted_error(), IBV_WC_SUCCESS, false, false),
            false,
            false};
}

std::vector<RequestState> states(const TransferFsm& fsm, std::size_t n) {
    std::vector<RequestState> out(n);
    fsm.request_states(out);
    return out;
}

} // namespace

TEST_SUITE("the transfer's state machine") {
    TEST_CASE("a rail's failure is a path failure when another rail may do better, and a request failure otherwise") {
        auto kind = [](ibv_wc_status s) { return classify_stream_failure(make_wc_error(s), s, false, false); };
        for (ibv_wc_status s :
             {IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_LOC_QP_OP_ERR,
              IBV_WC_FATAL_ERR, IBV_WC_RESP_TIMEOUT_ERR, IBV_WC_GENERAL_ERR, IBV_WC_REM_ABORT_ERR}) {
            CHECK(kind(s) == StreamFailure::path);
        }
        for (ibv_wc_status s : {IBV_WC_REM_ACCESS_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR,
                                IBV_WC_MW_BIND_ERR}) {
            CHECK(kind(s) == StreamFailure::request);
        }
        // No completion failed: its queue pair destroyed, or found broken by gpuverbs.
        for (std::error_code ec : {aborted_error(), std::error_code(errc::queue_pair_in_error),
                                   std::error_code(errc::queue_pair_stalled), std::error_code(errc::port_down)}) {
            CHECK(classify_stream_failure(ec, IBV_WC_SUCCESS, false, false) == StreamFailure::path);
        }
        CHECK(classify_stream_failure(errc::invalid_argument, IBV_WC_SUCCESS, false, false) == StreamFailure::request);
        const std::error_code refused(EINVAL, std::system_category());
        CHECK(classify_stream_failure(refused, IBV_WC_SUCCESS, true, false) == StreamFailure::path);
        // The notification consumes a receive: never moved, whatever the status.
        CHECK(classify_stream_failure(make_wc_error(IBV_WC_RETRY_EXC_ERR), IBV_WC_RETRY_EXC_ERR, false, true) ==
              StreamFailure::notification);
        CHECK(classify_stream_failure({}, IBV_WC_SUCCESS, false, false) == StreamFailure::none);
    }

    TEST_CASE("the rails with requests are submitted at start; a rail with an empty range is not") {
        TransferFsm fsm;
        FakeRails rails(3);
        const std::array<std::uint32_t, 4> bounds{0, 4, 4, 8};
        const auto a = fsm.start(bounds, true, false, rails);
        CHECK(a.kind == Kind::submit);
        CHECK(a.first_stream == 0);
        CHECK(a.end_stream == 3);
        CHECK(fsm.streams()[0].running);
        CHECK_FALSE(fsm.streams()[1].running);
        CHECK(fsm.streams()[2].running);
        CHECK(fsm.phase() == Phase::running);
    }

    TEST_CASE("a transfer whose every stream landed finishes with success and every request landed") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, false, rails);
        CHECK(fsm.stream_finished(landed(fsm, 1), rails).kind == Kind::wait);
        const auto a = fsm.stream_finished(landed(fsm, 0), rails);
        CHECK(a.kind == Kind::finish);
        CHECK_FALSE(fsm.error());
        CHECK_FALSE(fsm.destroyed());
        CHECK(states(fsm, 6) == std::vector<RequestState>(6, RequestState::landed));
    }

    TEST_CASE(
        "the notification is armed once every stream landed, on the first rail, and its success ends the transfer") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        CHECK(fsm.stream_finished(landed(fsm, 0), rails).kind == Kind::wait);
        const auto a = fsm.stream_finished(landed(fsm, 1), rails);
        CHECK(a.kind == Kind::notify);
        CHECK(a.rail == 0);
        CHECK(fsm.phase() == Phase::notifying);
        CHECK(fsm.streams()[0].running);
        CHECK(fsm.stream_finished({0, 0, 0, {}, StreamFailure::none, false, false}, rails).kind == Kind::finish);
        CHECK_FALSE(fsm.error());
        CHECK(states(fsm, 6) == std::vector<RequestState>(6, RequestState::landed)); // its data kept
    }

    TEST_CASE(
        "a deadline or cancellation while the notification is in flight abandons it once (the transfer's error is "
        "the reason, never success), and does nothing in any other phase") {
        for (const std::error_code reason :
             {std::make_error_code(std::errc::timed_out), std::make_error_code(std::errc::operation_canceled)}) {
            TransferFsm fsm;
            FakeRails rails(2);
            const std::array<std::uint32_t, 3> bounds{0, 3, 6};
            fsm.start(bounds, true, true, rails);
            CHECK(fsm.abandon_notification(reason).kind == Kind::wait); // running: a stop's business
            CHECK(fsm.stream_finished(landed(fsm, 0), rails).kind == Kind::wait);
            REQUIRE(fsm.stream_finished(landed(fsm, 1), rails).kind == Kind::notify);
            const auto a = fsm.abandon_notification(reason);
            CHECK(a.kind == Kind::abandon_notification);
            CHECK(a.rail == 0);
            CHECK(fsm.notification_rail() == 0);
            CHECK(fsm.abandon_notification(reason).kind == Kind::wait); // once
            // The notification's stream then fails (its queue pair failed under it): the transfer ends with the
            // reason, in the words of an abandoned notification.
            const auto end = fsm.stream_finished(
                {0, 0, 0, make_wc_error(IBV_WC_WR_FLUSH_ERR), StreamFailure::notification, true, false}, rails);
            CHECK(end.kind == Kind::finish);
            CHECK(end.why == Why::notification_abandoned);
            CHECK(fsm.error() == reason);
            CHECK(states(fsm, 6) == std::vector<RequestState>(6, RequestState::landed)); // every block landed
            // Had the notification completed before its queue pair failed, the peer has it: success.
            TransferFsm late;
            late.start(bounds, true, true, rails);
            (void)late.stream_finished(landed(late, 0), rails);
            (void)late.stream_finished(landed(late, 1), rails);
            (void)late.abandon_notification(reason);
            CHECK(late.stream_finished({0, 0, 0, {}, StreamFailure::none, false, false}, rails).kind == Kind::finish);
            CHECK_FALSE(late.error());
        }
    }

    TEST_CASE("a path failure moves the requests not known to have landed, from the failed stream's landed end") {
        TransferFsm fsm;
        FakeRails rails(3);
        const std::array<std::uint32_t, 4> bounds{0, 5, 10, 15};
        fsm.start(bounds, true, false, rails);
        // Rail 1 failed with [5, 7) landed and [7, 9) posted: [7, 10) goes to rails 0 and 2.
        auto a = fsm.stream_finished(failed(1, 7, 9, IBV_WC_RETRY_EXC_ERR), rails);
        REQUIRE(a.kind == Kind::make_streams);
        REQUIRE(a.end_stream - a.first_stream == 2);
        const auto t0 = fsm.streams()[a.first_stream];
        const auto t1 = fsm.streams()[a.first_stream + 1];
        CHECK(t0.rail == 0);
        CHECK(t0.first == 7);
        CHECK(t1.rail == 2);
        CHECK(t0.end == t1.first);
        CHECK(t1.end == 10);
        a = fsm.takeover_made(true, rails);
        CHECK(a.kind == Kind::submit);
        CHECK(a.record_failure);
        CHECK(a.why == Why::none);
        CHECK_FALSE(fsm.error());
        CHECK(fsm.rails()[1].error == make_wc_error(IBV_WC_RETRY_EXC_ERR));
        CHECK(fsm.rails()[1].taken_over == 3);
        CHECK(fsm.rails()[0].took_over + fsm.rails()[2].took_over == 3);
        for (std::uint32_t id : {0U, 2U, a.first_stream, a.first_stream + 1})
            fsm.stream_finished(landed(fsm, id), rails);
        CHECK(fsm.phase() == Phase::finished);
        CHECK_FALSE(fsm.error());
        CHECK(states(fsm, 15) == std::vector<RequestState>(15, RequestState::landed));
    }

    TEST_CASE("a failed stream whose every request had landed needs no takeover and fails nothing") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 2, 4};
        fsm.start(bounds, true, false, rails);
        const auto a = fsm.stream_finished(aborted(1, 4, 4), rails);
        CHECK(a.kind == Kind::wait);
        CHECK(a.record_failure);
        CHECK_FALSE(fsm.error());
        CHECK(fsm.rails()[1].taken_over == 0);
        CHECK(fsm.stream_finished(landed(fsm, 0), rails).kind == Kind::finish);
        CHECK_FALSE(fsm.error());
    }

    TEST_CASE("a request failure fails the transfer on the spot: nothing is moved, the others drain") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        auto a = fsm.stream_finished(failed(0, 1, 3, IBV_WC_REM_ACCESS_ERR), rails);
        CHECK(a.kind == Kind::wait);
        CHECK(a.why == Why::stream_failed);
        CHECK(fsm.phase() == Phase::draining);
        CHECK(fsm.error() == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        // A later path failure moves nothing either, and the first error stays.
        a = fsm.stream_finished(failed(1, 3, 5, IBV_WC_RETRY_EXC_ERR), rails);
        CHECK(a.kind == Kind::finish); // no notification after a failure
        CHECK(a.why == Why::none);
        CHECK(a.record_failure);
        CHECK(fsm.error() == make_wc_error(IBV_WC_REM_ACCESS_ERR));
        CHECK(states(fsm, 6) == std::vector<RequestState>{RequestState::landed, RequestState::uncertain,
                                                          RequestState::uncertain, RequestState::uncertain,
                                                          RequestState::uncertain, RequestState::not_posted});
    }

    TEST_CASE("a path failure with no usable rail left fails the transfer with the every-rail-failed words") {
        TransferFsm fsm;
        FakeRails rails(2);
        rails.up[0] = false; // rail 0's queue pair is gone
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, false, rails);
        const auto a = fsm.stream_finished(failed(1, 4, 5, IBV_WC_RETRY_EXC_ERR), rails);
        CHECK(a.why == Why::every_rail_failed);
        CHECK(a.record_failure);
        CHECK(fsm.error() == make_wc_error(IBV_WC_RETRY_EXC_ERR));
    }

    TEST_CASE("a takeover that cannot be made fails the transfer as if no rail were left, counting nothing") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, false, rails);
        REQUIRE(fsm.stream_finished(failed(1, 4, 5, IBV_WC_RETRY_EXC_ERR), rails).kind == Kind::make_streams);
        const auto a = fsm.takeover_made(false, rails);
        CHECK(a.kind == Kind::wait);
        CHECK(a.why == Why::every_rail_failed);
        CHECK(fsm.streams().size() == 2);
        CHECK(fsm.rails()[1].taken_over == 0);
        CHECK(fsm.rails()[0].took_over == 0);
    }

    TEST_CASE("without failover (one rail, or turned off) a path failure fails the transfer with its own words") {
        for (bool one_rail : {true, false}) {
            TransferFsm fsm;
            FakeRails rails(one_rail ? 1 : 2);
            const std::array<std::uint32_t, 3> two{0, 3, 6};
            const std::array<std::uint32_t, 2> one{0, 6};
            if (one_rail) {
                fsm.start(one, true, false, rails);
            } else {
                fsm.start(two, false, false, rails);
            }
            const auto a = fsm.stream_finished(failed(0, 1, 2, IBV_WC_RETRY_EXC_ERR), rails);
            CHECK(a.why == Why::stream_failed);
            CHECK(fsm.error() == make_wc_error(IBV_WC_RETRY_EXC_ERR));
        }
    }

    TEST_CASE("a stop while running pins the job; it ends with the reason once the pin and every stream are done") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        CHECK(fsm.stoppable());
        auto a = fsm.stop(timed_out);
        CHECK(a.kind == Kind::stop_streams);
        CHECK(a.why == Why::stopped);
        CHECK(fsm.phase() == Phase::stopping);
        CHECK_FALSE(fsm.stoppable());
        CHECK(fsm.stop(aborted_error()).kind == Kind::wait); // a second stop changes nothing
        CHECK(fsm.stream_finished(aborted(0, 1, 2), rails).kind == Kind::wait);
        CHECK(fsm.rails()[0].error == std::error_code()); // only stopped: not the rail's failure
        // A rail whose own completion failed while stopping is recorded, and not moved.
        a = fsm.stream_finished(failed(1, 3, 4, IBV_WC_RETRY_EXC_ERR), rails);
        CHECK(a.kind == Kind::wait); // the pin holds it open
        CHECK(a.record_failure);
        CHECK(fsm.streams().size() == 2);
        a = fsm.unpin(rails);
        CHECK(a.kind == Kind::finish); // no notification: nothing more is posted
        CHECK(fsm.error() == timed_out);
        CHECK(states(fsm, 6) == std::vector<RequestState>{RequestState::landed, RequestState::uncertain,
                                                          RequestState::not_posted, RequestState::uncertain,
                                                          RequestState::not_posted, RequestState::not_posted});
    }

    TEST_CASE("a stop after an error keeps the first error and takes no words") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, false, rails);
        fsm.stream_finished(failed(0, 0, 1, IBV_WC_REM_ACCESS_ERR), rails);
        const auto a = fsm.stop(aborted_error());
        CHECK(a.kind == Kind::stop_streams);
        CHECK(a.why == Why::none);
        CHECK(fsm.error() == make_wc_error(IBV_WC_REM_ACCESS_ERR));
    }

    TEST_CASE("a stop before the start, while notifying, once finished or once destroyed changes nothing") {
        TransferFsm fsm;
        FakeRails rails(1);
        CHECK(fsm.stop(timed_out).kind == Kind::wait); // idle
        const std::array<std::uint32_t, 2> bounds{0, 2};
        fsm.start(bounds, false, true, rails);
        REQUIRE(fsm.stream_finished(landed(fsm, 0), rails).kind == Kind::notify);
        CHECK(fsm.stop(timed_out).kind == Kind::wait);
        CHECK_FALSE(fsm.error());
        CHECK(fsm.stream_finished({0, 0, 0, {}, StreamFailure::none, false, false}, rails).kind == Kind::finish);
        CHECK(fsm.stop(timed_out).kind == Kind::wait);
        CHECK_FALSE(fsm.error());

        TransferFsm gone;
        FakeRails two(2);
        const std::array<std::uint32_t, 3> halves{0, 1, 2};
        gone.start(halves, true, true, two);
        gone.stream_finished({0, 0, 0, {}, StreamFailure::none, false, true}, two);
        CHECK_FALSE(gone.stoppable());
        CHECK(gone.stop(aborted_error()).kind == Kind::wait);
    }

    TEST_CASE("the execution context destroyed: no takeover, no notification, and the handler is destroyed") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        auto end = aborted(1, 3, 4);
        end.destroyed = true;
        auto a = fsm.stream_finished(end, rails);
        CHECK(a.kind == Kind::wait);
        CHECK(fsm.streams().size() == 2);
        a = fsm.stream_finished(landed(fsm, 0), rails);
        CHECK(a.kind == Kind::finish);
        CHECK(fsm.destroyed());
    }

    TEST_CASE("a failed notification fails the transfer, is never moved and names the notification") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        fsm.stream_finished(landed(fsm, 0), rails);
        REQUIRE(fsm.stream_finished(landed(fsm, 1), rails).kind == Kind::notify);
        const std::error_code ec = make_wc_error(IBV_WC_RETRY_EXC_ERR);
        const auto a = fsm.stream_finished(
            {0, 3, 3, ec, classify_stream_failure(ec, IBV_WC_RETRY_EXC_ERR, false, true), true, false}, rails);
        CHECK(a.kind == Kind::finish);
        CHECK(a.why == Why::stream_failed);
        CHECK(fsm.error() == ec);
        CHECK(fsm.streams().size() == 2);
        CHECK(states(fsm, 6) == std::vector<RequestState>(6, RequestState::landed));
    }

    TEST_CASE("with failover the notification goes to the first rail that has not failed, is usable and reaches it") {
        TransferFsm fsm;
        FakeRails rails(4);
        rails.up[1] = false;
        rails.reach[2] = false;
        const std::array<std::uint32_t, 5> bounds{0, 2, 4, 6, 8};
        fsm.start(bounds, true, true, rails);
        REQUIRE(fsm.stream_finished(failed(0, 2, 2, IBV_WC_RETRY_EXC_ERR), rails).kind == Kind::wait); // all landed
        fsm.stream_finished(landed(fsm, 1), rails);
        fsm.stream_finished(landed(fsm, 2), rails);
        const auto a = fsm.stream_finished(landed(fsm, 3), rails);
        CHECK(a.kind == Kind::notify);
        CHECK(a.rail == 3);
    }

    TEST_CASE("no rail that has not failed reaches the notification: invalid_argument once every request landed") {
        TransferFsm fsm;
        FakeRails rails(2);
        rails.reach = {false, false};
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        fsm.stream_finished(landed(fsm, 0), rails);
        const auto a = fsm.stream_finished(landed(fsm, 1), rails);
        CHECK(a.kind == Kind::finish);
        CHECK(a.why == Why::no_rail_for_notification);
        CHECK(fsm.error() == errc::invalid_argument);
    }

    TEST_CASE("once the notification is armed a rail's failure moves nothing") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 3, 6};
        fsm.start(bounds, true, true, rails);
        fsm.stream_finished(landed(fsm, 0), rails);
        REQUIRE(fsm.stream_finished(landed(fsm, 1), rails).kind == Kind::notify);
        // The notification's queue pair destroyed: a path failure, but never posted twice.
        const auto a = fsm.stream_finished(aborted(0, 3, 3), rails);
        CHECK(a.kind == Kind::finish);
        CHECK(a.why == Why::stream_failed);
        CHECK(fsm.error() == aborted_error());
    }

    TEST_CASE("the report combines every stream that carried a request: landed on any wins, else uncertain if posted") {
        TransferFsm fsm;
        FakeRails rails(2);
        const std::array<std::uint32_t, 3> bounds{0, 4, 8};
        fsm.start(bounds, true, false, rails);
        // Rail 1: [4, 5) landed, [5, 7) uncertain; taken over from 5 by rail 0 alone.
        REQUIRE(fsm.stream_finished(failed(1, 5, 7, IBV_WC_RETRY_EXC_ERR), rails).kind == Kind::make_streams);
        const auto a = fsm.takeover_made(true, rails);
        REQUIRE(a.kind == Kind::submit);
        const auto& t = fsm.streams()[a.first_stream];
        CHECK(t.first == 5);
        CHECK(t.end == 8);
        // The takeover lands 5 and posts 6 when rail 0 fails as a request fails.
        fsm.stream_finished(landed(fsm, 0), rails);
        const auto e = fsm.stream_finished(failed(a.first_stream, 6, 7, IBV_WC_REM_ACCESS_ERR), rails);
        CHECK(e.kind == Kind::finish);
        CHECK(states(fsm, 8) == std::vector<RequestState>{RequestState::landed, RequestState::landed,
                                                          RequestState::landed, RequestState::landed,
                                                          RequestState::landed, RequestState::landed,
                                                          RequestState::uncertain, RequestState::not_posted});
    }
}

namespace {

// What the random sequences exercised (so a change that stops them reaching a path shows).
struct Coverage {
    std::uint64_t takeovers = 0, refused_takeovers = 0, notifications = 0, stops = 0, destroyed = 0, successes = 0,
                  every_rail_failed = 0, abandons = 0, abandoned_failed = 0, late_events = 0, split_ends = 0,
                  port_down_failovers = 0;
};

// The device and the world around one transfer, played at random. The model
// keeps its own account of the transfer from the promises in transfer_fsm.hpp
// and docs/transfers.md, never from the machine's phase or conditions: which
// rails failed, whether an error is due and which, whether a stop was taken,
// what the next action must be. After every event it checks safety (what the
// machine did may be done) and progress (what must happen did: a path failure
// with a usable rail left fails over, a transfer whose every request landed
// and whose notification was taken succeeds, nothing waits once nothing
// runs). It also feeds late and doubled events, which must change nothing.
// A violation is returned as words (fast: no doctest assertion per event).
class Model {
public:
    Model(std::uint64_t seed, Coverage& coverage) : rng_(seed), rails_(1), coverage_(coverage) {
        const std::size_t n_rails = std::array<std::size_t, 3>{1, 2, 4}[rng_() % 3];
        requests_ = 1 + static_cast<std::uint32_t>(rng_() % 12);
        rails_ = FakeRails(n_rails);
        rails_.random = &rng_;
        for (std::size_t k = 0; k < n_rails; ++k) rails_.reach[k] = rng_() % 8 != 0;
        // Contiguous ranges, some empty (a rail of weight 0).
        std::vector<std::uint32_t> cuts;
        for (std::size_t k = 0; k + 1 < n_rails; ++k)
            cuts.push_back(static_cast<std::uint32_t>(rng_() % (requests_ + 1)));
        std::sort(cuts.begin(), cuts.end());
        bounds_.push_back(0);
        bounds_.insert(bounds_.end(), cuts.begin(), cuts.end());
        bounds_.push_back(requests_);
        failover_ = rng_() % 4 != 0;
        notify_ = rng_() % 2 == 0;
        landed_.assign(requests_, false);
        posted_.assign(requests_, false);
        rail_failed_.assign(n_rails, false);
    }

    /// Runs the transfer to its end; empty when every promise held.
    std::string run() {
        const TransferFsm::Action a = fsm_.start(bounds_, failover_, notify_, rails_);
        apply(a);
        for (int step = 0; step < 400 && failure_.empty(); ++step) {
            if (finished_) {
                late_events();
                return check_end();
            }
            const std::uint64_t roll = rng_() % 100;
            if (roll < 66 && !device_.empty()) {
                finish_one();
            } else if (roll < 74) {
                stop();
            } else if (roll < 86 && pinned_) {
                unpin();
            } else if (roll < 92) {
                const std::size_t k = rng_() % rails_.up.size();
                rails_.up[k] = !rails_.up[k];
                note("rail " + std::to_string(k) + (rails_.up[k] ? " up" : " down"));
            } else {
                late_events();
            }
        }
        if (!failure_.empty()) return failure_;
        if (rails_.misused) return "the machine asked about a rail it does not have, or striped wrongly";
        return finished_ ? check_end() : "the transfer did not finish within 400 events";
    }

private:
    void fail(const std::string& what) {
        if (!failure_.empty()) return;
        if (rails_.misused) failure_ = "the machine asked about a rail it does not have, or striped wrongly; ";
        failure_ += what + " (events:";
        for (std::size_t k = trace_.size() > 10 ? trace_.size() - 10 : 0; k < trace_.size(); ++k)
            failure_ += " " + trace_[k] + ";";
        failure_ += ")";
    }
    void note(const std::string& event) { trace_.push_back(event); }

    [[nodiscard]] std::size_t rails() const { return rails_.up.size(); }
    // The machine's failover is on with several rails only.
    [[nodiscard]] bool failover() const { return failover_ && rails() > 1; }
    // Running: no error yet, no stop taken, the notification not armed, not destroyed.
    [[nodiscard]] bool running() const { return !error_ && !stopped_ && !notifying_ && !destroyed_; }

    // A stream's end as the device reports it: its requests completed in
    // pieces of any size (a chain's one signaled completion covers many), and
    // a failure strikes at a piece boundary: [first, landed) landed, the
    // pieces after it up to `posted` were posted, the rest never.
    void outcome(const TransferFsm::Stream& s, bool notification, TransferFsm::StreamEnd& end) {
        const std::uint64_t roll = rng_() % 10;
        end.destroyed = rng_() % 40 == 0;
        if (roll < 4 && !end.destroyed) { // every request landed
            end.landed_end = end.posted_end = s.end;
            return;
        }
        std::vector<std::uint32_t> cuts{s.first};
        while (cuts.back() < s.end) {
            cuts.push_back(std::min(s.end, cuts.back() + 1 + static_cast<std::uint32_t>(rng_() % 4)));
        }
        coverage_.split_ends += cuts.size() > 2 ? 1 : 0;
        const std::size_t landed_piece = rng_() % cuts.size();
        const std::size_t posted_piece = landed_piece + rng_() % (cuts.size() - landed_piece);
        end.landed_end = cuts[landed_piece];
        end.posted_end = cuts[posted_piece];
        static constexpr std::array<ibv_wc_status, 6> statuses{IBV_WC_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR,
                                                               IBV_WC_LOC_QP_OP_ERR, IBV_WC_REM_ACCESS_ERR,
                                                               IBV_WC_LOC_PROT_ERR,  IBV_WC_RNR_RETRY_EXC_ERR};
        ibv_wc_status status = IBV_WC_SUCCESS;
        bool refused = false;
        if (roll < 6 || end.destroyed) { // ended from outside: destroyed, aborted, stopped, or found broken
            static const std::array<std::error_code, 4> outside{aborted_error(), errc::queue_pair_in_error,
                                                                errc::queue_pair_stalled, errc::port_down};
            end.error = outside[rng_() % outside.size()];
            if (end.destroyed && rng_() % 2 == 0) end.error = {};
        } else if (roll < 9) {
            status = statuses[rng_() % statuses.size()];
            end.error = make_wc_error(status);
            end.own_failure = true;
        } else {
            refused = true;
            end.error = std::error_code(EINVAL, std::system_category());
            end.own_failure = true;
        }
        if (!end.error) end.landed_end = end.posted_end = s.end; // a clean end lands everything
        end.failure = classify_stream_failure(end.error, status, refused, notification && end.own_failure);
    }

    // The device finishes one of the streams it holds.
    void finish_one() {
        const std::size_t at = rng_() % device_.size();
        const std::uint32_t id = device_[at];
        device_.erase(device_.begin() + static_cast<std::ptrdiff_t>(at));
        finished_streams_.push_back(id);
        const TransferFsm::Stream s = fsm_.streams()[id];
        const bool notification = notifying_ && id == notify_rail_;
        TransferFsm::StreamEnd end;
        end.stream = id;
        outcome(s, notification, end);
        note("stream " + std::to_string(id) + " (rail " + std::to_string(s.rail) + ") ended: landed to " +
             std::to_string(end.landed_end) + " of [" + std::to_string(s.first) + ", " + std::to_string(s.end) + "), " +
             (end.error ? end.error.message() : std::string("ok")) + (end.destroyed ? ", destroyed" : "") +
             (notification ? ", the notification" : ""));
        if (!notification) {
            for (std::uint32_t i = s.first; i < end.posted_end; ++i) posted_[i] = true;
            for (std::uint32_t i = s.first; i < end.landed_end; ++i) landed_[i] = true;
        }
        const bool was_running = running();
        if (end.destroyed) destroyed_ = true;
        // What must follow, from the model's own account.
        Expect want;
        if (end.error) {
            // A rail's first failure is recorded, unless only stopped while the transfer was stopping.
            want.record = !rail_failed_[s.rail] && (!stopped_ || end.own_failure);
            if (want.record) rail_failed_[s.rail] = true;
            if (notification) {
                want.error = abandoned_ ? abandon_reason_ : end.error;
                want.why = abandoned_ ? Why::notification_abandoned : Why::stream_failed;
            } else if (failover() && was_running && !destroyed_ && end.failure == StreamFailure::path) {
                bool left = false;
                for (std::size_t j = 0; j < rails(); ++j)
                    left = left || (j != s.rail && !rail_failed_[j] && rails_.up[j]);
                if (!left) {
                    want.error = end.error;
                    want.why = Why::every_rail_failed;
                } else if (end.landed_end < s.end) {
                    want.takeover = true; // progress: a usable rail is left and requests did not land
                }
            } else {
                want.error = end.error;
                want.why = Why::stream_failed;
            }
        }
        TransferFsm::Action a = fsm_.stream_finished(end, rails_);
        if (want.takeover != (a.kind == Kind::make_streams)) {
            fail(want.takeover ? "a path failure with a usable rail left did not fail over"
                               : "a takeover where none may be");
            return;
        }
        if (a.kind == Kind::make_streams) {
            check_takeover(a, s, end);
            coverage_.port_down_failovers += end.error == errc::port_down ? 1 : 0;
            const bool made = rng_() % 10 != 0;
            a = fsm_.takeover_made(made, rails_);
            ++(made ? coverage_.takeovers : coverage_.refused_takeovers);
            if (!made) {
                want.error = end.error;
                want.why = Why::every_rail_failed;
            }
        }
        if (want.record != a.record_failure) fail("a rail's failure was recorded wrongly");
        for (std::size_t j = 0; j < rails(); ++j) {
            if (rail_failed_[j] != static_cast<bool>(fsm_.rails()[j].error)) fail("a rail's failure disagrees");
        }
        if (notification && abandoned_ && end.error && !error_) ++coverage_.abandoned_failed;
        if (want.why == Why::every_rail_failed && !error_) ++coverage_.every_rail_failed;
        expect_error(want.error, want.why, a.why);
        apply(a);
    }

    struct Expect {
        bool takeover = false;
        bool record = false;
        std::error_code error; ///< the error this event sets, when none was set before
        Why why = Why::none;
    };

    // The first error stays; this event sets `error` (with `why`) when none was set before.
    void expect_error(std::error_code error, Why why, Why got) {
        // The end with no rail for the notification: apply() judges it (whether it was due, and its error).
        if (got == Why::no_rail_for_notification && !error && !error_) return;
        if (error_) {
            if (got != Why::none) fail("words written for an error after the first");
        } else if (error) {
            error_ = error;
            if (got != why) fail("the error's words name the wrong reason");
        } else if (got != Why::none) {
            fail("an error came from nowhere");
        }
        if (fsm_.error() != error_) fail("the transfer's error is not the first error due");
    }

    void stop() {
        const std::error_code reason = rng_() % 2 == 0 ? timed_out : aborted_error();
        note("stop");
        const bool takes = !stopped_ && !notifying_ && !destroyed_ && !finished_ && !device_.empty();
        if (fsm_.stoppable() != takes) fail("stoppable() disagrees");
        const TransferFsm::Action a = fsm_.stop(reason);
        if (takes != (a.kind == Kind::stop_streams)) fail("a stop was taken or refused wrongly");
        if (!takes) {
            if (a.kind != Kind::wait) fail("a refused stop asked for something");
            if (fsm_.error() != error_) fail("a refused stop changed the error");
            if (notifying_ && !finished_) abandon(reason);
            return;
        }
        ++coverage_.stops;
        stopped_ = true;
        pinned_ = true;
        expect_error(reason, Why::stopped, a.why);
    }

    // The job's answer to a deadline or cancellation while the notification is
    // in flight: abandon it once (its queue pair is failed), and the transfer
    // then ends with the reason, never with success.
    void abandon(std::error_code reason) {
        const TransferFsm::Action a = fsm_.abandon_notification(reason);
        const bool takes = !abandoned_ && !destroyed_;
        if (takes != (a.kind == Kind::abandon_notification)) fail("an abandon was taken or refused wrongly");
        if (fsm_.error() != error_) fail("an abandon changed the error before the notification ended");
        if (!takes) return;
        ++coverage_.abandons;
        abandoned_ = true;
        abandon_reason_ = reason;
        if (a.rail != notify_rail_) fail("abandoned a notification on another rail");
    }

    void unpin() {
        note("unpin");
        pinned_ = false;
        const TransferFsm::Action a = fsm_.unpin(rails_);
        expect_error({}, Why::none, a.why);
        apply(a);
    }

    // Late and doubled events: a stream's second end, a release without a pin, an answer nobody asked
    // for, a stop or an abandon once finished. Each is answered `wait` and changes nothing.
    void late_events() {
        const TransferFsm::Phase phase = fsm_.phase();
        const std::vector<TransferFsm::Stream> streams(fsm_.streams().begin(), fsm_.streams().end());
        auto unchanged = [&](const TransferFsm::Action& a, const char* what) {
            ++coverage_.late_events;
            bool same = a.kind == Kind::wait && fsm_.phase() == phase && fsm_.error() == error_ &&
                        fsm_.streams().size() == streams.size();
            for (std::size_t i = 0; same && i < streams.size(); ++i) {
                const auto& x = fsm_.streams()[i];
                same = x.running == streams[i].running && x.landed_end == streams[i].landed_end &&
                       x.posted_end == streams[i].posted_end;
            }
            if (!same) fail(std::string("a late event changed the transfer: ") + what);
        };
        if (!finished_streams_.empty()) {
            const std::uint32_t id = finished_streams_[rng_() % finished_streams_.size()];
            if (std::find(device_.begin(), device_.end(), id) == device_.end()) {
                TransferFsm::StreamEnd again;
                again.stream = id;
                outcome(fsm_.streams()[id], false, again);
                unchanged(fsm_.stream_finished(again, rails_), "a stream's second end");
            }
        }
        {
            TransferFsm::StreamEnd stranger; // a stream id the machine never gave
            stranger.stream = static_cast<std::uint32_t>(fsm_.streams().size());
            stranger.error = aborted_error();
            stranger.failure = StreamFailure::path;
            unchanged(fsm_.stream_finished(stranger, rails_), "the end of a stream the machine never made");
        }
        if (!pinned_) unchanged(fsm_.unpin(rails_), "a release without a pin");
        unchanged(fsm_.takeover_made(rng_() % 2 == 0, rails_), "an answer nobody asked for");
        if (finished_) {
            unchanged(fsm_.stop(timed_out), "a stop once finished");
            unchanged(fsm_.abandon_notification(aborted_error()), "an abandon once finished");
        }
    }

    // A takeover only when it may, never re-posting what landed, on rails that can run.
    void check_takeover(const TransferFsm::Action& a, const TransferFsm::Stream& s, const TransferFsm::StreamEnd& end) {
        std::uint32_t at = end.landed_end;
        for (std::uint32_t id = a.first_stream; id < a.end_stream; ++id) {
            const auto& t = fsm_.streams()[id];
            if (t.first != at || t.first >= t.end) fail("takeover ranges do not continue the failed stream's");
            if (t.running) fail("a proposed takeover stream runs before it was made");
            at = t.end;
            if (t.rail == s.rail || rail_failed_[t.rail] || !rails_.up[t.rail])
                fail("a takeover on a rail that cannot run");
            for (std::uint32_t i = t.first; i < t.end; ++i) {
                if (landed_[i]) fail("a takeover re-posts a request that landed");
            }
        }
        if (at != s.end) fail("takeover ranges do not end where the failed stream did");
    }

    // The action, checked against what must come now that this event was taken.
    void apply(const TransferFsm::Action& a) {
        std::size_t submitted = 0;
        switch (a.kind) {
            case Kind::wait: break;
            case Kind::make_streams: fail("make_streams must be answered first"); break;
            case Kind::submit:
                for (std::uint32_t id = a.first_stream; id < a.end_stream; ++id) {
                    if (!fsm_.streams()[id].running) continue;
                    if (std::find(device_.begin(), device_.end(), id) != device_.end())
                        fail("a stream submitted twice");
                    if (fsm_.streams()[id].first >= fsm_.streams()[id].end) fail("an empty stream submitted");
                    device_.push_back(id);
                    ++submitted;
                    if (id >= rails()) took_ += fsm_.streams()[id].end - fsm_.streams()[id].first;
                }
                break;
            case Kind::stop_streams: fail("stop_streams outside stop()"); break;
            case Kind::abandon_notification: fail("abandon_notification outside abandon_notification()"); break;
            case Kind::notify: break; // checked below, with the finish
            case Kind::finish:
                if (finished_) fail("the handler completed twice");
                break;
        }
        // Progress: once nothing runs and nothing is pinned, the transfer moves on at once.
        const bool idle = device_.empty() && !pinned_ && !finished_;
        if (!idle) {
            if (a.kind == Kind::notify || a.kind == Kind::finish)
                fail("the notification or the end while streams run or a stop is pinned");
            if (fsm_.phase() == Phase::finished && !finished_) fail("finished without a finish action");
            return;
        }
        if (a.kind == Kind::submit && submitted > 0) return;
        // Every request landed with no error: the notification is due (on the first rail that has not
        // failed, is usable with failover, and reaches it), else the end.
        if (!error_ && !destroyed_ && notify_ && !notifying_) {
            std::size_t rail = rails();
            for (std::size_t j = 0; j < rails() && rail == rails(); ++j) {
                if (!rail_failed_[j] && (!failover() || rails_.up[j]) && rails_.reach[j]) rail = j;
            }
            if (std::find(landed_.begin(), landed_.end(), false) != landed_.end())
                fail("nothing runs with no error, yet a request has not landed");
            if (rail < rails()) {
                if (a.kind != Kind::notify || a.rail != rail) {
                    fail("every request landed, yet the notification was not armed on the rail due");
                    return;
                }
                ++coverage_.notifications;
                notifying_ = true;
                notify_rail_ = static_cast<std::uint32_t>(rail);
                device_.push_back(notify_rail_);
                return;
            }
            // No rail may carry it: the end, with invalid_argument.
            if (fsm_.error() != errc::invalid_argument || a.why != Why::no_rail_for_notification)
                fail("no rail reaches the notification, yet the transfer did not fail with invalid_argument");
            error_ = errc::invalid_argument;
        }
        if (a.kind != Kind::finish) {
            fail("nothing runs and nothing is pinned, yet the transfer has not finished");
            return;
        }
        finished_ = true;
        for (const auto& s : fsm_.streams()) {
            if (s.running) fail("the machine finished with a running stream");
        }
        if (fsm_.phase() != Phase::finished) fail("a finish action outside the finished phase");
        check_report();
    }

    // The report agrees with what was fed in.
    void check_report() {
        std::vector<RequestState> got(requests_);
        fsm_.request_states(got);
        for (std::uint32_t i = 0; i < requests_; ++i) {
            const RequestState want = landed_[i]   ? RequestState::landed
                                      : posted_[i] ? RequestState::uncertain
                                                   : RequestState::not_posted;
            if (got[i] != want) fail("request " + std::to_string(i) + "'s state disagrees with the events");
        }
    }

    std::string check_end() {
        if (rails_.misused) fail("the machine asked about a rail it does not have, or striped wrongly");
        if (fsm_.destroyed() != destroyed_) fail("destroyed() disagrees with the events");
        check_report();
        coverage_.destroyed += destroyed_ ? 1 : 0;
        // Progress: no error was due (every request landed, the notification taken, no stop): success.
        if (fsm_.error() != error_) fail("the transfer ended with an error other than the one due");
        if (!error_ && !destroyed_) {
            ++coverage_.successes;
            if (std::find(landed_.begin(), landed_.end(), false) != landed_.end())
                fail("success with a request not landed");
            if (notify_ && !notifying_) fail("success without the notification");
            if (stopped_) fail("success after a stop was taken");
        }
        std::uint32_t taken = 0, took = 0;
        for (const auto& r : fsm_.rails()) {
            taken += r.taken_over;
            took += r.took_over;
        }
        if (taken != took || took != took_) fail("taken_over and took_over disagree with the takeovers");
        return failure_;
    }

    std::mt19937_64 rng_;
    FakeRails rails_;
    TransferFsm fsm_;
    std::uint32_t requests_ = 0;
    std::vector<std::uint32_t> bounds_;
    bool failover_ = false;
    bool notify_ = false;
    std::vector<bool> landed_;                    ///< landed on some stream
    std::vector<bool> posted_;                    ///< posted on some stream
    std::vector<bool> rail_failed_;               ///< the model's account of each rail's failure
    std::vector<std::uint32_t> device_;           ///< the streams the device holds
    std::vector<std::uint32_t> finished_streams_; ///< … and those it finished
    std::error_code error_;                       ///< the first error due (the model's own account)
    bool stopped_ = false;
    bool pinned_ = false;
    bool destroyed_ = false;
    bool notifying_ = false;
    bool abandoned_ = false;
    std::error_code abandon_reason_;
    bool finished_ = false;
    std::uint32_t notify_rail_ = 0;
    std::uint32_t took_ = 0;
    Coverage& coverage_;
    std::string failure_;
    std::vector<std::string> trace_;
};

} // namespace

TEST_CASE("random event sequences over 1, 2 and 4 rails keep every promise of the transfer") {
    std::uint64_t base = 0x9e3779b97f4a7c15ULL;
    if (const char* s = std::getenv("GPUVERBS_TRANSFER_FSM_SEED")) base = std::strtoull(s, nullptr, 0);
    constexpr std::uint64_t sequences = 100000;
    const auto t0 = std::chrono::steady_clock::now();
    Coverage c;
    for (std::uint64_t i = 0; i < sequences; ++i) {
        const std::uint64_t seed = base + i;
        const std::string why = Model(seed, c).run();
        if (!why.empty()) {
            FAIL("sequence with seed " << seed << " (GPUVERBS_TRANSFER_FSM_SEED=" << seed << "): " << why);
        }
    }
    MESSAGE(sequences
            << " sequences in "
            << std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count()
            << " ms: " << c.successes << " succeeded, " << c.takeovers << " takeovers (" << c.refused_takeovers
            << " not made), " << c.notifications << " notifications, " << c.stops << " stops taken, " << c.destroyed
            << " destroyed, " << c.every_rail_failed << " with every rail failed, " << c.abandons
            << " notifications abandoned, " << c.late_events << " late or doubled events, " << c.split_ends
            << " ends in several pieces, " << c.port_down_failovers << " port-down failovers");
    CHECK(c.takeovers > 1000);
    CHECK(c.abandons > 100);
    CHECK(c.abandoned_failed > 50);
    CHECK(c.notifications > 1000);
    CHECK(c.every_rail_failed > 100);
    CHECK(c.late_events > 10000);
    CHECK(c.split_ends > 1000);
    CHECK(c.port_down_failovers > 100);
}
