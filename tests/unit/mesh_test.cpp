// The decisions of the many-peers layer that need no device or store: whether
// a peer's record can connect us, what the rendezvous backends refuse before
// they touch the network, and a store that is not there.
#include "gpuverbs/many_peers/mesh.hpp"
#include "gpuverbs/many_peers/rendezvous/pmix.hpp"
#include "gpuverbs/many_peers/rendezvous/redis.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

using namespace gpuverbs;

namespace {

MeshRecord record_of(std::uint32_t rank, std::uint32_t world, const std::vector<std::uint32_t>& peers) {
    MeshRecord r{rank, world, {}, {}};
    for (std::uint32_t p : peers) r.endpoints.emplace_back(p, Endpoint{});
    return r;
}

/// A rendezvous that only says who we are (nothing is published or looked up here).
struct FixedRendezvous {
    std::uint32_t my_rank = 0;
    std::uint32_t size = 1;
    [[nodiscard]] std::uint32_t rank() const { return my_rank; }
    [[nodiscard]] std::uint32_t world_size() const { return size; }
    [[nodiscard]] std::string name() const { return "a fixed rendezvous"; }
    void publish(const std::string&, std::span<const std::byte>, std::error_code& ec, Diagnostics&) { ec.clear(); }
    void fence(std::chrono::milliseconds, std::error_code& ec, Diagnostics&) { ec.clear(); }
    std::vector<std::byte> lookup(std::uint32_t, const std::string&, std::chrono::milliseconds, std::error_code& ec,
                                  Diagnostics&) {
        ec.clear();
        return {};
    }
    void withdraw(std::error_code& ec, Diagnostics&) { ec.clear(); }
};

/// The Rendezvous concept holds for every backend (and refuses what is not one).
static_assert(Rendezvous<PmixRendezvous>);
static_assert(Rendezvous<RedisRendezvous>);
static_assert(!Rendezvous<MeshRecord>);

} // namespace

TEST_SUITE("mesh decisions") {
    TEST_CASE("a peer's record connects us when it is that peer's, of our world, and addressed to us") {
        CHECK(detail::mesh_peer_problem(record_of(3, 6, {0, 1, 2, 4, 5}), 3, 1, 6).empty());
        CHECK(detail::mesh_peer_problem(record_of(3, 6, {1}), 3, 1, 6).empty()); // a pair record
    }
    TEST_CASE("a record of another rank: two members claim one rank, or a stale entry") {
        std::string p = detail::mesh_peer_problem(record_of(4, 6, {1}), 3, 1, 6);
        CHECK(p ==
              "the record is rank 4's, not rank 3's: two members claim one rank, or the store holds a stale "
              "entry");
    }
    TEST_CASE("a record of another world: not the same job or service") {
        std::string p = detail::mesh_peer_problem(record_of(3, 8, {1}), 3, 1, 6);
        CHECK(p.find("made for a world of 8 members, ours has 6") != std::string::npos);
    }
    TEST_CASE("a record without an endpoint for us: that peer did not prepare a queue pair for us") {
        std::string p = detail::mesh_peer_problem(record_of(3, 6, {0, 2}), 3, 1, 6);
        CHECK(p.find("no endpoint for rank 1 (2 endpoints, for other peers)") != std::string::npos);
    }
}

