// Least access, attacked on the rig: a queue pair grants its peer only what
// it advertised (PreparedQueuePair::advertise, CmConnection::advertise,
// Mesh's regions), nothing by default. Each attack below holds a valid key
// for memory in the victim's protection domain and tries to use it through
// a queue pair that was never meant to allow it; before, every queue pair
// granted write, read and atomics, and each of these succeeded.
#include "cm_end.hpp"
#include "gpuverbs/connections/rdma_cm.hpp"
#include "rig_pair.hpp"
#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <future>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

using namespace gpuverbs;
using namespace std::chrono_literals;
using gpuverbs::test::poll_for;

namespace {

/// What a peer's refused request ends with on Soft-RoCE: its responder
/// answers an operation the queue pair does not grant with "invalid request"
/// (IBV_WC_REM_INV_REQ_ERR; hardware may say IBV_WC_REM_ACCESS_ERR), and the
/// message says to look at what the peer advertised.
bool refused_remotely(const Completion& c) {
    return c.status.raw() == IBV_WC_REM_INV_REQ_ERR &&
           c.status.message().find("PreparedQueuePair::advertise") != std::string::npos;
}

bool all_are(std::span<const std::byte> bytes, std::byte value) {
    return std::all_of(bytes.begin(), bytes.end(), [value](std::byte b) { return b == value; });
}

/// Connects `attacker` to `victim`; the victim's grant is what it advertised (or `grant`).
void connect(test::Side& attacker, test::Side& victim, std::optional<Access> grant = std::nullopt) {
    const Endpoint ea = attacker.prepared.endpoint(), ev = victim.prepared.endpoint();
    ConnectOptions options;
    options.remote_access = grant;
    attacker.qp = std::move(attacker.prepared).connect(ev);
    victim.qp = std::move(victim.prepared).connect(ea, options);
}

Completion one_completion(CompletionQueue& cq) {
    auto got = poll_for(cq, 1, 10s);
    REQUIRE_MESSAGE(got.size() == 1, "the request did not complete within 10 s");
    return got[0];
}

} // namespace

