// One rail's accounting (detail/transfers/stream_ledger.hpp) without a
// device: a few transitions by hand, then a model of a send queue that takes
// the ledger's chains, refuses some (in part), fails a request anywhere
// (signaled or not: the rest flush), is stopped or abandoned at any moment,
// and carries the notification as its own phase. After every run the
// ledger's account of each request is checked against what the model's
// device did with it: what it calls landed landed, what it calls never posted
// never went out, and it is exact where it can be (the first failed request,
// everything landed on a clean end).
#include "gpuverbs/detail/transfers/stream_ledger.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/completion.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <random>
#include <string>
#include <vector>

using gpuverbs::detail::StreamLedger;

namespace {

const std::error_code ledger_refused(EINVAL, std::system_category());
const std::error_code ledger_abandoned = gpuverbs::errc::port_down;

} // namespace

TEST_SUITE("a rail's accounting (StreamLedger)") {
    TEST_CASE("chains complete in order: their signaled completions land their requests, and the rail finishes") {
        StreamLedger l;
        l.start(0, 10, 4, 8, 10);
        CHECK(l.needs() == 4);
        l.posted(100); // requests 0-3 at sequences 100-103
        CHECK(l.needs() == 4);
        l.posted(104); // 4-7
        CHECK(l.needs() == 2);
        l.posted(108); // 8-9
        CHECK(l.needs() == 0);
        CHECK_FALSE(l.finished());
        l.completed(IBV_WC_SUCCESS, 103);
        CHECK(l.landed_end() == 4);
        l.completed(IBV_WC_SUCCESS, 107);
        l.completed(IBV_WC_SUCCESS, 109);
        CHECK(l.finished());
        CHECK(l.landed_end() == 10);
        CHECK(l.posted_end() == 10);
        CHECK_FALSE(l.error());
    }

    TEST_CASE("an unsignaled request that fails names its request; those after it are uncertain") {
        StreamLedger l;
        l.start(0, 8, 4, 8, 8);
        l.posted(0);
        l.posted(4);
        l.completed(IBV_WC_REM_ACCESS_ERR, 1); // request 1 failed (unsignaled: errors complete anyway)
        l.completed(IBV_WC_WR_FLUSH_ERR, 2);
        l.completed(IBV_WC_WR_FLUSH_ERR, 3);
        l.completed(IBV_WC_WR_FLUSH_ERR, 7);
        CHECK(l.finished());
        CHECK(l.failed_request() == 1);
        CHECK(l.landed_end() == 1);
        CHECK(l.posted_end() == 8);
        CHECK(l.error() == gpuverbs::make_wc_error(IBV_WC_REM_ACCESS_ERR));
    }

    TEST_CASE("a refused chain: what it took is closed by one signaled write and stays uncertain") {
        StreamLedger l;
        l.start(0, 8, 4, 8, 8);
        l.posted(0);
        l.refused(ledger_refused, 2); // requests 4 and 5 went out, 6 was refused
        l.closed(4, 2);               // the closing write at sequence 6
        CHECK(l.needs() == 0);
        l.completed(IBV_WC_SUCCESS, 3);
        l.completed(IBV_WC_SUCCESS, 6);
        CHECK(l.finished());
        CHECK(l.landed_end() == 4);
        CHECK(l.posted_end() == 6);
        CHECK(l.error() == ledger_refused);
    }

    TEST_CASE("the notification is its own phase: its failure leaves every request landed") {
        StreamLedger l;
        l.start(0, 4, 4, 4, 4);
        l.posted(0);
        l.completed(IBV_WC_SUCCESS, 3);
        REQUIRE(l.finished());
        l.arm_notification();
        CHECK(l.notification_next());
        CHECK(l.needs() == 1);
        l.posted(4);
        l.completed(IBV_WC_RNR_RETRY_EXC_ERR, 4);
        CHECK(l.finished());
        CHECK(l.notification_failed());
        CHECK(l.landed_end() == 4);
        CHECK(l.posted_end() == 4);
    }

    TEST_CASE("abandoned: what was in flight is uncertain, the rail failed with the abandon's reason") {
        StreamLedger l;
        l.start(2, 10, 4, 8, 10);
        l.posted(0); // 2-5
        l.posted(4); // 6-9
        l.completed(IBV_WC_SUCCESS, 3);
        l.abandon(ledger_abandoned);
        CHECK(l.finished());
        CHECK(l.landed_end() == 6);
        CHECK(l.posted_end() == 10);
        CHECK(l.error() == ledger_abandoned);
        CHECK(l.abandoned());
        CHECK_FALSE(l.notification_failed());
    }
}

