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
/// `value` followed by its tag over (domain, rank, key, value); empty, with
/// the reason in `status`, for a secret check_secret refuses or a failed HMAC.
std::vector<std::byte> sign_record(const std::string& secret, const std::string& domain, std::uint32_t rank,
                                   const std::string& key, std::span<const std::byte> value, Status& status);
/// The value of `signed_bytes` when its tag is right for (domain, rank,
/// key); otherwise false, and `why` says what is wrong (never the secret).
bool open_record(const std::string& secret, const std::string& domain, std::uint32_t rank, const std::string& key,
                 std::span<const std::byte> signed_bytes, std::vector<std::byte>& value, std::string& why);

} // namespace detail

/// A Rendezvous whose values are signed and checked with a shared secret.
template <Rendezvous R>
class SignedRendezvous : public RendezvousForms<SignedRendezvous<R>> {
    using Forms = RendezvousForms<SignedRendezvous<R>>;

public:
    using Forms::fence;
    using Forms::lookup;
    using Forms::publish;
    using Forms::withdraw;

    /// `inner` must outlive this object. `domain` names what the records
    /// belong to (a service, a job id): it is signed with each, so a record
    /// of another domain signed with the same secret is refused too. Throws
    /// as detail::check_secret.
    SignedRendezvous(R& inner, std::string secret, std::string domain = {})
        : inner_(&inner), secret_(std::move(secret)), domain_(std::move(domain)) {
        detail::check_secret(secret_);
    }
    /// The same without throwing: on failure `ec` is set and the object
    /// returned holds no secret: its publish and lookup fail with the same error.
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
    /// The value signed, published by the inner rendezvous. Each operation
    /// also has the throwing and (…, ec) forms (RendezvousForms).
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec,
                 Diagnostics& diagnostics) {
        detail::Status status; // a secret that create() refused signs nothing
        const std::vector<std::byte> signed_value =
            detail::sign_record(secret_, domain_, inner_->rank(), key, value, status);
        if (!status.ok()) {
            ec = status.code;
            status.report(diagnostics);
            return;
        }
        inner_->publish(key, signed_value, ec, diagnostics);
    }
    void fence(std::chrono::milliseconds timeout, std::error_code& ec, Diagnostics& diagnostics) {
        inner_->fence(timeout, ec, diagnostics);
    }
    /// The peer's value, after its tag was checked: errc::malformed_record
    /// when it is unsigned, signed with another secret, or signed for another
    /// rank or key (a forged or replayed record).
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                  std::error_code& ec, Diagnostics& diagnostics) {
        return detail::or_code(ec, diagnostics, [&](detail::Status& status) -> std::vector<std::byte> {
            if (!detail::check_secret(secret_, status)) return {};
            std::error_code inner_ec;
            Diagnostics inner_words;
            const std::vector<std::byte> bytes = inner_->lookup(peer, key, timeout, inner_ec, inner_words);
            status.adopt(inner_ec, inner_words, "lookup");
            if (!status.ok()) return {};
            std::vector<std::byte> value;
            std::string why;
            if (!detail::open_record(secret_, domain_, peer, key, bytes, value, why)) {
                status.fail(errc::malformed_record, "SignedRendezvous::lookup",
                            name() + ": rank " + std::to_string(peer) + "'s '" + key + "' " + why);
                return {};
            }
            return value;
        });
    }
    void withdraw(std::error_code& ec, Diagnostics& diagnostics) { inner_->withdraw(ec, diagnostics); }

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