TEST_SUITE("least access on real RDMA" * doctest::skip(!test::rig_present())) {
    TEST_CASE("attack: a queue pair that advertised nothing grants nothing: a valid key writes and reads nothing") {
        const auto rig = *test::rig_devices();
        test::Side attacker(rig.dev0, 1 << 16, {}), victim(rig.dev1, 1 << 16, {});
        // The victim's region allows everything, and the attacker somehow has its key.
        std::fill(victim.memory.begin(), victim.memory.end(), std::byte{0x5a});
        const RemoteMemory key = victim.mr.remote();
        connect(attacker, victim);
        CHECK(victim.qp.remote_access() == Access::none);

        std::fill(attacker.memory.begin(), attacker.memory.end(), std::byte{0x01});
        REQUIRE_FALSE(attacker.qp.post_write(attacker.mr.slice(0, 4096), key, 0));
        const Completion write = one_completion(attacker.cq);
        MESSAGE("the attacker's write: " << write.status.message());
        CHECK(refused_remotely(write));
        CHECK(all_are(victim.memory, std::byte{0x5a}));
    }

    TEST_CASE(
        "attack: a peer given a read-only region cannot write through that queue pair to another region "
        "of the same protection domain, nor run atomics; reading what was advertised works") {
        const auto rig = *test::rig_devices();
        test::Side attacker(rig.dev0, 1 << 16, {}), victim(rig.dev1, 1 << 16, {});
        // The victim advertises a read-only region; in the same PD lives a
        // region writable by anyone who has its key (another peer's).
        std::vector<std::byte> shown(4096, std::byte{0x33});
        MemoryRegion readable(victim.pd, shown, Access::remote_read);
        std::fill(victim.memory.begin(), victim.memory.end(), std::byte{0x5a});
        const RemoteMemory advertised = victim.prepared.advertise(readable);
        CHECK(victim.prepared.advertised_access() == Access::remote_read);
        const RemoteMemory other = victim.mr.remote(); // access_all, not advertised here
        connect(attacker, victim);
        CHECK(victim.qp.remote_access() == Access::remote_read);

        REQUIRE_FALSE(attacker.qp.post_read(attacker.mr.slice(0, 4096), advertised, 0));
        const Completion read = one_completion(attacker.cq);
        REQUIRE_MESSAGE(read.ok(), read.status.message());
        CHECK(all_are(std::span(attacker.memory).first(4096), std::byte{0x33}));

        std::fill(attacker.memory.begin(), attacker.memory.end(), std::byte{0x01});
        REQUIRE_FALSE(attacker.qp.post_write(attacker.mr.slice(0, 4096), other, 0));
        const Completion write = one_completion(attacker.cq);
        MESSAGE("the attacker's write to the other region: " << write.status.message());
        CHECK(refused_remotely(write));
        CHECK(all_are(victim.memory, std::byte{0x5a}));
    }

    TEST_CASE("attack: atomics are refused through a queue pair that grants write and read only") {
        const auto rig = *test::rig_devices();
        test::Side attacker(rig.dev0, 1 << 16, {}), victim(rig.dev1, 1 << 16, {});
        std::fill(victim.memory.begin(), victim.memory.end(), std::byte{0x5a});
        connect(attacker, victim, Access::remote_write | Access::remote_read);
        CHECK(victim.qp.remote_access() == (Access::remote_write | Access::remote_read));
        REQUIRE_FALSE(attacker.qp.post_fetch_add(attacker.mr.slice(0, 8), victim.mr.remote(), 0, 1));
        const Completion atomic = one_completion(attacker.cq);
        MESSAGE("the attacker's fetch-and-add: " << atomic.status.message());
        CHECK(refused_remotely(atomic));
        CHECK(all_are(victim.memory, std::byte{0x5a}));
    }

    TEST_CASE("ConnectOptions::remote_access grants exactly what it says; reset keeps the grant") {
        const auto rig = *test::rig_devices();
        test::Side a(rig.dev0, 1 << 16, {}), b(rig.dev1, 1 << 16, {});
        (void)b.prepared.advertise(b.mr);    // access_all advertised...
        connect(a, b, Access::remote_write); // ...but the grant says write only
        CHECK(b.qp.remote_access() == Access::remote_write);
        std::fill(a.memory.begin(), a.memory.end(), std::byte{0x42});
        REQUIRE_FALSE(a.qp.post_write(a.mr.slice(0, 4096), b.mr.remote(), 0));
        const Completion write = one_completion(a.cq);
        REQUIRE_MESSAGE(write.ok(), write.status.message());
        CHECK(all_are(std::span(b.memory).first(4096), std::byte{0x42}));
        REQUIRE_FALSE(a.qp.post_read(a.mr.slice(0, 4096), b.mr.remote(), 8192));
        CHECK(refused_remotely(one_completion(a.cq)));

        // Reset and connected again without options: the same grant, no wider.
        PreparedQueuePair ra = std::move(a.qp).reset();
        PreparedQueuePair rb = std::move(b.qp).reset();
        CHECK(rb.advertised_access() == Access::remote_write);
        const Endpoint ea = ra.endpoint(), eb = rb.endpoint();
        a.qp = std::move(ra).connect(eb);
        b.qp = std::move(rb).connect(ea);
        CHECK(b.qp.remote_access() == Access::remote_write);
    }

    TEST_CASE(
        "attack: a reader leased blocks through lease regions reads them, cannot read the block between "
        "them with the lease's key, and can read nothing once the lease is released") {
        const auto rig = *test::rig_devices();
        test::Side reader(rig.dev0, 1 << 16, {}), owner(rig.dev1, 1 << 16, {});
        constexpr std::uint64_t block = 4096;
        for (std::size_t i = 0; i < owner.memory.size(); ++i) owner.memory[i] = std::byte(i / block + 1);
        BlockLeases leases;
        // Blocks 1, 2 and 4 of the owner's pool: two runs, [1, 3) and [4, 5).
        const RemoteMemory pool = owner.prepared.advertise(owner.mr);
        const std::vector<RemoteBlock> blocks{
            {pool, 1 * block, block}, {pool, 2 * block, block}, {pool, 4 * block, block}};
        const LeasedBlockList list = leases.grant(blocks, 7, owner.pd, Access::remote_read);
        CHECK(list.scope == LeaseScope::lease_regions);
        REQUIRE(list.blocks.size() == 3);
        CHECK(list.blocks[0].memory == list.blocks[1].memory); // one region for the run of blocks 1 and 2
        CHECK(list.blocks[0].memory.length == 2 * block);
        CHECK(list.blocks[2].memory.length == block);
        CHECK(list.blocks[0].memory.rkey != pool.rkey);
        CHECK(list.blocks[1].offset == block);
        CHECK(leases.held(blocks[0]));
        CHECK_FALSE(leases.held({pool, 3 * block, block}));
        const LeasedBlockList wire_copy = wire::parse_leased_block_list(wire::serialize(list));
        CHECK(wire_copy == list);
        auto connect_reader = [&] {
            if (!reader.prepared) {
                reader.prepared = std::move(reader.qp).reset();
                owner.prepared = std::move(owner.qp).reset();
            }
            connect(reader, owner);
        };
        connect_reader();

        // The leased blocks, through the list: every byte.
        for (std::size_t k = 0; k < 3; ++k) {
            REQUIRE_FALSE(reader.qp.post_read(reader.mr.slice(k * block, block), wire_copy.blocks[k].memory,
                                              wire_copy.blocks[k].offset));
            const Completion read = one_completion(reader.cq);
            REQUIRE_MESSAGE(read.ok(), read.status.message());
        }
        CHECK(all_are(std::span(reader.memory).subspan(0, block), std::byte{2}));
        CHECK(all_are(std::span(reader.memory).subspan(block, block), std::byte{3}));
        CHECK(all_are(std::span(reader.memory).subspan(2 * block, block), std::byte{5}));

        // Block 3 lies between the runs: the second run's key, stretched over it by a lying reader.
        RemoteMemory stretched = wire_copy.blocks[2].memory;
        stretched.address -= block;
        stretched.length += block;
        REQUIRE_FALSE(reader.qp.post_read(reader.mr.slice(0, block), stretched, 0));
        const Completion outside = one_completion(reader.cq);
        MESSAGE("a read of the block between the runs: " << outside.status.message());
        CHECK(outside.status.raw() == IBV_WC_REM_ACCESS_ERR);

        // Released: the regions are gone, and so is every byte they reached.
        CHECK_FALSE(leases.release(list.lease, 7));
        CHECK_FALSE(leases.held(blocks[0]));
        connect_reader();
        REQUIRE_FALSE(reader.qp.post_read(reader.mr.slice(0, block), wire_copy.blocks[0].memory, 0));
        const Completion late = one_completion(reader.cq);
        MESSAGE("a read after the release: " << late.status.message());
        CHECK(late.status.raw() == IBV_WC_REM_ACCESS_ERR);
    }

    TEST_CASE(
        "attack: an expired lease's key reads nothing from the moment it expires, though the owner calls nothing "
        "on its table (ttl 2,000 + grace 500 ms: refused at 3,000 ms)") {
        const auto rig = *test::rig_devices();
        test::Side reader(rig.dev0, 1 << 16, {}), owner(rig.dev1, 1 << 16, {});
        std::fill(owner.memory.begin(), owner.memory.end(), std::byte{0x42});
        BlockLeases leases({.ttl = 2000ms, .grace = 500ms});
        const RemoteMemory pool = owner.prepared.advertise(owner.mr);
        const LeasedBlockList list = leases.grant({{pool, 0, 4096}}, 9, owner.pd, Access::remote_read);
        const auto granted = std::chrono::steady_clock::now();
        connect(reader, owner);
        REQUIRE_FALSE(reader.qp.post_read(reader.mr.slice(0, 4096), list.blocks[0].memory, 0));
        const Completion before = one_completion(reader.cq);
        REQUIRE_MESSAGE(before.ok(), before.status.message());
        CHECK(all_are(std::span(reader.memory).first(4096), std::byte{0x42}));
        // The owner does nothing with its table from here on.
        std::this_thread::sleep_until(granted + 3000ms);
        REQUIRE_FALSE(reader.qp.post_read(reader.mr.slice(4096, 4096), list.blocks[0].memory, 0));
        const Completion after = one_completion(reader.cq);
        MESSAGE("a read of an expired lease's region at +3,000 ms: " << after.status.message());
        CHECK(after.status.raw() == IBV_WC_REM_ACCESS_ERR);
        // The table names the lease its thread expired (a reader that never released: worth a log line).
        CHECK(leases.expire() == std::vector<std::uint32_t>{list.lease});
    }

    TEST_CASE("a lease whose memory cannot be registered again is refused in words, and nothing is leased") {
        const auto rig = *test::rig_devices();
        test::Side owner(rig.dev1, 1 << 16, {});
        BlockLeases leases;
        const RemoteMemory nowhere{4096, 1 << 20, 1}; // an address nothing is mapped at
        CHECK_THROWS_WITH_AS((void)leases.grant({{nowhere, 0, 4096}}, 1, owner.pd, Access::remote_read),
                             doctest::Contains("cannot register a region of the lease over 4096 bytes at 0x1000"),
                             Error);
        CHECK(leases.active() == 0);
        CHECK(leases.statistics().granted == 0);
    }

    TEST_CASE(
        "a grant through lease regions fails alike in the three forms where the memory cannot be registered, and "
        "clears the error_code and the Diagnostics where it can") {
        const auto rig = *test::rig_devices();
        test::Side owner(rig.dev1, 1 << 16, {});
        BlockLeases leases;
        const std::vector<RemoteBlock> nowhere{{{4096, 1 << 20, 1}, 0, 4096}}; // an address nothing is mapped at
        const auto [code, what] = test::check_forms_agree(
            [&] { return leases.grant(nowhere, 1, owner.pd, Access::remote_read); },
            [&](std::error_code& ec) { return leases.grant(nowhere, 1, owner.pd, Access::remote_read, ec); },
            [&](std::error_code& ec, Diagnostics& d) {
                return leases.grant(nowhere, 1, owner.pd, Access::remote_read, ec, d);
            });
        CHECK_MESSAGE(what.find("cannot register a region of the lease over 4096 bytes at 0x1000") != std::string::npos,
                      what);
        MESSAGE("the registration's code: " << code.message());
        CHECK(leases.active() == 0);
        const RemoteMemory pool = owner.prepared.advertise(owner.mr);
        test::check_succeeds_clean(
            [&](std::error_code& ec) {
                CHECK(leases.grant({{pool, 0, 4096}}, 1, owner.pd, Access::remote_read, ec).scope ==
                      LeaseScope::lease_regions);
            },
            [&](std::error_code& ec, Diagnostics& d) {
                CHECK(leases.grant({{pool, 4096, 4096}}, 2, owner.pd, Access::remote_read, ec, d).blocks.size() == 1);
            });
        CHECK(leases.active() == 2);
    }

    TEST_CASE("advertise refuses what a peer could not use, with words") {
        const auto rig = *test::rig_devices();
        test::Side a(rig.dev0, 1 << 16, {}), b(rig.dev1, 1 << 16, {});
        CHECK_THROWS_WITH_AS((void)a.prepared.advertise(b.mr),
                             doctest::Contains("belongs to another protection domain"), Error);
        CHECK_THROWS_WITH_AS((void)a.prepared.advertise(MemoryRegion()), doctest::Contains("MemoryRegion is empty"),
                             Error);
        CHECK(a.prepared.advertised_access() == Access::none); // nothing was advertised by the refusals
    }
}

