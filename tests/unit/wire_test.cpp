// The serialized forms: exact layouts, round trips, and every kind of bad record.
#include "gpuverbs/connections/wire.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <functional>
#include <span>
#include <string>
#include <vector>

using namespace gpuverbs;

namespace {

Endpoint sample_endpoint() {
    Endpoint e;
    e.qp_num = 0x000011;
    e.psn = 0xabcdef;
    e.lid = 0x0102;
    e.gid = *Gid::parse("::ffff:10.0.0.1");
    e.mtu = Mtu::mtu_4096;
    e.link_layer = LinkLayer::ethernet;
    return e;
}

std::string detail_of(std::span<const std::byte> bytes, std::error_code& ec) {
    detail::Status s;
    (void)wire::detail::parse_handshake(bytes, s);
    ec = s.code;
    return s.detail;
}

} // namespace

TEST_SUITE("wire format") {
    TEST_CASE("an endpoint has a fixed big-endian layout") {
        auto b = wire::serialize(sample_endpoint());
        REQUIRE(b.size() == 40);
        CHECK(std::string(reinterpret_cast<const char*>(b.data()), 4) == "GVEP");
        CHECK(b[4] == std::byte{0});
        CHECK(b[5] == std::byte{1}); // version 1
        CHECK(b[8] == std::byte{0x00});
        CHECK(b[11] == std::byte{0x11}); // qp_num, big-endian
        CHECK(b[13] == std::byte{0xab}); // psn
        CHECK(b[16] == std::byte{0x01}); // lid
        CHECK(b[18] == std::byte{5});    // IBV_MTU_4096
        CHECK(b[19] == std::byte{static_cast<unsigned char>(LinkLayer::ethernet)});
        CHECK(b[30] == std::byte{0xff}); // GID ::ffff:10.0.0.1
        CHECK(b[32] == std::byte{10});
        CHECK(wire::parse_endpoint(b) == sample_endpoint());
    }

    TEST_CASE("remote memory round-trips through its 28-byte form") {
        RemoteMemory m{0x7f0012345678, 8 << 20, 0xdeadbeef};
        auto b = wire::serialize(m);
        REQUIRE(b.size() == 28);
        CHECK(b[8] == std::byte{0x00});
        CHECK(b[10] == std::byte{0x7f});
        CHECK(wire::parse_remote_memory(b) == m);
    }

    TEST_CASE("a handshake round-trips with zero and many regions") {
        Handshake h{sample_endpoint(), {}};
        CHECK(wire::parse_handshake(wire::serialize(h)) == h);
        for (std::uint32_t i = 0; i < wire::max_regions; ++i) h.regions.push_back({std::uint64_t{0x1000} * i, 4096, i});
        auto b = wire::serialize(h);
        CHECK(b.size() == wire::max_handshake_size);
        CHECK(wire::parse_handshake(b) == h);
        h.regions.push_back({});
        CHECK_THROWS_AS(wire::serialize(h), Error);
    }

    TEST_CASE("a truncated record is refused and says how long it is") {
        auto b = wire::serialize(Handshake{sample_endpoint(), {{1, 2, 3}}});
        std::error_code ec;
        std::string why = detail_of(std::span(b).first(b.size() - 1), ec);
        CHECK(ec == errc::malformed_record);
        CHECK(why.find("announces 1 regions") != std::string::npos);
        why = detail_of(std::span(b).first(10), ec);
        CHECK(ec == errc::malformed_record);
        CHECK(why.find("handshake record is 10 bytes; it must be at least 48 (truncated)") != std::string::npos);
        auto endpoint_bytes = wire::serialize(sample_endpoint());
        CHECK_FALSE(wire::parse_endpoint(std::span(endpoint_bytes).first(39), ec).qp_num);
        CHECK(ec == errc::malformed_record);
    }

    TEST_CASE("trailing bytes are refused") {
        auto e = wire::serialize(sample_endpoint());
        std::vector<std::byte> longer(e.begin(), e.end());
        longer.push_back(std::byte{0});
        std::error_code ec;
        (void)wire::parse_endpoint(longer, ec);
        CHECK(ec == errc::malformed_record);
    }

    TEST_CASE("garbage is refused as not a gpuverbs record") {
        std::vector<std::byte> garbage(100, std::byte{0x41});
        std::error_code ec;
        std::string why = detail_of(garbage, ec);
        CHECK(ec == errc::malformed_record);
        CHECK(why.find("not a gpuverbs handshake record") != std::string::npos);
    }

    TEST_CASE("another version is refused with advice to match releases") {
        auto b = wire::serialize(Handshake{sample_endpoint(), {}});
        b[5] = std::byte{2};
        std::error_code ec;
        std::string why = detail_of(b, ec);
        CHECK(ec == errc::unsupported_version);
        CHECK(why.find("version 2; this gpuverbs reads version 1") != std::string::npos);
    }

    TEST_CASE("values outside their ranges are refused") {
        std::error_code ec;
        auto bad_mtu = wire::serialize(sample_endpoint());
        bad_mtu[18] = std::byte{9};
        (void)wire::parse_endpoint(bad_mtu, ec);
        CHECK(ec == errc::malformed_record);
        Endpoint big_qpn = sample_endpoint();
        big_qpn.qp_num = 0x1000000;
        (void)wire::parse_endpoint(wire::serialize(big_qpn), ec);
        CHECK(ec == errc::malformed_record);
        auto reserved = wire::serialize(sample_endpoint());
        reserved[7] = std::byte{1};
        (void)wire::parse_endpoint(reserved, ec);
        CHECK(ec == errc::malformed_record);
        auto overflow = wire::serialize(RemoteMemory{~0ull - 10, 100, 1});
        (void)wire::parse_remote_memory(overflow, ec);
        CHECK(ec == errc::malformed_record);
    }

    TEST_CASE("each parser's three forms say the same words: Error::what(), the code, Diagnostics::message()") {
        // A bad record of each kind, and a good one after it clears the words.
        struct Form {
            const char* name;
            std::function<void(std::span<const std::byte>)> throwing;
            std::function<void(std::span<const std::byte>, std::error_code&, Diagnostics&)> with_words;
            std::vector<std::byte> good;
        };
        MeshRecord mesh;
        mesh.rank = 0;
        mesh.world_size = 2;
        mesh.endpoints.emplace_back(1, sample_endpoint());
        const RemoteMemory region{0x1000, 4096, 7};
        const std::vector<RemoteBlock> blocks{{region, 0, 64}};
        LeasedBlockList leased;
        leased.blocks = blocks;
        const auto bytes_of = [](auto array) { return std::vector<std::byte>(array.begin(), array.end()); };
        const std::vector<Form> forms{
            {"endpoint", [](auto b) { (void)wire::parse_endpoint(b); },
             [](auto b, auto& ec, auto& d) { (void)wire::parse_endpoint(b, ec, d); },
             bytes_of(wire::serialize(sample_endpoint()))},
            {"remote memory", [](auto b) { (void)wire::parse_remote_memory(b); },
             [](auto b, auto& ec, auto& d) { (void)wire::parse_remote_memory(b, ec, d); },
             bytes_of(wire::serialize(region))},
            {"handshake", [](auto b) { (void)wire::parse_handshake(b); },
             [](auto b, auto& ec, auto& d) { (void)wire::parse_handshake(b, ec, d); },
             wire::serialize(Handshake{sample_endpoint(), {region}})},
            {"mesh record", [](auto b) { (void)wire::parse_mesh_record(b); },
             [](auto b, auto& ec, auto& d) { (void)wire::parse_mesh_record(b, ec, d); }, wire::serialize(mesh)},
            {"block list", [](auto b) { (void)wire::parse_block_list(b); },
             [](auto b, auto& ec, auto& d) { (void)wire::parse_block_list(b, ec, d); },
             wire::serialize(std::span<const RemoteBlock>(blocks))},
            {"leased block list", [](auto b) { (void)wire::parse_leased_block_list(b); },
             [](auto b, auto& ec, auto& d) { (void)wire::parse_leased_block_list(b, ec, d); }, wire::serialize(leased)},
        };
        for (const Form& form : forms) {
            CAPTURE(form.name);
            const std::vector<std::byte> truncated(form.good.begin(), form.good.end() - 1);
            std::string what;
            try {
                form.throwing(truncated);
                FAIL("parsed a truncated record");
            } catch (const Error& e) {
                what = e.what();
                CHECK(e.code() == errc::malformed_record);
            }
            std::error_code ec;
            Diagnostics words;
            form.with_words(truncated, ec, words);
            CHECK(ec == errc::malformed_record);
            CHECK(words.message() == what);
            CHECK(words.verb() == "gpuverbs::wire::parse");
            CHECK(what.find(" bytes") != std::string::npos); // says how long it was
            form.with_words(form.good, ec, words);
            CHECK_FALSE(ec);
            CHECK(words.message().empty());
        }
    }

    TEST_CASE("the throwing form names the problem in what()") {
        std::vector<std::byte> garbage(3);
        try {
            (void)wire::parse_handshake(garbage);
            FAIL("parsed garbage");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("gpuverbs::wire::parse: handshake record is 3 bytes") == 0);
        }
    }
}