namespace {

// The world around one ledger, played at random.
class LedgerWorld {
public:
    explicit LedgerWorld(std::uint64_t seed) : rng_(seed) {
        plan_ = 1 + static_cast<std::uint32_t>(rng_() % 24);
        first_ = rng_() % 2 == 0 ? 0 : static_cast<std::uint32_t>(rng_() % plan_); // the first rail half the time
        end_ = first_ + 1 + static_cast<std::uint32_t>(rng_() % (plan_ - first_));
        chain_ = 1 + static_cast<std::uint32_t>(rng_() % 6);
        ring_ = 1 + static_cast<std::uint32_t>(rng_() % 4);
        notify_ = first_ == 0 && rng_() % 2 == 0;
        fate_.assign(plan_, Fate::not_posted);
        l_.start(first_, end_, chain_, ring_, plan_);
    }

    std::string run() {
        for (int step = 0; step < 2000; ++step) {
            if (stopped_ && l_.needs() != 0) return fail("a stopped rail still asks to post");
            if (l_.finished()) {
                // Finished while the device still holds its requests: their memory would go with it.
                if (!queue_.empty()) return fail("finished with requests still on the device");
                if (notify_ && !armed_ && !l_.failed() && !l_.stopped()) {
                    // The job arms the notification once every request landed.
                    if (l_.landed_end() != end_) return fail("finished with no error, yet not every request landed");
                    l_.arm_notification();
                    armed_ = true;
                    post(); // submitted again: the driver posts it at once (finished() is true until then)
                    continue;
                }
                return check();
            }
            const std::uint64_t roll = rng_() % 100;
            if (roll < 45 && l_.needs() > 0 && l_.ring_has_room()) {
                post();
            } else if (roll < 93 && !queue_.empty()) {
                complete_one();
            } else if (roll < 96) {
                l_.stop();
                stopped_ = true;
            } else if (roll < 98 && !abandoned_) {
                abandon();
            } else if (queue_.empty() && (l_.needs() == 0 || !l_.ring_has_room())) {
                // Nothing can move: the ledger must say it finished.
                return fail("nothing in flight and nothing it may post, yet not finished");
            }
        }
        return fail("did not finish within 2000 steps");
    }

    std::uint64_t refusals = 0, failures = 0, stops = 0, abandons = 0, notifications = 0;

private:
    enum class Fate : std::uint8_t { not_posted, posted, landed, failed };
    struct Wr {
        std::uint64_t sequence;
        std::int64_t request; ///< the plan's request, plan_ for the notification, -1 for a closing write
        bool signaled;
    };

    std::string fail(const std::string& why) {
        return why + " (plan " + std::to_string(plan_) + ", [" + std::to_string(first_) + ", " + std::to_string(end_) +
               "), chain " + std::to_string(chain_) + ", ring " + std::to_string(ring_) + ")";
    }

    void post() {
        const std::uint32_t n = l_.needs();
        const bool notification = l_.notification_next();
        const std::uint32_t next = l_.next();
        const std::uint64_t first_sequence = sequence_;
        auto request_of = [&](std::uint32_t k) -> std::int64_t { return notification ? plan_ : next + k; };
        if (rng_() % 10 == 0) {
            ++refusals;
            const std::uint32_t taken = static_cast<std::uint32_t>(rng_() % n);
            if (notification && !l_.failed()) notification_refused_ = true;
            for (std::uint32_t k = 0; k < taken; ++k) push(request_of(k), false);
            l_.refused(ledger_refused, taken);
            if (taken == 0) return;
            if (rng_() % 5 != 0) {
                push(-1, true); // the closing write
                l_.closed(first_sequence, taken);
            } else {
                // Even that was refused: their completions lead nowhere (forgotten), their fate unknown.
                queue_.erase(queue_.end() - taken, queue_.end());
            }
            return;
        }
        for (std::uint32_t k = 0; k < n; ++k) push(request_of(k), k + 1 == n);
        l_.posted(first_sequence);
    }

    void push(std::int64_t request, bool signaled) {
        queue_.push_back(Wr{sequence_++, request, signaled});
        if (request >= 0 && request < plan_) fate_[request] = Fate::posted;
        if (request == plan_) ++notifications;
    }

    // The send queue executes its oldest request: success, the first failure, or a flush after one.
    void complete_one() {
        const Wr wr = queue_.front();
        queue_.pop_front();
        ibv_wc_status status = IBV_WC_SUCCESS;
        if (struck_) {
            status = IBV_WC_WR_FLUSH_ERR;
        } else if (rng_() % 12 == 0) {
            ++failures;
            status = rng_() % 2 == 0 ? IBV_WC_REM_ACCESS_ERR : IBV_WC_RETRY_EXC_ERR;
            struck_ = true;
            first_failed_ = wr.request;
        }
        if (wr.request >= 0 && wr.request < plan_)
            fate_[wr.request] = status == IBV_WC_SUCCESS ? Fate::landed : Fate::failed;
        if (wr.request == plan_) notification_fate_ = status == IBV_WC_SUCCESS ? Fate::landed : Fate::failed;
        // A success completes only where signaled; an error always does.
        if (status != IBV_WC_SUCCESS || wr.signaled) l_.completed(status, wr.sequence);
    }

