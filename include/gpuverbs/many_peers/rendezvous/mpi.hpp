// The rendezvous of an MPI program: the exchange rides on MPI_Allgather over a
// communicator the program already has. Header-only: it compiles in the
// program's own MPI build (include <mpi.h> and link MPI as usual).
//
//   MPI_Init(&argc, &argv);
//   gpuverbs::MpiRendezvous mpi(MPI_COMM_WORLD);
//   gpuverbs::Mesh mesh(mpi, pd, cq, {mr.remote()});
//   mesh.connect_all();
//
// publish keeps the bytes until the next fence; fence() is the collective that
// moves everyone's (two MPI_Allgather calls, O(total bytes) per rank); lookup
// reads what the last fence brought and never waits. So only connect_all()
// works over MPI: the lazy Mesh::connect() needs PMIx or Redis, and says so.
// MPI collectives cannot time out: fence's timeout is not used.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/many_peers/rendezvous.hpp"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <system_error>
#include <vector>

namespace gpuverbs {

class MpiRendezvous : public RendezvousForms<MpiRendezvous> {
public:
    using RendezvousForms::fence;
    using RendezvousForms::lookup;
    using RendezvousForms::publish;
    using RendezvousForms::withdraw;

    /// A member of `comm` (MPI must be initialised; the communicator must
    /// outlive this object). Throws gpuverbs::Error
    /// (errc::rendezvous_unavailable): MPI not initialised, or the
    /// communicator refused to give its rank or size.
    explicit MpiRendezvous(MPI_Comm comm = MPI_COMM_WORLD)
        : MpiRendezvous(detail::or_throw([&](detail::Status& s) { return create_impl(comm, s); })) {}
    /// The same without throwing: on failure `ec` is set and the member
    /// returned has no world (world_size() 0; fence() fails).
    static MpiRendezvous create(MPI_Comm comm, std::error_code& ec) {
        return detail::or_code(ec, [&](detail::Status& s) { return create_impl(comm, s); });
    }
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static MpiRendezvous create(MPI_Comm comm, std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return create_impl(comm, s); });
    }

    [[nodiscard]] std::uint32_t rank() const noexcept { return rank_; }
    [[nodiscard]] std::uint32_t world_size() const noexcept { return size_; }
    [[nodiscard]] std::string name() const { return "an MPI communicator of " + std::to_string(size_) + " ranks"; }

    /// Kept until the next fence(). Each operation also has the throwing and
    /// (…, ec) forms (RendezvousForms).
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec,
                 Diagnostics& diagnostics) {
        pending_[key] = std::vector<std::byte>(value.begin(), value.end());
        ec.clear();
        diagnostics.clear();
    }

    /// Collective over the communicator: everyone's publications since the
    /// last fence become readable (later ones replace earlier ones). A
    /// malformed table from any rank fails it (errc::malformed_record, naming
    /// the rank) with nothing merged: lookups answer as before the fence.
    void fence(std::chrono::milliseconds /*timeout: MPI collectives cannot time out*/, std::error_code& ec,
               Diagnostics& diagnostics) {
        detail::or_code(ec, diagnostics, [&](detail::Status& s) { fence_impl(s); });
    }

    /// What `peer` published under `key` before the last fence (never waits).
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds /*timeout*/,
                                  std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) { return lookup_impl(peer, key, s); });
    }

    /// Forgets what was published and not yet fenced.
    void withdraw(std::error_code& ec, Diagnostics& diagnostics) {
        pending_.clear();
        ec.clear();
        diagnostics.clear();
    }