TEST_SUITE("mesh record") {
    namespace {
    MeshRecord sample_mesh() {
        MeshRecord m;
        m.rank = 2;
        m.world_size = 5;
        for (std::uint32_t peer : {0U, 1U, 4U}) {
            Endpoint e = sample_endpoint();
            e.qp_num = 0x100 + peer;
            m.endpoints.emplace_back(peer, e);
        }
        m.regions = {RemoteMemory{0x1000, 4096, 7}, RemoteMemory{0x9000, 64, 8}};
        return m;
    }
    std::string mesh_problem(std::span<const std::byte> bytes, std::error_code& ec) {
        detail::Status s;
        (void)wire::detail::parse_mesh_record(bytes, s);
        ec = s.code;
        return s.detail;
    }
    } // namespace

    TEST_CASE("a mesh record round-trips and finds the endpoint addressed to each peer") {
        const MeshRecord m = sample_mesh();
        auto b = wire::serialize(m);
        CHECK(b.size() == wire::mesh_header_size + 3 * wire::mesh_entry_size + 2 * wire::remote_memory_size);
        CHECK(std::string(reinterpret_cast<const char*>(b.data()), 4) == "GVMR");
        CHECK(b[7] == std::byte{2});  // regions
        CHECK(b[11] == std::byte{2}); // rank
        CHECK(b[15] == std::byte{5}); // world size
        CHECK(b[19] == std::byte{3}); // endpoints
        const MeshRecord back = wire::parse_mesh_record(b);
        CHECK(back == m);
        REQUIRE(back.endpoint_for(4) != nullptr);
        CHECK(back.endpoint_for(4)->qp_num == 0x104);
        CHECK(back.endpoint_for(3) == nullptr);
        CHECK(back.endpoint_for(2) == nullptr);
        MeshRecord alone;
        alone.world_size = 1;
        CHECK(wire::parse_mesh_record(wire::serialize(alone)) == alone);
    }

    TEST_CASE("records that name impossible ranks are refused on both sides, naming the rank") {
        MeshRecord m = sample_mesh();
        m.endpoints[1].first = 2; // to itself
        CHECK_THROWS_WITH(wire::serialize(m), doctest::Contains("rank 2 addresses an endpoint to rank 2 (itself)"));
        m = sample_mesh();
        m.endpoints[2].first = 1; // twice
        CHECK_THROWS_WITH(wire::serialize(m), doctest::Contains("to rank 1 (out of order or twice)"));
        m = sample_mesh();
        m.endpoints[2].first = 5;
        CHECK_THROWS_WITH(wire::serialize(m), doctest::Contains("to rank 5 (outside the world)"));
        m = sample_mesh();
        m.rank = 5;
        CHECK_THROWS_WITH(wire::serialize(m), doctest::Contains("is outside its world of 5 members"));
        m = sample_mesh();
        m.world_size = wire::max_world_size + 1;
        CHECK_THROWS_WITH(wire::serialize(m), doctest::Contains("names a world of 65537 members"));

        // The same on the receiving side: a record patched after serialization.
        auto b = wire::serialize(sample_mesh());
        b[wire::mesh_header_size + wire::mesh_entry_size + 3] = std::byte{2}; // second entry now names rank 2
        std::error_code ec;
        CHECK(mesh_problem(b, ec).find("rank 2 addresses an endpoint to rank 2 (itself)") != std::string::npos);
        CHECK(ec == errc::malformed_record);
    }

    TEST_CASE("truncated, oversized, mis-versioned and huge-count mesh records fail before allocating") {
        auto b = wire::serialize(sample_mesh());
        std::error_code ec;
        CHECK(mesh_problem(std::span(b).first(b.size() - 1), ec).find("need exactly") != std::string::npos);
        CHECK(ec == errc::malformed_record);
        auto longer = b;
        longer.push_back(std::byte{0});
        CHECK(mesh_problem(longer, ec).find("need exactly") != std::string::npos);
        auto versioned = b;
        versioned[5] = std::byte{9};
        (void)mesh_problem(versioned, ec);
        CHECK(ec == errc::unsupported_version);
        auto huge = b;
        huge[16] = std::byte{0xff}; // endpoint count 0xff000003
        CHECK(mesh_problem(huge, ec).find("announces 4278190083 endpoints") != std::string::npos);
        CHECK(ec == errc::malformed_record);
        CHECK(wire::parse_mesh_record(std::span<const std::byte>{}, ec).endpoints.empty());
        CHECK(ec == errc::malformed_record);
    }
}

