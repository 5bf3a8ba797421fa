// Signed rendezvous records (rendezvous/signed.hpp) over a store anyone can
// write to: an in-memory rendezvous whose table the test (the attacker)
// rewrites directly, as a local user can rewrite a Redis store without a
// password. The Redis form runs in the rig (integration/mesh_test.cpp).
#include "gpuverbs/many_peers/rendezvous/signed.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <utility>

using namespace gpuverbs;
using namespace std::chrono_literals;

namespace {

/// One shared table of (rank, key) -> bytes, seen by every member.
using Table = std::map<std::pair<std::uint32_t, std::string>, std::vector<std::byte>>;

/// A rendezvous of the user's own, written as docs/many-peers.md says: the
/// four error_code forms, the others from RendezvousForms.
class TableRendezvous : public RendezvousForms<TableRendezvous> {
public:
    using RendezvousForms::fence;
    using RendezvousForms::lookup;
    using RendezvousForms::publish;
    using RendezvousForms::withdraw;
    TableRendezvous(Table& table, std::uint32_t rank) : table_(&table), rank_(rank) {}
    [[nodiscard]] std::uint32_t rank() const { return rank_; }
    [[nodiscard]] std::uint32_t world_size() const { return 4; }
    [[nodiscard]] std::string name() const { return "table"; }
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec, Diagnostics& d) {
        (*table_)[{rank_, key}] = std::vector<std::byte>(value.begin(), value.end());
        ec.clear();
        d.clear();
    }
    void fence(std::chrono::milliseconds, std::error_code& ec, Diagnostics& d) {
        ec.clear();
        d.clear();
    }
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds,
                                  std::error_code& ec, Diagnostics& d) {
        auto it = table_->find({peer, key});
        if (it == table_->end()) {
            ec = errc::peer_missing;
            d.set(ec, "TableRendezvous::lookup", "nothing under '" + key + "'");
            return {};
        }
        ec.clear();
        d.clear();
        return it->second;
    }
    void withdraw(std::error_code& ec, Diagnostics& d) {
        ec.clear();
        d.clear();
    }

private:
    Table* table_;
    std::uint32_t rank_;
};
static_assert(Rendezvous<TableRendezvous>);
static_assert(Rendezvous<SignedRendezvous<TableRendezvous>>);

std::vector<std::byte> bytes_of(const std::string& s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    return {p, p + s.size()};
}

const std::string secret = "0123456789abcdef0123456789abcdef";

} // namespace

TEST_SUITE("signed rendezvous records" * doctest::skip(!GPUVERBS_HAVE_OPENSSL)) {
    TEST_CASE("a record published with the secret reads back exactly; the store holds it with its tag") {
        Table table;
        TableRendezvous a0(table, 0), a1(table, 1);
        SignedRendezvous s0(a0, secret), s1(a1, secret);
        s1.publish("endpoint", bytes_of("rank 1's endpoint"));
        CHECK(table.at({1, "endpoint"}).size() == std::string("rank 1's endpoint").size() + 32);
        CHECK(s0.lookup(1, "endpoint", 1s) == bytes_of("rank 1's endpoint"));
        s1.publish("empty", {});
        CHECK(s0.lookup(1, "empty", 1s).empty());
        CHECK(s0.name() == "table (signed records)");
    }

    TEST_CASE("attack: a record written into the store by someone without the secret is refused, in words") {
        Table table;
        TableRendezvous a0(table, 0), a1(table, 1);
        SignedRendezvous s0(a0, secret), s1(a1, secret);
        s1.publish("endpoint", bytes_of("the real endpoint"));
        const auto refused = [&](const char* what) {
            try {
                (void)s0.lookup(1, "endpoint", 1s);
                FAIL(what << ": accepted");
            } catch (const Error& e) {
                CHECK(e.code() == errc::malformed_record);
                const std::string words = e.what();
                CHECK(words.find("rank 1's 'endpoint'") != std::string::npos);
                CHECK(words.find(secret) == std::string::npos); // never the secret
                return words;
            }
            return std::string();
        };
        // 1. Overwritten unsigned (the forger's own endpoint, long enough to hold a "tag").
        table[{1, "endpoint"}] = bytes_of(std::string(64, 'F'));
        CHECK(refused("an unsigned record").find("does not carry a signature") != std::string::npos);
        // 2. Shorter than a tag.
        table[{1, "endpoint"}] = bytes_of("short");
        CHECK(refused("a short record").find("fewer than a signature's 32") != std::string::npos);
        // 3. Signed with another secret.
        TableRendezvous forger(table, 1);
        SignedRendezvous wrong(forger, std::string("another secret, long enough"));
        wrong.publish("endpoint", bytes_of("the forger's endpoint"));
        (void)refused("another secret");
        // 4. A genuine record of rank 2, copied into rank 1's place (rank impersonation).
        TableRendezvous a2(table, 2);
        SignedRendezvous s2(a2, secret);
        s2.publish("endpoint", bytes_of("rank 2's endpoint"));
        table[{1, "endpoint"}] = table.at({2, "endpoint"});
        (void)refused("rank 2's record as rank 1's");
        // 5. A genuine record of rank 1 under another key.
        s1.publish("ready", bytes_of("the real endpoint"));
        table[{1, "endpoint"}] = table.at({1, "ready"});
        (void)refused("another key's record");
        // 6. One flipped bit of a genuine record.
        s1.publish("endpoint", bytes_of("the real endpoint"));
        table.at({1, "endpoint"})[3] ^= std::byte{1};
        (void)refused("a flipped bit");
        // 7. A genuine record of the same rank and key in another service (domain) sharing the secret.
        Table other_service;
        TableRendezvous o1(other_service, 1);
        SignedRendezvous other(o1, secret, "another service");
        other.publish("endpoint", bytes_of("the real endpoint"));
        table[{1, "endpoint"}] = other_service.at({1, "endpoint"});
        (void)refused("another domain's record");
        // And the genuine one still verifies.
        s1.publish("endpoint", bytes_of("the real endpoint"));
        CHECK(s0.lookup(1, "endpoint", 1s) == bytes_of("the real endpoint"));
    }

    TEST_CASE("lookup's three forms agree: a forged record, and the inner rendezvous's own failure in its words") {
        Table table;
        const std::string secret(32, 'k');
        TableRendezvous a0(table, 0);
        TableRendezvous a1(table, 1);
        SignedRendezvous s0(a0, secret);
        a1.publish("endpoint", bytes_of("unsigned bytes, no tag at all, long enough to be one"));
        const std::string forged = test::check_fails_alike(
            errc::malformed_record, [&] { return s0.lookup(1, "endpoint", 1s); },
            [&](std::error_code& ec) { return s0.lookup(1, "endpoint", 1s, ec); },
            [&](std::error_code& ec, Diagnostics& d) { return s0.lookup(1, "endpoint", 1s, ec, d); });
        CHECK(forged.starts_with("SignedRendezvous::lookup: table (signed records): rank 1's 'endpoint' "));
        const std::string missing = test::check_fails_alike(
            errc::peer_missing, [&] { return s0.lookup(2, "endpoint", 1s); },
            [&](std::error_code& ec) { return s0.lookup(2, "endpoint", 1s, ec); },
            [&](std::error_code& ec, Diagnostics& d) { return s0.lookup(2, "endpoint", 1s, ec, d); });
        CHECK(missing == "TableRendezvous::lookup: nothing under 'endpoint'");
    }

    TEST_CASE("a secret shorter than 16 bytes is refused by name") {
        Table table;
        TableRendezvous a0(table, 0);
        CHECK_THROWS_WITH_AS(SignedRendezvous(a0, "short"),
                             "SignedRendezvous: the shared secret has 5 bytes; at least 16 are needed (e.g. openssl "
                             "rand -hex 32)",
                             Error);
    }
}

