// Records that cannot be forged: a rendezvous whose every value carries an
// HMAC-SHA-256 tag made with a secret every member shares.
//
// A store anyone can write to (Redis without a password, a launcher's
// key-value space) lets a local user rewrite any member's record: peers would
// connect to the forger's queue pair, which by default may write anywhere in
// their protection domain. SignedRendezvous wraps any Rendezvous: publish()
// appends a tag over (this rank, the key, the value), lookup() checks it
// before handing the value on, so a record that was not published by a
// holder of the secret, under that rank and key, is refused:
//
//   gpuverbs::RedisRendezvous store(options);
//   gpuverbs::SignedRendezvous signed_store(store, RedisOptions::secret_from_environment("GPUVERBS_MESH_SECRET"),
//                                           options.service);
//   gpuverbs::Mesh mesh(signed_store, pd, cq, {mr});
//
// The tag binds the domain (the service or job the caller names), the rank
// and the key, so one member's genuine record cannot be replayed as
// another's, under another key, or in another service that shares the
// secret; it does not bind time: a member's older value of the same key in
// the same domain, replayed, still verifies. The secret is never
// put in a message. Needs OpenSSL's libcrypto (GPUVERBS_HAVE_OPENSSL); without
// it the constructor throws errc::unsupported.
#pragma once

#include "gpuverbs/config.hpp"
#include "gpuverbs/error.hpp"
#include "gpuverbs/many_peers/rendezvous.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace gpuverbs {

namespace detail {

/// Bytes of the tag after each signed value.
inline constexpr std::size_t record_tag_size = 32;
/// The shortest secret accepted (16 bytes: 128 bits, if random).
inline constexpr std::size_t min_secret_size = 16;

/// Throws errc::unsupported without libcrypto, errc::invalid_argument for a
/// secret shorter than min_secret_size.
void check_secret(const std::string& secret);
/// check_secret with the failure in `status`; false when it failed.
bool check_secret(const std::string& secret, Status& status);
/// `value` followed by its tag over (domain, rank, key, value).
std::vector<std::byte> sign_record(const std::string& secret, const std::string& domain, std::uint32_t rank,
                                   const std::string& key, std::span<const std::byte> value);
/// The value of `signed_bytes` when its tag is right for (domain, rank,
/// key); otherwise false, and `why` says what is wrong (never the secret).
bool open_record(const std::string& secret, const std::string& domain, std::uint32_t rank, const std::string& key,
                 std::span<const std::byte> signed_bytes, std::vector<std::byte>& value, std::string& why);

} // namespace detail

/// A Rendezvous whose values are signed and checked with a shared secret.
template <Rendezvous R>
class SignedRendezvous {
public:
    /// `inner` must outlive this object. `domain` names what the records
    /// belong to (a service, a job id): it is signed with each, so a record
    /// of another domain signed with the same secret is refused too. Throws
    /// as detail::check_secret.
    SignedRendezvous(R& inner, std::string secret, std::string domain = {})
        : inner_(&inner), secret_(std::move(secret)), domain_(std::move(domain)) {
        detail::check_secret(secret_);
    }
    /// The same without throwing: on failure `ec` is set and the object
    /// returned holds no secret: its publish and lookup throw the same error.
    static SignedRendezvous create(R& inner, std::string secret, std::string domain, std::error_code& ec) {
        return detail::or_code(
            ec, [&](detail::Status& s) { return create_impl(inner, std::move(secret), std::move(domain), s); });
    }
    /// … with the words of the failure in `diagnostics` (cleared on success).
    static SignedRendezvous create(R& inner, std::string secret, std::string domain, std::error_code& ec,
                                   Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& s) {
            return create_impl(inner, std::move(secret), std::move(domain), s);
        });
    }

    [[nodiscard]] std::uint32_t rank() const { return inner_->rank(); }
    [[nodiscard]] std::uint32_t world_size() const { return inner_->world_size(); }
    [[nodiscard]] std::string name() const { return inner_->name() + " (signed records)"; }
    void publish(const std::string& key, std::span<const std::byte> value) {
        detail::check_secret(secret_); // one that create() refused signs nothing
        inner_->publish(key, detail::sign_record(secret_, domain_, inner_->rank(), key, value));
    }
    void fence(std::chrono::milliseconds timeout) { inner_->fence(timeout); }
    /// The peer's value, after its tag was checked: errc::malformed_record
    /// when it is unsigned, signed with another secret, or signed for another
    /// rank or key (a forged or replayed record).
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout) {
        detail::check_secret(secret_);
        const std::vector<std::byte> bytes = inner_->lookup(peer, key, timeout);
        std::vector<std::byte> value;
        std::string why;
        if (!detail::open_record(secret_, domain_, peer, key, bytes, value, why)) {
            throw Error(errc::malformed_record, "SignedRendezvous::lookup",
                        name() + ": rank " + std::to_string(peer) + "'s '" + key + "' " + why);
        }
        return value;
    }
    void withdraw() { inner_->withdraw(); }

private:
    struct Unchecked {};
    SignedRendezvous(R& inner, std::string secret, std::string domain, Unchecked)
        : inner_(&inner), secret_(std::move(secret)), domain_(std::move(domain)) {}
    static SignedRendezvous create_impl(R& inner, std::string secret, std::string domain, detail::Status& status) {
        if (!detail::check_secret(secret, status)) return SignedRendezvous(inner, {}, {}, Unchecked{});
        return SignedRendezvous(inner, std::move(secret), std::move(domain), Unchecked{});
    }

    R* inner_;
    std::string secret_;
    std::string domain_;
};

} // namespace gpuverbs