    void abandon() {
        ++abandons;
        abandoned_ = true;
        if (!l_.failed()) abandoned_first_ = true;
        l_.abandon(ledger_abandoned);
        // The provider will never complete them (their fate is unknown); a late flush of one, should it come
        // after all, leads nowhere: what was in flight ended with the abandon.
        const std::uint32_t landed = l_.landed_end(), posted = l_.posted_end();
        for (const Wr& wr : queue_) {
            if (rng_() % 4 == 0) l_.completed(IBV_WC_WR_FLUSH_ERR, wr.sequence);
        }
        queue_.clear();
        if (l_.landed_end() != landed || l_.posted_end() != posted || l_.in_flight()) late_changed_ = true;
    }

    std::string check() {
        if (late_changed_) return fail("a completion after the abandon changed the account");
        if (l_.in_flight()) return fail("finished with chains in flight");
        const std::uint32_t landed = l_.landed_end(), posted = l_.posted_end();
        if (!(first_ <= landed && landed <= posted && posted <= end_)) return fail("landed/posted out of order");
        for (std::uint32_t i = first_; i < end_; ++i) {
            if (i < landed && fate_[i] != Fate::landed) return fail("request " + std::to_string(i) + " called landed");
            if (i >= posted && fate_[i] != Fate::not_posted)
                return fail("request " + std::to_string(i) + " called never posted, but it went out");
            if (i >= landed && i < posted && fate_[i] == Fate::not_posted)
                return fail("request " + std::to_string(i) + " called uncertain, but it never went out");
        }
        // Exact where it can be.
        const bool notification_failed = notification_fate_ == Fate::failed || notification_refused_ ||
                                         (abandoned_first_ && armed_ && notification_fate_ != Fate::landed);
        if (l_.notification_failed() != notification_failed) return fail("notification_failed() is wrong");
        if (!l_.failed() && !stopped_ && landed != end_) return fail("a clean end without every request landed");
        if (!l_.failed() && stopped_ && landed != posted)
            return fail("stopped and drained, yet a posted request is uncertain");
        if (struck_ && first_failed_ >= 0 && first_failed_ < plan_ && !l_.post_refused() && !abandoned_first_) {
            if (l_.failed_request() != first_failed_) return fail("the first failed request is not named");
            if (landed != first_failed_) return fail("landed_end is not the first failed request");
        }
        if (struck_ && !l_.failed()) return fail("a request failed, yet the rail did not");
        if (l_.failed() && !l_.error()) return fail("failed without an error");
        if (abandoned_first_ && l_.error() != ledger_abandoned)
            return fail("abandoned, yet not with the abandon's reason");
        if (l_.post_refused() && l_.error() != ledger_refused) return fail("refused, yet not with the refusal's error");
        return {};
    }

    std::mt19937_64 rng_;
    StreamLedger l_;
    std::uint32_t plan_ = 0, first_ = 0, end_ = 0, chain_ = 0, ring_ = 0;
    bool notify_ = false, armed_ = false, struck_ = false, stopped_ = false, abandoned_ = false,
         abandoned_first_ = false, notification_refused_ = false, late_changed_ = false;
    std::int64_t first_failed_ = -2;
    std::uint64_t sequence_ = 1000;
    std::deque<Wr> queue_;
    std::vector<Fate> fate_;
    Fate notification_fate_ = Fate::not_posted;
};

} // namespace

TEST_CASE("random postings, refusals, failures, stops and abandons: the ledger's account is what the device did") {
    std::uint64_t base = 0x51ed27a7c0ffeeULL;
    if (const char* s = std::getenv("GPUVERBS_STREAM_LEDGER_SEED")) base = std::strtoull(s, nullptr, 0);
    std::uint64_t refusals = 0, failures = 0, abandons = 0, notifications = 0;
    for (std::uint64_t i = 0; i < 50000; ++i) {
        LedgerWorld d(base + i);
        const std::string why = d.run();
        if (!why.empty()) FAIL("seed " << base + i << " (GPUVERBS_STREAM_LEDGER_SEED=" << base + i << "): " << why);
        refusals += d.refusals;
        failures += d.failures;
        abandons += d.abandons;
        notifications += d.notifications;
    }
    MESSAGE("50000 rails: " << refusals << " refused chains, " << failures << " failed requests, " << abandons
                            << " abandons, " << notifications << " notifications posted");
    CHECK(refusals > 1000);
    CHECK(failures > 1000);
    CHECK(abandons > 1000);
    CHECK(notifications > 1000);
}
