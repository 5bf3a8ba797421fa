// A Redis server that answers wrongly, as a hostile or broken store would: a
// fake speaking RESP on loopback, in front of the real RedisRendezvous and
// PeerWatch. Whatever it sends is reported as errc::rendezvous_unavailable
// (or malformed_record) in words, never thrown as anything else, never
// copied unbounded, never put raw into a message.
#include "gpuverbs/config.hpp"

#if GPUVERBS_HAVE_HIREDIS

#include "gpuverbs/connections/tcp_bootstrap.hpp"
#include "gpuverbs/connections/wire.hpp"
#include "gpuverbs/many_peers/rendezvous/redis.hpp"
#include "gpuverbs/many_peers/rendezvous/signed.hpp"
#include "gpuverbs/observability/warnings.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/read_until.hpp>
#include <boost/asio/streambuf.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace gpuverbs;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

/// Answers each command with `answer(command words)`, or the usual replies of
/// a store that accepts everything: one connection at a time, in a thread.
class FakeRedis {
public:
    using Answer = std::function<std::string(const std::vector<std::string>&)>;
    explicit FakeRedis(Answer special) : listener_(io_, 0, "127.0.0.1"), special_(std::move(special)) {
        thread_ = std::thread([this] { serve(); });
    }
    ~FakeRedis() { // the clients are gone: each conversation ends at their close
        stop_ = true;
        thread_.join();
        for (auto& t : conversations_) t.join();
    }
    [[nodiscard]] std::uint16_t port() const { return listener_.port(); }

private:
    void serve() {
        while (!stop_) {
            try {
                auto socket = listener_.accept(100ms);
                conversations_.emplace_back([this, s = std::move(socket)]() mutable { talk(s); });
            } catch (const Error&) {
                // no connection within 100 ms: look at stop_ again
            }
        }
    }
    void talk(asio::ip::tcp::socket& s) {
        asio::streambuf in;
        boost::system::error_code ec;
        auto line = [&]() -> std::string {
            asio::read_until(s, in, "\r\n", ec);
            if (ec) return {};
            std::string text{asio::buffers_begin(in.data()), asio::buffers_end(in.data())};
            text = text.substr(0, text.find("\r\n"));
            in.consume(text.size() + 2);
            return text;
        };
        for (;;) {
            const std::string head = line();
            if (ec || head.empty() || head[0] != '*') return;
            std::vector<std::string> words;
            for (int n = std::stoi(head.substr(1)); n > 0; --n) {
                const std::string length = line();
                if (ec) return;
                const std::size_t size = std::stoul(length.substr(1));
                if (in.size() < size + 2) asio::read(s, in, asio::transfer_exactly(size + 2 - in.size()), ec);
                if (ec) return;
                std::string word{asio::buffers_begin(in.data()), asio::buffers_begin(in.data()) + size};
                in.consume(size + 2);
                words.push_back(std::move(word));
            }
            std::string reply = special_(words);
            if (reply.empty()) reply = usual(words);
            asio::write(s, asio::buffer(reply), ec);
            if (ec) return;
        }
    }
    static std::string usual(const std::vector<std::string>& w) {
        const std::string& c = w.at(0);
        if (c == "PING") return "+PONG\r\n";
        if (c == "SET") return "+OK\r\n";
        if (c == "INCR") return ":1\r\n";
        if (c == "DEL" || c == "EVAL" || c == "EXISTS") return ":1\r\n";
        if (c == "SCAN") return "*2\r\n$1\r\n0\r\n*0\r\n";
        return "$-1\r\n"; // GET, HGET: nothing
    }

    asio::io_context io_;
    TcpListener listener_;
    Answer special_;
    std::atomic<bool> stop_{false};
    std::vector<std::thread> conversations_; // only serve() adds, before the destructor joins it
    std::thread thread_;
};

RedisOptions at(const FakeRedis& fake) {
    RedisOptions o;
    o.port = fake.port();
    o.service = "fake";
    o.ttl = 3000ms;
    o.command_timeout = 1000ms;
    return o;
}

/// A SCAN reply whose keys are `keys`, each already in RESP.
std::string scan_of(const std::vector<std::string>& keys) {
    std::string r = "*2\r\n$1\r\n0\r\n*" + std::to_string(keys.size()) + "\r\n";
    for (const auto& k : keys) r += k;
    return r;
}
std::string bulk(const std::string& s) {
    return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
}

} // namespace