TEST_SUITE("mesh construction") {
    TEST_CASE("a mesh the constructors refuse fails alike in the three forms, and comes back empty") {
        const ProtectionDomain pd;
        const CompletionQueue cq;
        MeshOptions granting;
        granting.connect.remote_access = Access::remote_write;
        struct Case {
            const char* name;
            FixedRendezvous rendezvous;
            std::vector<RemoteMemory> regions;
            MeshOptions options;
            std::string what;
        };
        const std::vector<Case> cases{
            {"a rank outside the world",
             {4, 4},
             {},
             {},
             "Mesh: a fixed rendezvous gives rank 4 of 4; a mesh needs rank < world size <= 65536"},
            {"regions as RemoteMemory, no grant",
             {0, 2},
             {RemoteMemory{0x1000, 64, 1}},
             {},
             "Mesh: regions given as RemoteMemory do not say what peers may do with them: pass the MemoryRegions "
             "themselves (each queue pair then grants what they allow) or set MeshOptions::connect.remote_access"},
            {"more regions than a record carries",
             {0, 2},
             std::vector<RemoteMemory>(wire::max_regions + 1, RemoteMemory{0x1000, 64, 1}),
             granting,
             "Mesh: " + std::to_string(wire::max_regions + 1) + " regions offered; a mesh record carries at most " +
                 std::to_string(wire::max_regions)},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            FixedRendezvous r = c.rendezvous;
            const std::string what = test::check_fails_alike(
                errc::invalid_argument, [&] { return Mesh(r, pd, cq, c.regions, c.options); },
                [&](std::error_code& ec) {
                    Mesh mesh = Mesh::create(r, pd, cq, c.regions, c.options, ec);
                    CHECK_FALSE(mesh);
                    CHECK_THROWS_WITH_AS(mesh.connect_all(),
                                         "Mesh::connect_all: the Mesh is empty (create() refused it, or it was "
                                         "moved from)",
                                         Error);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) {
                    return Mesh::create(r, pd, cq, c.regions, c.options, ec, d);
                });
            CHECK(what == c.what);
        }
        // The MemoryRegion form: an empty region.
        FixedRendezvous r{0, 2};
        const MemoryRegion none;
        const std::vector<std::reference_wrapper<const MemoryRegion>> regions{none};
        CHECK(test::check_fails_alike(
                  errc::invalid_argument, [&] { return Mesh(r, pd, cq, regions); },
                  [&](std::error_code& ec) { return Mesh::create(r, pd, cq, regions, {}, ec); },
                  [&](std::error_code& ec, Diagnostics& d) { return Mesh::create(r, pd, cq, regions, {}, ec, d); }) ==
              "Mesh: region 0 is empty");
    }

    TEST_CASE("a mesh member of a good rendezvous is made, clearing the error_code and the Diagnostics") {
        const ProtectionDomain pd;
        const CompletionQueue cq;
        FixedRendezvous r{1, 4};
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                const Mesh mesh = Mesh::create(r, pd, cq, std::vector<RemoteMemory>{}, {}, ec);
                CHECK(mesh);
                CHECK(mesh.rank() == 1);
                CHECK(mesh.world_size() == 4);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                return Mesh::create(r, pd, cq, std::vector<std::reference_wrapper<const MemoryRegion>>{}, {}, ec, d);
            });
    }
}