private:
    using Entries = std::map<std::string, std::vector<std::byte>>;

    struct NoWorld {};
    MpiRendezvous(MPI_Comm comm, NoWorld) : comm_(comm) {}

    static MpiRendezvous create_impl(MPI_Comm comm, detail::Status& status) {
        MpiRendezvous r(comm, NoWorld{});
        int initialized = 0;
        MPI_Initialized(&initialized);
        if (initialized == 0) {
            status.fail(errc::rendezvous_unavailable, "MpiRendezvous", "MPI is not initialised: call MPI_Init first");
            return r;
        }
        int rank = 0;
        int size = 0;
        if (!checked(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank", status) ||
            !checked(MPI_Comm_size(comm, &size), "MPI_Comm_size", status)) {
            return r;
        }
        r.rank_ = static_cast<std::uint32_t>(rank);
        r.size_ = static_cast<std::uint32_t>(size);
        r.table_.resize(r.size_);
        return r;
    }

    /// False, with MPI's words in `status`, when `rc` is an error.
    static bool checked(int rc, const char* verb, detail::Status& status) {
        if (rc == MPI_SUCCESS) return true;
        char text[MPI_MAX_ERROR_STRING] = {};
        int length = 0;
        MPI_Error_string(rc, text, &length);
        status.fail(errc::rendezvous_unavailable, verb, std::string(text, static_cast<std::size_t>(length)));
        return false;
    }

    void fence_impl(detail::Status& status) {
        if (size_ == 0) {
            status.fail(errc::rendezvous_unavailable, "MpiRendezvous::fence",
                        "this MpiRendezvous has no world (create() failed): create it again");
            return;
        }
        std::vector<std::byte> mine = encode(pending_);
        if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
            status.fail(errc::invalid_argument, "MPI_Allgatherv",
                        "rank " + std::to_string(rank_) + " publishes " + std::to_string(mine.size()) +
                            " bytes; MPI counts are int");
            return;
        }
        int count = static_cast<int>(mine.size());
        std::vector<int> counts(size_);
        if (!checked(MPI_Allgather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, comm_), "MPI_Allgather", status))
            return;
        std::vector<int> displacements(size_);
        std::size_t total = 0;
        for (std::uint32_t r = 0; r < size_; ++r) {
            if (counts[r] < 0 || total + static_cast<std::size_t>(counts[r]) > static_cast<std::size_t>(INT_MAX)) {
                status.fail(errc::invalid_argument, "MPI_Allgatherv",
                            "the ranks publish more than " + std::to_string(INT_MAX) + " bytes in all");
                return;
            }
            displacements[r] = static_cast<int>(total);
            total += static_cast<std::size_t>(counts[r]);
        }
        std::vector<std::byte> all(total);
        if (!checked(MPI_Allgatherv(mine.data(), count, MPI_BYTE, all.data(), counts.data(), displacements.data(),
                                    MPI_BYTE, comm_),
                     "MPI_Allgatherv", status))
            return;
        // Every rank's table is read before any is merged: one malformed table
        // fails the fence and leaves what lookup() answers as it was.
        std::vector<Entries> decoded(size_);
        for (std::uint32_t r = 0; r < size_; ++r) {
            auto part =
                std::span(all).subspan(static_cast<std::size_t>(displacements[r]), static_cast<std::size_t>(counts[r]));
            if (!decode(part, r, decoded[r], status)) return;
        }
        for (std::uint32_t r = 0; r < size_; ++r) {
            for (auto& [key, value] : decoded[r]) table_[r][key] = std::move(value);
        }
        pending_.clear();
    }

    std::vector<std::byte> lookup_impl(std::uint32_t peer, const std::string& key, detail::Status& status) const {
        if (peer >= size_) {
            status.fail(errc::invalid_argument, "MpiRendezvous::lookup",
                        name() + ": there is no rank " + std::to_string(peer));
            return {};
        }
        auto it = table_[peer].find(key);
        if (it == table_[peer].end()) {
            status.fail(errc::unsupported, "MpiRendezvous::lookup",
                        "rank " + std::to_string(peer) + " of " + name() + " published no '" + key +
                            "' before the last fence(): the MPI flavour exchanges only at fence() (Mesh::connect_all); "
                            "connecting peers lazily needs PMIx or Redis");
            return {};
        }
        return it->second;
    }

    // Entries as u32 key length, key, u32 value length, value (host order: one program on one kind of machine).
    static std::vector<std::byte> encode(const Entries& entries) {
        std::vector<std::byte> out;
        auto put = [&out](const void* data, std::size_t n) {
            const auto* b = static_cast<const std::byte*>(data);
            out.insert(out.end(), b, b + n);
        };
        for (const auto& [key, value] : entries) {
            auto k = static_cast<std::uint32_t>(key.size());
            auto v = static_cast<std::uint32_t>(value.size());
            put(&k, 4);
            put(key.data(), key.size());
            put(&v, 4);
            put(value.data(), value.size());
        }
        return out;
    }

    /// `from`'s table into `entries`; false (errc::malformed_record in
    /// `status`) for a table cut short.
    bool decode(std::span<const std::byte> in, std::uint32_t from, Entries& entries, detail::Status& status) const {
        bool whole = true;
        auto take = [&](std::size_t n) {
            if (!whole || in.size() < n) {
                whole = false;
                return std::span<const std::byte>();
            }
            auto part = in.first(n);
            in = in.subspan(n);
            return part;
        };
        auto length = [&] {
            std::uint32_t n = 0;
            if (auto word = take(4); whole) std::memcpy(&n, word.data(), 4);
            return n;
        };
        while (whole && !in.empty()) {
            auto k = take(length());
            std::string key(reinterpret_cast<const char*>(k.data()), k.size());
            auto v = take(length());
            if (whole) entries[key] = std::vector<std::byte>(v.begin(), v.end());
        }
        if (!whole) {
            status.fail(errc::malformed_record, "MpiRendezvous::fence",
                        "rank " + std::to_string(from) + " of " + name() + " sent a truncated table");
        }
        return whole;
    }

    MPI_Comm comm_;
    std::uint32_t rank_ = 0;
    std::uint32_t size_ = 0;
    Entries pending_;
    std::vector<Entries> table_;
};

} // namespace gpuverbs