TEST_SUITE("Redis replies from a hostile store") {
    TEST_CASE("attack: malformed SCAN replies are reported by PeerWatch::poll as the store's fault, never thrown raw") {
        // Each was, before: an uncaught std::out_of_range (a key shorter than
        // the prefix), or a read through a null string (a key that is an integer).
        const std::vector<std::pair<std::string, std::string>> cases{
            {scan_of({":5\r\n"}), "SCAN's key 0 is an integer, not a string"},
            {"*2\r\n:0\r\n*0\r\n", "SCAN's cursor is an integer"},
            {"*1\r\n$1\r\n0\r\n", "SCAN answered an array of 1 elements, not [cursor, keys]"},
            {"*2\r\n$1\r\nx\r\n*0\r\n", "SCAN's cursor is a string that is not a number"},
            {"*2\r\n$1\r\n0\r\n:3\r\n", "SCAN's keys are an integer, not an array"},
        };
        for (const auto& [reply, words] : cases) {
            CAPTURE(words);
            FakeRedis fake([&, r = reply](const std::vector<std::string>& w) { return w[0] == "SCAN" ? r : ""; });
            RedisRendezvous rendezvous(at(fake));
            asio::io_context io;
            PeerWatch watch(rendezvous, io.get_executor());
            try {
                (void)watch.poll();
                FAIL("a malformed SCAN reply was accepted");
            } catch (const Error& e) {
                CHECK(e.code() == errc::rendezvous_unavailable);
                CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, e.what());
            }
        }
    }

    TEST_CASE("keys that are not gpuverbs' (short, foreign, too many digits, past the largest world) are skipped") {
        FakeRedis fake([](const std::vector<std::string>& w) {
            if (w[0] != "SCAN") return std::string();
            return scan_of({bulk("x"), bulk("fake/member/"), bulk("fake/member/12a"), bulk("fake/member/123456"),
                            bulk("fake/member/65536"), bulk("other/member/3"), bulk("fake/member/7")});
        });
        int warnings = 0;
        const WarningHandler previous = set_warning_handler([&](const Warning&) { ++warnings; });
        RedisRendezvous rendezvous(at(fake));
        CHECK(rendezvous.members() == std::vector<std::uint32_t>{7});
        (void)set_warning_handler(previous);
        CHECK(warnings == 0); // no password, but on loopback: nothing to warn about
    }

    TEST_CASE("attack: a stored value larger than any record is refused before it is copied") {
        const std::size_t most = wire::max_mesh_record_size + detail::record_tag_size; // a signed mesh record
        const std::string huge(most + 1, 'x');
        FakeRedis fake([&](const std::vector<std::string>& w) { return w[0] == "HGET" ? bulk(huge) : std::string(); });
        RedisRendezvous rendezvous(at(fake));
        try {
            (void)rendezvous.lookup(0, "endpoint", 500ms);
            FAIL("the value was accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::malformed_record);
            CHECK_MESSAGE(std::string(e.what()).find("bytes; at most " + std::to_string(most)) != std::string::npos,
                          std::string(e.what()));
        }
        const std::vector<std::byte> too_big(most + 1);
        CHECK_THROWS_AS(rendezvous.publish("endpoint", too_big), Error);
    }

    TEST_CASE("attack: an array announcing 100 million elements is refused at its header, not allocated") {
        // hiredis 0.14 allocates 8 bytes per announced element before any
        // arrives: these 12 bytes were an 800 MB allocation, then a wait.
        FakeRedis fake([](const std::vector<std::string>& w) {
            return w[0] == "SCAN" ? std::string("*100000000\r\n") : std::string();
        });
        RedisRendezvous rendezvous(at(fake));
        try {
            (void)rendezvous.members();
            FAIL("the announced array was accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK_MESSAGE(std::string(e.what()).find("sent a reply larger than gpuverbs accepts") != std::string::npos,
                          std::string(e.what()));
        }
    }

    TEST_CASE("attack: arrays nested inside arrays (all but SCAN's shape) are refused at their header") {
        // [[x131072] x131072] would be 128 GiB of element tables.
        FakeRedis fake([](const std::vector<std::string>& w) {
            return w[0] == "SCAN" ? std::string("*131072\r\n*131072\r\n") : std::string();
        });
        RedisRendezvous rendezvous(at(fake));
        CHECK_THROWS_AS((void)rendezvous.members(), Error);
        FakeRedis deep([](const std::vector<std::string>& w) {
            return w[0] == "SCAN" ? std::string("*2\r\n*2\r\n*2\r\n") : std::string();
        });
        RedisRendezvous deep_rendezvous(at(deep));
        try {
            (void)deep_rendezvous.members();
            FAIL("a third level was accepted");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("nested deeper than SCAN's") != std::string::npos);
        }
    }

    TEST_CASE("attack: a SCAN whose cursor never returns to 0 ends with an error, not a loop") {
        FakeRedis fake([](const std::vector<std::string>& w) {
            return w[0] == "SCAN" ? std::string("*2\r\n$1\r\n7\r\n*0\r\n") : std::string();
        });
        RedisRendezvous rendezvous(at(fake));
        try {
            (void)rendezvous.members();
            FAIL("the endless scan ended well");
        } catch (const Error& e) {
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK(std::string(e.what()).find("did not finish a SCAN within 65536 pages") != std::string::npos);
        }
    }

    TEST_CASE("attack: the store's error text reaches a message filtered: printable, bounded") {
        FakeRedis fake([&](const std::vector<std::string>& w) {
            return w[0] == "SET" ? "-ERR \x1b[2Jcleared " + std::string(300, 'A') + "\r\n" : std::string();
        });
        try {
            RedisRendezvous rendezvous(at(fake));
            FAIL("the store's error was not reported");
        } catch (const Error& e) {
            const std::string what = e.what();
            MESSAGE(what);
            CHECK(what.find('\x1b') == std::string::npos);
            CHECK(what.find("ERR ?[2Jcleared AAAA") != std::string::npos);
            CHECK(what.find(std::string(201, 'A')) == std::string::npos);
        }
    }
}