TEST_SUITE("rendezvous backends without a store") {
    TEST_CASE("Redis options are checked before connecting: service name, TTL, world size, rank" *
              doctest::skip(!RedisRendezvous::available())) {
        auto refused = [](RedisOptions o, const std::string& words) {
            try {
                RedisRendezvous r(std::move(o));
                FAIL("accepted");
            } catch (const Error& e) {
                CHECK(e.code() == errc::invalid_argument);
                CHECK_MESSAGE(std::string(e.what()).find(words) != std::string::npos, e.what());
            }
        };
        RedisOptions o;
        o.port = 1; // nothing is contacted: every case fails before
        o.service = "kv cache*";
        refused(o, "service name 'kv cache*' must have 1 to 100 letters");
        o.service = "kv";
        o.ttl = std::chrono::milliseconds(100);
        refused(o, "ttl must be at least 300 ms");
        o.ttl = std::chrono::milliseconds(3000);
        o.world_size = 0;
        refused(o, "world_size 0 is not between 1 and 65536");
        o.world_size = 4;
        o.rank = 4;
        refused(o, "rank 4 is outside the world (ranks are below 4)");
    }
    TEST_CASE("a store that is not there: rendezvous_unavailable naming the address, never the password" *
              doctest::skip(!RedisRendezvous::available())) {
        RedisOptions o;
        o.host = "127.0.0.1";
        o.port = 1; // nothing listens on port 1
        o.password = "s3cret-never-shown";
        try {
            RedisRendezvous r(o);
            FAIL("joined a store that is not there");
        } catch (const Error& e) {
            std::string what = e.what();
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK(what.find("cannot reach Redis at 127.0.0.1:1") != std::string::npos);
            CHECK(what.find("s3cret") == std::string::npos);
        }
    }
    TEST_CASE("PMIx outside a PMIx launcher fails alike in the three forms, and has not joined") {
        // The unit tests are not started by mpirun or srun (no PMIX_NAMESPACE).
        const std::string what = test::check_fails_alike(
            PmixRendezvous::available() ? errc::rendezvous_unavailable : errc::unsupported,
            [] { return PmixRendezvous(); },
            [](std::error_code& ec) {
                PmixRendezvous job = PmixRendezvous::create(ec);
                CHECK_FALSE(job);
                CHECK(job.world_size() == 0);
                CHECK_THROWS_AS(job.fence(std::chrono::milliseconds(10)), Error);
                return 0;
            },
            [](std::error_code& ec, Diagnostics& d) { return PmixRendezvous::create(ec, d); });
        if (PmixRendezvous::available()) {
            CHECK_MESSAGE(what.starts_with("PMIx_Init: this process was not started by a PMIx launcher"), what);
        }
    }
    TEST_CASE("a rendezvous that did not join fails each operation alike in the three forms, naming it") {
        using std::chrono::milliseconds;
        const std::vector<std::byte> value(4, std::byte{1});
        // Every backend's operations, each in its three forms (RendezvousForms
        // gives the throwing and (…, ec) forms from the backend's own).
        auto check_ops = [&](auto& r, std::error_code expected, const std::string& words) {
            const std::string publish = test::check_fails_alike(
                expected,
                [&] {
                    r.publish("k", value);
                    return 0;
                },
                [&](std::error_code& ec) {
                    r.publish("k", value, ec);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) {
                    r.publish("k", value, ec, d);
                    return 0;
                });
            CHECK_MESSAGE(publish.find(words) != std::string::npos, publish);
            const std::string fence = test::check_fails_alike(
                expected,
                [&] {
                    r.fence(milliseconds(10));
                    return 0;
                },
                [&](std::error_code& ec) {
                    r.fence(milliseconds(10), ec);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) {
                    r.fence(milliseconds(10), ec, d);
                    return 0;
                });
            CHECK_MESSAGE(fence.find(words) != std::string::npos, fence);
            const std::string lookup = test::check_fails_alike(
                expected, [&] { return r.lookup(0, "k", milliseconds(10)); },
                [&](std::error_code& ec) { return r.lookup(0, "k", milliseconds(10), ec); },
                [&](std::error_code& ec, Diagnostics& d) { return r.lookup(0, "k", milliseconds(10), ec, d); });
            CHECK_MESSAGE(lookup.find(words) != std::string::npos, lookup);
        };
        {
            std::error_code ec;
            PmixRendezvous job = PmixRendezvous::create(ec);
            REQUIRE(ec);
            check_ops(job, PmixRendezvous::available() ? errc::rendezvous_unavailable : errc::unsupported,
                      PmixRendezvous::available() ? "did not join a job (create() failed)" : "built without PMIx");
            std::error_code withdrawn = make_error_code(errc::invalid_argument);
            job.withdraw(withdrawn); // nothing to remove in PMIx
            CHECK_FALSE(withdrawn);
        }
        {
            std::error_code ec;
            RedisOptions options;
            options.port = 1; // nothing listens there
            options.command_timeout = std::chrono::milliseconds(200);
            RedisRendezvous store = RedisRendezvous::create(options, ec);
            REQUIRE(ec);
            check_ops(
                store, RedisRendezvous::available() ? errc::rendezvous_unavailable : errc::unsupported,
                RedisRendezvous::available() ? "did not join its service (create() failed)" : "built without hiredis");
            std::error_code members_ec;
            Diagnostics members_words;
            CHECK(store.members(members_ec, members_words).empty());
            CHECK(members_ec);
            CHECK(members_words.message().starts_with("RedisRendezvous::members: "));
        }
    }
    TEST_CASE("a rendezvous of one's own: the error_code forms alone make it one, and Diagnostics::set words them") {
        static_assert(Rendezvous<FixedRendezvous>); // no throwing form at all
        Diagnostics d;
        d.set(errc::peer_missing, "MyStore::lookup", "rank 3 published nothing");
        CHECK(d.verb() == "MyStore::lookup");
        CHECK(d.detail() == "rank 3 published nothing");
        CHECK(d.message() == "MyStore::lookup: rank 3 published nothing");
        d.set(std::error_code(), "MyStore::lookup", "ignored"); // no error: no words
        CHECK(d.message().empty());
    }
    TEST_CASE("the backends built here say so") {
        CHECK(PmixRendezvous::available() == (GPUVERBS_TEST_HAVE_PMIX != 0));
        CHECK(RedisRendezvous::available() == (GPUVERBS_TEST_HAVE_HIREDIS != 0));
    }
    TEST_CASE("Mesh's methods have three forms that fail alike: a peer out of the world, ourselves, an empty mesh") {
        const ProtectionDomain pd;
        const CompletionQueue cq;
        FixedRendezvous r{1, 4};
        Mesh mesh(r, pd, cq, std::vector<RemoteMemory>{});
        CHECK(test::check_fails_alike(
                  errc::invalid_argument,
                  [&] {
                      mesh.connect(7);
                      return 0;
                  },
                  [&](std::error_code& ec) {
                      mesh.connect(7, ec);
                      return 0;
                  },
                  [&](std::error_code& ec, Diagnostics& d) {
                      mesh.connect(7, ec, d);
                      return 0;
                  }) == "Mesh::connect: rank 1 cannot connect to rank 7 (the world has 4 ranks)");
        const std::uint32_t ourselves[] = {1};
        CHECK(test::check_fails_alike(
                  errc::invalid_argument,
                  [&] {
                      mesh.offer(ourselves);
                      return 0;
                  },
                  [&](std::error_code& ec) {
                      mesh.offer(ourselves, ec);
                      return 0;
                  },
                  [&](std::error_code& ec, Diagnostics& d) {
                      mesh.offer(ourselves, ec, d);
                      return 0;
                  }) == "Mesh::connect: rank 1 cannot connect to rank 1 (itself)");
        CHECK(test::check_fails_alike(
                  errc::invalid_argument, [&] { return &mesh.peer(9); },
                  [&](std::error_code& ec) {
                      MeshPeer* p = mesh.peer(9, ec);
                      CHECK(p == nullptr);
                      return p;
                  },
                  [&](std::error_code& ec, Diagnostics& d) { return mesh.peer(9, ec, d); }) ==
              "Mesh::connect: rank 1 cannot connect to rank 9 (the world has 4 ranks)");
        CHECK(mesh.peers().empty()); // nothing half-made is left behind
        CHECK(mesh.offered().empty());

        Mesh empty = std::move(mesh);
        CHECK(test::check_fails_alike(
                  errc::invalid_argument,
                  [&] {
                      mesh.connect_all();
                      return 0;
                  },
                  [&](std::error_code& ec) {
                      mesh.connect_all(ec);
                      return 0;
                  },
                  [&](std::error_code& ec, Diagnostics& d) {
                      mesh.connect_all(ec, d);
                      return 0;
                  }) == "Mesh::connect_all: the Mesh is empty (create() refused it, or it was moved from)");
    }

    TEST_CASE("PeerEvent describes itself") {
        CHECK(PeerEvent{PeerEvent::Kind::joined, 7}.describe() == "rank 7 joined");
        CHECK(PeerEvent{PeerEvent::Kind::left, 0}.describe() == "rank 0 left");
    }
}