TEST_CASE("a secret the constructor refuses fails alike in the three forms; the refused object signs nothing") {
    Table table;
    TableRendezvous a0(table, 0);
    struct Case {
        const char* name;
        std::string secret;
    };
    for (const Case& c : {Case{"empty", ""}, Case{"15 bytes", std::string(15, 'k')}}) {
        CAPTURE(c.name);
        const auto [code, what] = test::check_forms_agree(
            [&] { return SignedRendezvous(a0, c.secret, "kv"); },
            [&](std::error_code& ec) {
                SignedRendezvous s = SignedRendezvous<TableRendezvous>::create(a0, c.secret, "kv", ec);
                CHECK_THROWS_WITH_AS(s.publish("endpoint", bytes_of("x")), doctest::Contains("SignedRendezvous: "),
                                     Error);
                CHECK_THROWS_AS((void)s.lookup(0, "endpoint", 1s), Error);
                return 0;
            },
            [&](std::error_code& ec, Diagnostics& d) {
                return SignedRendezvous<TableRendezvous>::create(a0, c.secret, "kv", ec, d);
            });
        if (GPUVERBS_HAVE_OPENSSL) {
            CHECK(code == errc::invalid_argument);
            CHECK(what == "SignedRendezvous: the shared secret has " + std::to_string(c.secret.size()) +
                              " bytes; at least 16 are needed (e.g. openssl rand -hex 32)");
        } else {
            CHECK(code == errc::unsupported);
        }
        CHECK(table.empty()); // nothing was published, signed or not
    }
}

TEST_CASE("a secret that is long enough clears the error_code and the Diagnostics" *
          doctest::skip(!GPUVERBS_HAVE_OPENSSL)) {
    Table table;
    TableRendezvous a0(table, 0);
    test::check_succeeds_clean(
        [&](std::error_code& ec) {
            SignedRendezvous s = SignedRendezvous<TableRendezvous>::create(a0, secret, "kv", ec);
            s.publish("endpoint", bytes_of("signed"));
            CHECK(s.lookup(0, "endpoint", 1s) == bytes_of("signed"));
        },
        [&](std::error_code& ec, Diagnostics& d) {
            return SignedRendezvous<TableRendezvous>::create(a0, secret, "kv", ec, d);
        });
}

TEST_CASE("without OpenSSL, SignedRendezvous says so" * doctest::skip(GPUVERBS_HAVE_OPENSSL)) {
    Table table;
    TableRendezvous a0(table, 0);
    try {
        SignedRendezvous s(a0, secret);
        FAIL("constructed without OpenSSL");
    } catch (const Error& e) {
        CHECK(e.code() == errc::unsupported);
        CHECK(std::string(e.what()).find("built without OpenSSL's libcrypto") != std::string::npos);
    }
}