TEST_SUITE("block list") {
    const RemoteMemory pool_a{0x1000, 1 << 20, 7};
    const RemoteMemory pool_b{0x900000, 4096, 8};

    TEST_CASE("round trip: each region once, 24 bytes per block") {
        std::vector<RemoteBlock> blocks{{pool_a, 0, 100}, {pool_b, 4000, 96}, {pool_a, 70000, 1}};
        std::vector<std::byte> bytes = wire::serialize(blocks);
        CHECK(bytes.size() == wire::block_list_header_size + 2 * wire::remote_memory_size + 3 * wire::block_entry_size);
        CHECK(wire::parse_block_list(bytes) == blocks);
    }
    TEST_CASE("what the sender refuses: no block, a zero length, a block outside its region") {
        auto refused = [](std::vector<RemoteBlock> blocks) {
            try {
                (void)wire::serialize(blocks);
            } catch (const Error& e) {
                CHECK(e.code() == errc::invalid_argument);
                return std::string(e.what());
            }
            return std::string("accepted");
        };
        CHECK(refused({}).find("1 to 1048576 blocks, not 0") != std::string::npos);
        CHECK(refused({{pool_a, 0, 0}}).find("block 0 has length 0") != std::string::npos);
        CHECK(refused({{pool_a, 0, 1}, {pool_b, 4000, 97}}).find("block 1 (97 bytes at offset 4000) lies outside") !=
              std::string::npos);
    }
    TEST_CASE("what the receiver refuses, in words: truncated, wrong version, bad index, reserved, lies, counts") {
        std::vector<std::byte> good = wire::serialize(std::vector<RemoteBlock>{{pool_a, 0, 100}, {pool_b, 0, 50}});
        auto parse = [](std::vector<std::byte> bytes, std::error_code want) {
            std::error_code ec;
            (void)wire::parse_block_list(bytes, ec);
            CHECK(ec == want);
            try {
                (void)wire::parse_block_list(bytes);
            } catch (const Error& e) {
                return std::string(e.what());
            }
            return std::string("accepted");
        };
        auto truncated = good;
        truncated.pop_back();
        CHECK(parse(truncated, errc::malformed_record).find("need exactly") != std::string::npos);
        auto version = good;
        version[5] = std::byte{9};
        CHECK(parse(version, errc::unsupported_version) != "accepted");
        std::size_t entries = wire::block_list_header_size + 2 * wire::remote_memory_size;
        auto index = good;
        index[entries + 1] = std::byte{2}; // block 0 names region 2 of 2
        CHECK(parse(index, errc::malformed_record).find("block 0 names region 2 of 2") != std::string::npos);
        auto reserved = good;
        reserved[entries + wire::block_entry_size + 3] = std::byte{1};
        CHECK(parse(reserved, errc::malformed_record).find("block 1 has a non-zero reserved field") !=
              std::string::npos);
        auto lie = good; // block 1's length: 50 -> 0x10000000000000032, far outside its 4096 bytes
        lie[entries + wire::block_entry_size + 16] = std::byte{1};
        CHECK(parse(lie, errc::malformed_record).find("block 1 (") != std::string::npos);
        auto huge = good; // a block count of 0xffffffff, refused before allocating anything
        for (int i = 8; i < 12; ++i) huge[i] = std::byte{0xff};
        CHECK(parse(huge, errc::malformed_record).find("announces 4294967295 blocks") != std::string::npos);
    }

    TEST_CASE("a leased block list: version, lease and time to live ahead of the list; what is refused") {
        LeasedBlockList list;
        list.version = 0x0102030405060708;
        list.lease = 42;
        list.ttl = std::chrono::milliseconds(1500);
        list.blocks = {{pool_a, 0, 100}, {pool_b, 4000, 96}};
        std::vector<std::byte> bytes = wire::serialize(list);
        REQUIRE(bytes.size() == wire::leased_header_size + wire::serialize(list.blocks).size());
        CHECK(std::string(reinterpret_cast<const char*>(bytes.data()), 4) == "GVLL");
        CHECK(bytes[8] == std::byte{0x01}); // the version, big-endian
        CHECK(bytes[19] == std::byte{42});  // the lease
        CHECK(wire::parse_leased_block_list(bytes) == list);
        auto refused = [](std::vector<std::byte> b, std::error_code want) {
            std::error_code ec;
            (void)wire::parse_leased_block_list(b, ec);
            CHECK(ec == want);
            try {
                (void)wire::parse_leased_block_list(b);
            } catch (const Error& e) {
                return std::string(e.what());
            }
            return std::string("accepted");
        };
        auto scoped = bytes; // the header's word says what the blocks reach
        scoped[7] = std::byte{1};
        CHECK(wire::parse_leased_block_list(scoped).scope == LeaseScope::lease_regions);
        LeasedBlockList narrow = list;
        narrow.scope = LeaseScope::lease_regions;
        CHECK(wire::serialize(narrow) == scoped);
        auto unknown = bytes;
        unknown[7] = std::byte{2};
        CHECK(refused(unknown, errc::malformed_record)
                  .find("leased block list has scope 2; this gpuverbs knows 0 (whole regions) and 1 (regions of the "
                        "lease alone)") != std::string::npos);
        auto forever = bytes; // 0xffffffff ms: a unit mistake, not a lease
        for (int i = 20; i < 24; ++i) forever[i] = std::byte{0xff};
        CHECK(refused(forever, errc::malformed_record).find("a lease of 4294967295 ms") != std::string::npos);
        auto plain = wire::serialize(list.blocks); // a plain list is not a leased one
        CHECK(refused(plain, errc::malformed_record).find("wrong magic") != std::string::npos);
        auto inner = bytes; // the list inside is checked as parse_block_list checks it
        inner.pop_back();
        CHECK(refused(inner, errc::malformed_record).find("need exactly") != std::string::npos);
        LeasedBlockList too_long = list;
        too_long.ttl = std::chrono::hours(25);
        CHECK_THROWS_WITH_AS(wire::serialize(too_long),
                             "gpuverbs::wire::serialize: a lease lasts 0 to 86400000 ms, not 90000000", Error);
    }
}