TEST_SUITE("Redis rendezvous construction" * doctest::skip(!RedisRendezvous::available())) {
    TEST_CASE("a member the store or the options refuse fails alike in the three forms, and has not joined") {
        // A rank held by a live member: SET NX answers nil.
        FakeRedis taken([](const std::vector<std::string>& w) { return w[0] == "SET" ? "$-1\r\n" : ""; });
        RedisOptions held = at(taken);
        held.rank = 3;
        RedisOptions nowhere; // nothing listens on port 1
        nowhere.port = 1;
        nowhere.password = "s3cret-never-shown";
        RedisOptions bad_service = at(taken);
        bad_service.service = "kv cache*";
        struct Case {
            const char* name;
            RedisOptions options;
            std::error_code expected;
            std::string words;
        };
        const std::vector<Case> cases{
            {"a rank held by a live member", held, errc::rank_taken,
             "RedisRendezvous: rank 3 of Redis service 'fake' at 127.0.0.1:" + std::to_string(held.port) +
                 " is held by a live member"},
            {"a store that is not there", nowhere, errc::rendezvous_unavailable, "cannot reach Redis at 127.0.0.1:1"},
            {"a service name that cannot prefix keys", bad_service, errc::invalid_argument,
             "RedisRendezvous: service name 'kv cache*' must have 1 to 100 letters"},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            const std::string what = test::check_fails_alike(
                c.expected, [&] { return RedisRendezvous(c.options); },
                [&](std::error_code& ec) {
                    RedisRendezvous r = RedisRendezvous::create(c.options, ec);
                    CHECK_FALSE(r);
                    CHECK_THROWS_WITH_AS(r.publish("k", {}), doctest::Contains("did not join its service"), Error);
                    asio::io_context io;
                    CHECK_THROWS_AS(PeerWatch(r, io.get_executor()), Error);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) { return RedisRendezvous::create(c.options, ec, d); });
            CHECK_MESSAGE(what.find(c.words) != std::string::npos, what);
            CHECK(what.find("s3cret") == std::string::npos);
        }
    }

    TEST_CASE("a member the store lets join clears the error_code and the Diagnostics") {
        FakeRedis fake([](const std::vector<std::string>&) { return std::string(); });
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                RedisRendezvous r = RedisRendezvous::create(at(fake), ec);
                CHECK(r);
                CHECK(r.rank() == 0); // INCR answered 1
            },
            [&](std::error_code& ec, Diagnostics& d) { return RedisRendezvous::create(at(fake), ec, d); });
    }
}

#endif // GPUVERBS_HAVE_HIREDIS
