// libFuzzer target: the MPI rendezvous's table decode, what fence() makes of
// the bytes MPI_Allgatherv brought back from every rank
// (include/gpuverbs/many_peers/rendezvous/mpi.hpp: MpiRendezvous::fence and
// its private encode/decode; header-only).
//
// The header needs <mpi.h>; the fuzz build has no MPI library, so
// fake_mpi/mpi.h stands in for it and the functions below play a world of
// up to 8 ranks whose collectives bring back what the input says. The real
// MpiRendezvous runs unchanged, through its public calls: publish, fence,
// lookup. The input:
//   u8 world size (1 + b % 8) | u8 our rank (b % size) |
//   rounds (one fence each, at most 4, until the input ends):
//     u8 our publications (b % 4) × (u8 key length | key | u8 value length | value) |
//     for every other rank: u16 little-endian byte count | those bytes (its table
//                           as MPI_Allgatherv delivers it; anything at all)
// (lengths beyond the end of the input take what is left).
//
// Every rank's table is, per the header, a run of entries
//   u32 key length | key | u32 value length | value      (host order)
// and a model written from that decides each one: a table whose last entry
// stops short is malformed. Checks, for any input:
//  - fence throws exactly when some rank's table is malformed:
//    gpuverbs::Error, errc::malformed_record, "MpiRendezvous::fence: rank R
//    of an MPI communicator of N ranks sent a truncated table" for the first
//    such rank, never anything else, and with nothing merged: lookups
//    answer as before that fence (the input stops there);
//  - otherwise lookup(r, key) gives, for every rank and every key it
//    published in any fence so far, the value of its latest entry (a later
//    entry or fence replaces an earlier one); our own publications come back
//    through encode and decode unchanged; a key nobody published is
//    errc::unsupported, a rank outside the world errc::invalid_argument;
//  - fence hands MPI consistent counts and displacements (the fake world
//    checks what it is given), and sizes nothing from a count it has not
//    received (-malloc_limit_mb).
#include "wire_model.hpp"

#include "gpuverbs/many_peers/rendezvous/mpi.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace {

static_assert(std::endian::native == std::endian::little,
              "the model reads the tables' host-order lengths as little-endian");

using Table = std::map<std::string, std::vector<std::byte>>;

/// The pretend world: who we are, and what the other ranks' parts are in
/// the fence under way.
struct World {
    int size = 1;
    int rank = 0;
    std::vector<std::vector<std::byte>> parts; ///< per rank; ours is what fence sends
    std::vector<int> counts;                   ///< what MPI_Allgather handed out
    bool gathered = false;                     ///< MPI_Allgather came before MPI_Allgatherv
};
World world;

/// Reads the input front to back; past its end, lengths shrink and bytes are 0.
class Input {
public:
    explicit Input(fuzz::Bytes b) : in_(b) {}
    [[nodiscard]] bool empty() const { return in_.empty(); }
    std::uint8_t u8() {
        if (in_.empty()) return 0;
        auto v = std::to_integer<std::uint8_t>(in_[0]);
        in_ = in_.subspan(1);
        return v;
    }
    std::uint16_t u16le() {
        std::uint16_t lo = u8();
        std::uint16_t hi = u8();
        return static_cast<std::uint16_t>(lo | (hi << 8));
    }
    fuzz::Bytes take(std::size_t n) {
        n = std::min(n, in_.size());
        fuzz::Bytes part = in_.first(n);
        in_ = in_.subspan(n);
        return part;
    }

private:
    fuzz::Bytes in_;
};