#if GPUVERBS_HAVE_RDMACM

TEST_SUITE("least access on real RDMA: rdma_cm" * doctest::skip(!test::rig_present())) {
    /// The queue pair's access flags as the device has them now.
    unsigned device_access(QueuePair & qp) {
        ibv_qp_attr attr{};
        ibv_qp_init_attr init{};
        REQUIRE(ibv_query_qp(qp.native_handle(), &attr, IBV_QP_ACCESS_FLAGS, &init) == 0);
        return attr.qp_access_flags;
    }

    TEST_CASE(
        "attack: an rdma_cm connection that advertised a read-only region lets its region be read and refuses a "
        "write to another region of its domain (rdma_cm itself would have granted write, read and atomics)") {
        const auto rig = *test::rig_devices();
        CmListener listener(rig.ip1, 0);
        auto server = std::async(std::launch::async, [&] {
            // The server's end: not test::CmEnd, which advertises its memory.
            auto conn = listener.accept(20s);
            ProtectionDomain pd(conn.device());
            CompletionQueue cq(conn.device(), 64);
            auto memory = std::make_unique<std::vector<std::byte>>(std::size_t{1} << 16, std::byte{0x5a});
            MemoryRegion all(pd, *memory, access_all);
            std::vector<std::byte> shown(4096, std::byte{0x33});
            MemoryRegion readable(pd, shown, Access::remote_read);
            (void)conn.create_qp(pd, cq, cq);
            const RemoteMemory advertised = conn.advertise(readable);
            conn.accept();
            const unsigned granted = device_access(conn.qp());
            const Access reported = conn.qp().remote_access();
            // Destroyed in reverse: the connection (its queue pair) first, the domain last.
            return std::tuple{std::move(pd),       std::move(cq),   std::move(memory), std::move(shown), std::move(all),
                              std::move(readable), std::move(conn), advertised,        granted,          reported};
        });
        test::CmEnd client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        client.conn.connect();
        auto [pd, cq, memory, shown, all, readable, conn, advertised, granted, reported] = server.get();
        CHECK(granted == IBV_ACCESS_REMOTE_READ);
        CHECK(reported == Access::remote_read);

        REQUIRE_FALSE(client.qp().post_read(client.mr.slice(0, 4096), advertised, 0));
        const Completion read = one_completion(client.cq);
        REQUIRE_MESSAGE(read.ok(), read.status.message());
        CHECK(all_are(std::span(client.memory).first(4096), std::byte{0x33}));

        std::fill(client.memory.begin(), client.memory.end(), std::byte{0x01});
        REQUIRE_FALSE(client.qp().post_write(client.mr.slice(0, 4096), all.remote(), 0));
        const Completion write = one_completion(client.cq);
        MESSAGE("the client's write to the server's other region: " << write.status.message());
        CHECK(refused_remotely(write));
        CHECK(all_are(*memory, std::byte{0x5a}));
    }

    TEST_CASE(
        "an rdma_cm connection that advertised nothing grants nothing and asks for no responder "
        "resources; CmOptions::remote_access grants what it says") {
        const auto rig = *test::rig_devices();
        CmListener listener(rig.ip1, 0);
        auto server = std::async(std::launch::async, [&] {
            auto conn = listener.accept(20s);
            ProtectionDomain pd(conn.device());
            CompletionQueue cq(conn.device(), 64);
            (void)conn.create_qp(pd, cq, cq);
            conn.accept();
            return std::tuple{device_access(conn.qp()), conn.parameters().responder_resources,
                              conn.qp().remote_access()};
        });
        test::CmEnd client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
        client.conn.create_qp(client.pd, client.cq, client.cq);
        CmOptions write_only;
        write_only.remote_access = Access::remote_write; // overrides what CmEnd advertised
        client.conn.connect(write_only);
        const auto [server_flags, server_resources, server_reported] = server.get();
        CHECK(server_flags == 0);
        CHECK(server_resources == 0);
        CHECK(server_reported == Access::none);
        CHECK(device_access(client.qp()) == IBV_ACCESS_REMOTE_WRITE);
        CHECK(client.qp().remote_access() == Access::remote_write);
        MESSAGE("the client's responder resources as rdma_cm set them: "
                << int(client.conn.parameters().responder_resources) << " (its grant has no read: none used)");
    }

    TEST_CASE(
        "rdma_cm in every grant combination (nothing, write, read, everything on each side): the depths agree "
        "with docs/rdma-cm.md, and a read, a write and an atomic each way work or are refused, never hang") {
        const auto rig = *test::rig_devices();
        const Access grants[] = {Access::none, Access::remote_write, Access::remote_read,
                                 Access::remote_write | Access::remote_read | Access::remote_atomic};
        auto name = [](Access a) -> std::string {
            if (a == Access::none) return "nothing";
            if (a == Access::remote_write) return "write";
            if (a == Access::remote_read) return "read";
            return "everything";
        };
        auto grants_reads = [](Access a) {
            return (a & (Access::remote_read | Access::remote_atomic)) != Access::none;
        };
        enum class Op { read, write, atomic };
        for (const Access client_grant : grants) {
            for (const Access server_grant : grants) {
                CAPTURE(name(client_grant));
                CAPTURE(name(server_grant));
                CmListener listener(rig.ip1, 0);
                auto server = std::async(std::launch::async, [&] {
                    test::CmEnd end(listener.accept(20s)); // advertises its memory (everything) ...
                    end.conn.create_qp(end.pd, end.cq, end.cq);
                    CmOptions options;
                    options.remote_access = server_grant; // ... and grants what the case says
                    end.conn.accept(options);
                    return end;
                });
                test::CmEnd client(cm_resolve(rig.ip1, listener.port(), 20s, rig.ip0));
                client.conn.create_qp(client.pd, client.cq, client.cq);
                CmOptions options;
                options.remote_access = client_grant;
                client.conn.connect(options);
                test::CmEnd srv = server.get();

                // The depths: each side answers as many reads as it granted, and issues as many as the peer granted.
                const std::uint8_t server_answers = grants_reads(server_grant) ? 16 : 0;
                const std::uint8_t client_answers = grants_reads(client_grant) ? 16 : 0;
                CHECK(int(srv.conn.parameters().responder_resources) == server_answers);
                CHECK(int(srv.conn.parameters().initiator_depth) == client_answers);
                CHECK(int(client.conn.parameters().responder_resources) == client_answers);
                CHECK(int(client.conn.parameters().initiator_depth) == server_answers);
                CHECK(srv.qp().capabilities().max_rd_atomic == client_answers);
                CHECK(client.qp().capabilities().max_rd_atomic == server_answers);
                CHECK(int(srv.conn.requested().initiator_depth) == 16); // what the client asked for, unswapped
                CHECK(int(srv.conn.requested().responder_resources) == client_answers);

                // What must work, each way, and what is refused at once (no read depth: never on the wire);
                // then one request the peer did not grant (a remote refusal moves both queue pairs to error).
                auto post = [](test::CmEnd& from, test::CmEnd& to, Op op) {
                    const RemoteMemory target = to.mr.remote();
                    if (op == Op::write) return from.qp().post_write(from.mr.slice(0, 64), target, 64);
                    if (op == Op::read) return from.qp().post_read(from.mr.slice(128, 64), target, 0);
                    return from.qp().post_fetch_add(from.mr.slice(256, 8), target, 512, 1);
                };
                std::optional<std::pair<test::CmEnd*, Op>> refused_by_peer;
                for (test::CmEnd* from : {&client, &srv}) {
                    test::CmEnd& to = from == &client ? srv : client;
                    const Access granted = from == &client ? server_grant : client_grant;
                    for (const Op op : {Op::write, Op::read, Op::atomic}) {
                        CAPTURE(from == &client ? "client" : "server");
                        CAPTURE(static_cast<int>(op));
                        const Access needs = op == Op::write  ? Access::remote_write
                                             : op == Op::read ? Access::remote_read
                                                              : Access::remote_atomic;
                        if (op != Op::write && from->qp().capabilities().max_rd_atomic == 0) {
                            const std::error_code posted = post(*from, to, op);
                            CHECK_MESSAGE(posted == errc::reads_not_granted, posted.message());
                        } else if ((granted & needs) == Access::none) {
                            if (!refused_by_peer) refused_by_peer = std::pair{from, op};
                        } else {
                            const std::error_code posted = post(*from, to, op);
                            REQUIRE_MESSAGE(!posted, posted.message());
                            const Completion c = one_completion(from->cq);
                            CHECK_MESSAGE(c.ok(), c.status.message());
                        }
                    }
                }
                if (refused_by_peer) {
                    test::CmEnd& from = *refused_by_peer->first;
                    REQUIRE_FALSE(post(from, &from == &client ? srv : client, refused_by_peer->second));
                    const Completion c = one_completion(from.cq);
                    CHECK_MESSAGE(refused_remotely(c), c.status.message());
                }
                MESSAGE("client grants " << name(client_grant) << ", server grants " << name(server_grant)
                                         << ": server answers/issues " << int(srv.conn.parameters().responder_resources)
                                         << "/" << int(srv.conn.parameters().initiator_depth) << ", client "
                                         << int(client.conn.parameters().responder_resources) << "/"
                                         << int(client.conn.parameters().initiator_depth));
            }
        }
    }
}

#endif
