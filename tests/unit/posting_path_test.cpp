// The posting path's one lowering (WorkRequest -> ibv_send_wr), without a
// device: every bad input is refused with its own error and nothing would be
// posted. Every form (post, SendBatch, async_post) goes through lower().
#include "gpuverbs/detail/data_path/posting_path.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>

using namespace gpuverbs;

namespace {

constexpr QueuePairCapabilities caps{64, 64, 2, 2, 32};

// A fake 4 KiB region at 0x10000 with lkey 5.
LocalBuffer slice(std::uint64_t offset, std::uint32_t length) {
    return LocalBuffer{0x10000 + offset, length, 5, 0x10000, 0x11000};
}

// wr.sg_list points here after fill(), so it outlives the call.
std::array<ibv_sge, detail::max_sge_per_request> sges{};

std::error_code fill(const WorkRequest& r, ibv_send_wr& wr) {
    return detail::lower(r, caps, wr, sges.data());
}

const RemoteMemory remote{0x900000, 4096, 77};

} // namespace

TEST_SUITE("the posting path's checks") {
    TEST_CASE("a valid write becomes an RDMA write at the remote offset with the rkey") {
        LocalBuffer b = slice(0, 100);
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(WorkRequest::write(b, remote, 16), wr));
        CHECK(wr.opcode == IBV_WR_RDMA_WRITE);
        CHECK(wr.wr.rdma.remote_addr == 0x900010);
        CHECK(wr.wr.rdma.rkey == 77);
        CHECK(wr.num_sge == 1);
        CHECK(wr.sg_list[0].addr == 0x10000);
        CHECK(wr.sg_list[0].length == 100);
        CHECK(wr.sg_list[0].lkey == 5);
        CHECK(wr.send_flags == IBV_SEND_SIGNALED);
    }

    TEST_CASE("send options become the matching send flags") {
        LocalBuffer b = slice(0, 8);
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(
            WorkRequest::send(b).options({.signaled = false, .inline_data = true, .fence = true, .solicited = true}),
            wr));
        CHECK(wr.send_flags == (IBV_SEND_INLINE | IBV_SEND_FENCE | IBV_SEND_SOLICITED));
    }

    TEST_CASE("immediate data goes on the wire in network byte order") {
        LocalBuffer b = slice(0, 8);
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(WorkRequest::send_with_imm(b, 0x01020304), wr));
        CHECK(wr.opcode == IBV_WR_SEND_WITH_IMM);
        CHECK(wr.imm_data == htonl(0x01020304));
    }

    TEST_CASE("a local range outside its region is refused") {
        LocalBuffer past_end = slice(4000, 200);
        LocalBuffer before = LocalBuffer{0xff00, 16, 5, 0x10000, 0x11000};
        ibv_send_wr wr{};
        CHECK(fill(WorkRequest::write(past_end, remote, 0), wr) == errc::local_range_outside_region);
        CHECK(fill(WorkRequest::send(before), wr) == errc::local_range_outside_region);
        LocalBuffer exactly_to_end = slice(4000, 96);
        CHECK_FALSE(fill(WorkRequest::send(exactly_to_end), wr));
    }

    TEST_CASE("a remote range outside the RemoteMemory is refused, including offset overflow") {
        LocalBuffer b = slice(0, 100);
        ibv_send_wr wr{};
        CHECK(fill(WorkRequest::write(b, remote, 4000), wr) == errc::remote_range_outside_region);
        CHECK(fill(WorkRequest::read(b, remote, 5000), wr) == errc::remote_range_outside_region);
        CHECK(fill(WorkRequest::write(b, remote, ~0ull - 10), wr) == errc::remote_range_outside_region);
        CHECK_FALSE(fill(WorkRequest::write(b, remote, 3996), wr));
    }

    TEST_CASE("inline data longer than max_inline_data is refused, and reads cannot be inline") {
        LocalBuffer big = slice(0, 33), small = slice(0, 32);
        ibv_send_wr wr{};
        CHECK(fill(WorkRequest::send(big).options({.inline_data = true}), wr) == errc::inline_too_large);
        CHECK_FALSE(fill(WorkRequest::send(small).options({.inline_data = true}), wr));
        CHECK(fill(WorkRequest::read(small, remote, 0).options({.inline_data = true}), wr) == errc::invalid_argument);
    }

    TEST_CASE("more scatter/gather entries than the QP allows are refused") {
        std::array<LocalBuffer, 3> three{slice(0, 8), slice(8, 8), slice(16, 8)};
        ibv_send_wr wr{};
        CHECK(fill(WorkRequest::write(three, remote, 0), wr) == errc::too_many_sges);
        CHECK_FALSE(fill(WorkRequest::write(std::span(three).first(2), remote, 0), wr));
        CHECK(wr.num_sge == 2);
    }

    TEST_CASE(
        "reads and atomics on a queue pair whose initiator depth is 0 are refused at once (the device would hold "
        "them for ever); writes and sends are not") {
        QueuePairCapabilities none = caps;
        none.max_rd_atomic = 0;
        ibv_send_wr wr{};
        const LocalBuffer b = slice(0, 8);
        CHECK(detail::lower(WorkRequest::read(b, remote, 0), none, wr, sges.data()) == errc::reads_not_granted);
        CHECK(detail::lower(WorkRequest::fetch_add(b, remote, 0, 1), none, wr, sges.data()) == errc::reads_not_granted);
        CHECK(detail::lower(WorkRequest::compare_swap(b, remote, 0, 1, 2), none, wr, sges.data()) ==
              errc::reads_not_granted);
        CHECK_FALSE(detail::lower(WorkRequest::write(b, remote, 0), none, wr, sges.data()));
        CHECK_FALSE(detail::lower(WorkRequest::send(b), none, wr, sges.data()));
        CHECK(std::error_code(errc::reads_not_granted) == condition::refused_locally);
        QueuePairCapabilities one = caps;
        one.max_rd_atomic = 1;
        CHECK_FALSE(detail::lower(WorkRequest::read(b, remote, 0), one, wr, sges.data()));
    }

    TEST_CASE("atomics need one 8-byte, 8-byte-aligned buffer and an aligned remote word") {
        LocalBuffer ok = slice(8, 8), short_buffer = slice(8, 4), unaligned = slice(4, 8);
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(WorkRequest::fetch_add(ok, remote, 8, 3), wr));
        CHECK(wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD);
        CHECK(wr.wr.atomic.remote_addr == 0x900008);
        CHECK(wr.wr.atomic.compare_add == 3);
        REQUIRE_FALSE(fill(WorkRequest::compare_swap(ok, remote, 0, 1, 2), wr));
        CHECK(wr.wr.atomic.swap == 2);
        CHECK(fill(WorkRequest::fetch_add(short_buffer, remote, 0, 1), wr) == errc::misaligned_atomic);
        CHECK(fill(WorkRequest::fetch_add(unaligned, remote, 0, 1), wr) == errc::misaligned_atomic);
        CHECK(fill(WorkRequest::fetch_add(ok, remote, 4, 1), wr) == errc::misaligned_atomic);
        CHECK(fill(WorkRequest::fetch_add(ok, remote, 4092, 1), wr) == errc::remote_range_outside_region);
    }

    TEST_CASE("a gather list's lengths add up for the remote range check, and each entry becomes an SGE") {
        std::array<LocalBuffer, 2> two{slice(0, 100), slice(200, 50)};
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(WorkRequest::write(two, remote, 4096 - 150), wr));
        CHECK(wr.num_sge == 2);
        CHECK(wr.sg_list[1].addr == 0x10000 + 200);
        CHECK(wr.sg_list[1].length == 50);
        CHECK(fill(WorkRequest::write(two, remote, 4096 - 149), wr) == errc::remote_range_outside_region);
    }

    TEST_CASE("an empty gather list is a zero-length request, not a one-buffer request") {
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(WorkRequest::write(std::span<const LocalBuffer>(), remote, 4096), wr));
        CHECK(wr.num_sge == 0);
        CHECK(WorkRequest::send(std::span<const LocalBuffer>()).local().empty());
    }

    TEST_CASE("the option setters and options() set the same flags") {
        LocalBuffer b = slice(0, 8);
        ibv_send_wr a{}, c{};
        REQUIRE_FALSE(fill(WorkRequest::send(b).unsignaled().fence(), a));
        REQUIRE_FALSE(fill(WorkRequest::send(b).options({.signaled = false, .fence = true}), c));
        CHECK(a.send_flags == c.send_flags);
        CHECK(a.send_flags == IBV_SEND_FENCE);
        CHECK(WorkRequest::send(b).context(42).send_options().context == 42);
    }

    TEST_CASE("a request made from one buffer holds a copy of it, not a reference") {
        auto make = [] { return WorkRequest::send(slice(16, 8)); }; // the LocalBuffer temporary is gone after
        WorkRequest r = make();
        ibv_send_wr wr{};
        REQUIRE_FALSE(fill(r, wr));
        CHECK(wr.sg_list[0].addr == 0x10010);
    }

    TEST_CASE("receives are checked the same way") {
        std::array<LocalBuffer, 3> three{slice(0, 8), slice(8, 8), slice(16, 8)};
        ibv_recv_wr wr{};
        std::array<ibv_sge, detail::max_sge_per_request> sges{};
        CHECK(detail::lower_receive(three, 2, wr, sges.data()) == errc::too_many_sges);
        LocalBuffer outside = slice(4090, 100);
        CHECK(detail::lower_receive({&outside, 1}, 2, wr, sges.data()) == errc::local_range_outside_region);
        REQUIRE_FALSE(detail::lower_receive(std::span(three).first(2), 2, wr, sges.data()));
        CHECK(wr.num_sge == 2);
    }

    TEST_CASE("the data path's errors read as instructions and map to generic conditions") {
        CHECK(std::error_code(errc::send_queue_full).message().find("poll the completion queue") != std::string::npos);
        CHECK(std::error_code(errc::send_queue_full) == std::errc::no_buffer_space);
        CHECK(std::error_code(errc::local_range_outside_region) == std::errc::invalid_argument);
        CHECK(std::error_code(errc::misaligned_atomic).message().find("8-byte aligned") != std::string::npos);
    }

    TEST_CASE("a memory region's remote view is clamped to the region") {
        MemoryRegion none;
        CHECK(none.remote().length == 0);
        RemoteMemory r{100, 50, 1};
        CHECK(r.contains(0, 50));
        CHECK(r.contains(50, 0));
        CHECK_FALSE(r.contains(51, 0));
        CHECK_FALSE(r.contains(10, 41));
    }
}