/// The model of one rank's table: its entries (a later one replacing an
/// earlier one), or nothing when an entry stops short.
std::optional<Table> model_table(fuzz::Bytes in) {
    Table table;
    std::size_t at = 0;
    auto length = [&](std::uint64_t& n) {
        if (in.size() - at < 4) return false;
        n = 0;
        for (std::size_t i = 0; i < 4; ++i) n |= std::to_integer<std::uint64_t>(in[at + i]) << (8 * i);
        at += 4;
        return in.size() - at >= n;
    };
    while (at < in.size()) {
        std::uint64_t k = 0;
        if (!length(k)) return std::nullopt;
        std::string key(reinterpret_cast<const char*>(in.data() + at), static_cast<std::size_t>(k));
        at += static_cast<std::size_t>(k);
        std::uint64_t v = 0;
        if (!length(v)) return std::nullopt;
        table[key] = std::vector<std::byte>(in.begin() + static_cast<std::ptrdiff_t>(at),
                                            in.begin() + static_cast<std::ptrdiff_t>(at + v));
        at += static_cast<std::size_t>(v);
    }
    return table;
}

std::string communicator(int size) {
    return "an MPI communicator of " + std::to_string(size) + " ranks";
}

} // namespace

// --- the pretend MPI (fake_mpi/mpi.h) -------------------------------------------
int MPI_Initialized(int* flag) {
    *flag = 1;
    return MPI_SUCCESS;
}
int MPI_Comm_rank(MPI_Comm, int* rank) {
    *rank = world.rank;
    return MPI_SUCCESS;
}
int MPI_Comm_size(MPI_Comm, int* size) {
    *size = world.size;
    return MPI_SUCCESS;
}
int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm) {
    fuzz::require(sendcount == 1 && recvcount == 1 && sendtype == MPI_INT && recvtype == MPI_INT,
                  "fence gathers its counts as anything but one int per rank");
    int mine = 0;
    std::memcpy(&mine, sendbuf, sizeof mine);
    world.counts.assign(static_cast<std::size_t>(world.size), 0);
    for (int r = 0; r < world.size; ++r) {
        world.counts[r] = r == world.rank ? mine : static_cast<int>(world.parts[r].size());
    }
    std::memcpy(recvbuf, world.counts.data(), world.counts.size() * sizeof(int));
    world.gathered = true;
    return MPI_SUCCESS;
}
int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, const int* recvcounts,
                   const int* displs, MPI_Datatype recvtype, MPI_Comm) {
    fuzz::require(world.gathered, "fence called MPI_Allgatherv before gathering the counts");
    fuzz::require(sendtype == MPI_BYTE && recvtype == MPI_BYTE, "fence gathers its tables as anything but bytes");
    fuzz::require(sendcount == world.counts[world.rank], "fence sends another byte count than it announced");
    const auto* mine = static_cast<const std::byte*>(sendbuf);
    world.parts[world.rank].assign(mine, mine + sendcount);
    auto* out = static_cast<std::byte*>(recvbuf);
    int at = 0;
    for (int r = 0; r < world.size; ++r) {
        fuzz::require(recvcounts[r] == world.counts[r], "fence passed MPI_Allgatherv other counts than it gathered");
        fuzz::require(displs[r] == at, "fence's displacements are not the running sum of the counts");
        std::copy(world.parts[r].begin(), world.parts[r].end(), out + displs[r]);
        at += recvcounts[r];
    }
    world.gathered = false;
    return MPI_SUCCESS;
}
int MPI_Error_string(int, char* string, int* resultlen) {
    *resultlen = 0;
    string[0] = '\0';
    return MPI_SUCCESS;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return -1;
    Input in(fuzz::Bytes(reinterpret_cast<const std::byte*>(data), size));
    world = World{};
    world.size = 1 + in.u8() % 8;
    world.rank = in.u8() % world.size;
    const auto n = static_cast<std::uint32_t>(world.size);
    const auto me = static_cast<std::uint32_t>(world.rank);

    gpuverbs::MpiRendezvous mpi(MPI_COMM_WORLD);
    fuzz::require(mpi.rank() == me && mpi.world_size() == n, "MpiRendezvous took another rank or size than MPI's");
    std::vector<Table> model(n);

    for (int round = 0; round < 4 && (round == 0 || !in.empty()); ++round) {
        Table ours;
        for (int k = in.u8() % 4; k > 0; --k) {
            fuzz::Bytes key = in.take(in.u8());
            fuzz::Bytes value = in.take(in.u8());
            std::string name(reinterpret_cast<const char*>(key.data()), key.size());
            mpi.publish(name, value);
            ours[name] = std::vector<std::byte>(value.begin(), value.end());
        }
        world.parts.assign(n, {});
        for (std::uint32_t r = 0; r < n; ++r) {
            if (r == me) continue;
            fuzz::Bytes part = in.take(in.u16le());
            world.parts[r].assign(part.begin(), part.end());
        }

        // What the model says of every rank's part (ours is encode's, which
        // must decode to exactly what we published).
        std::optional<std::uint32_t> bad;
        std::vector<Table> tables(n);
        for (std::uint32_t r = 0; r < n && !bad; ++r) {
            if (r == me) {
                tables[r] = ours;
                continue;
            }
            std::optional<Table> t = model_table(world.parts[r]);
            if (t) {
                tables[r] = std::move(*t);
            } else {
                bad = r;
            }
        }

        // What lookup() must answer: the model's table, entry for entry.
        auto check_lookups = [&] {
            for (std::uint32_t r = 0; r < n; ++r) {
                for (const auto& [key, value] : model[r]) {
                    try {
                        fuzz::require(mpi.lookup(r, key, std::chrono::milliseconds(0)) == value,
                                      "lookup gives another value than the rank's latest entry");
                    } catch (...) {
                        fuzz::fail("lookup failed for a key rank %u published", r);
                    }
                }
                const std::string absent = "gpuverbs-fuzz: nobody publishes this key";
                if (model[r].count(absent) == 0) {
                    try {
                        (void)mpi.lookup(r, absent, std::chrono::milliseconds(0));
                        fuzz::fail("lookup found a key rank %u never published", r);
                    } catch (const gpuverbs::Error& e) {
                        fuzz::require(e.code() == make_error_code(gpuverbs::errc::unsupported),
                                      "a key nobody published is not errc::unsupported");
                    }
                }
            }
        };

        try {
            mpi.fence(std::chrono::milliseconds(0));
        } catch (const gpuverbs::Error& e) {
            if (!bad) fuzz::fail("fence failed though every table is whole: %s", e.what());
            fuzz::require(e.code() == make_error_code(gpuverbs::errc::malformed_record),
                          "fence refused a table with another code than malformed_record");
            const std::string words = "MpiRendezvous::fence: rank " + std::to_string(*bad) + " of " +
                                      communicator(world.size) + " sent a truncated table";
            if (e.what() != words) fuzz::fail("the model says \"%s\", fence says \"%s\"", words.c_str(), e.what());
            check_lookups(); // nothing merged: every rank's earlier table is as it was
            return 0;
        } catch (const std::exception& e) {
            fuzz::fail("fence threw something other than gpuverbs::Error: %s", e.what());
        } catch (...) {
            fuzz::fail("fence threw something other than gpuverbs::Error");
        }
        if (bad) fuzz::fail("fence accepted rank %u's table, which stops short", *bad);
        // Our own part must be what encode makes of our publications.
        std::optional<Table> sent = model_table(world.parts[me]);
        fuzz::require(sent && *sent == ours, "encode's table does not decode to what we published");

        for (std::uint32_t r = 0; r < n; ++r) {
            for (auto& [key, value] : tables[r]) model[r][key] = std::move(value);
        }
        check_lookups();
        try {
            (void)mpi.lookup(n, "x", std::chrono::milliseconds(0));
            fuzz::fail("lookup answered for a rank outside the world");
        } catch (const gpuverbs::Error& e) {
            fuzz::require(e.code() == make_error_code(gpuverbs::errc::invalid_argument),
                          "a rank outside the world is not errc::invalid_argument");
        }
    }
    return 0;
}
