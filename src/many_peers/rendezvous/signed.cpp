// Signing and checking rendezvous records (rendezvous/signed.hpp) with
// OpenSSL's HMAC-SHA-256; never hand-written cryptography.
#include "gpuverbs/many_peers/rendezvous/signed.hpp"

#if GPUVERBS_HAVE_OPENSSL
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

#include <array>

namespace gpuverbs::detail {

namespace {

#if GPUVERBS_HAVE_OPENSSL
/// The tag over a label, the caller's domain (with its length), the rank,
/// the key (with its length) and the value; false if OpenSSL failed.
bool tag_of(const std::string& secret, const std::string& domain, std::uint32_t rank, const std::string& key,
            std::span<const std::byte> value, std::array<unsigned char, record_tag_size>& tag) {
    std::vector<unsigned char> message;
    constexpr std::string_view label = "gpuverbs signed record v1";
    message.reserve(label.size() + 12 + domain.size() + key.size() + value.size());
    message.insert(message.end(), label.begin(), label.end());
    const auto be32 = [&](std::uint32_t v) {
        for (int shift = 24; shift >= 0; shift -= 8) message.push_back(static_cast<unsigned char>(v >> shift));
    };
    be32(static_cast<std::uint32_t>(domain.size()));
    message.insert(message.end(), domain.begin(), domain.end());
    be32(rank);
    be32(static_cast<std::uint32_t>(key.size()));
    message.insert(message.end(), key.begin(), key.end());
    const auto* v = reinterpret_cast<const unsigned char*>(value.data());
    message.insert(message.end(), v, v + value.size());
    unsigned int length = 0;
    return HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), message.data(), message.size(),
                tag.data(), &length) != nullptr &&
           length == tag.size();
}
constexpr const char* hmac_failed = "OpenSSL's HMAC-SHA-256 failed";
#endif

} // namespace

bool check_secret(const std::string& secret, Status& status) {
#if GPUVERBS_HAVE_OPENSSL
    if (secret.size() < min_secret_size) {
        status.fail(errc::invalid_argument, "SignedRendezvous",
                    "the shared secret has " + std::to_string(secret.size()) + " bytes; at least " +
                        std::to_string(min_secret_size) + " are needed (e.g. openssl rand -hex 32)");
        return false;
    }
    return true;
#else
    (void)secret;
    status.fail(errc::unsupported, "SignedRendezvous",
                "this gpuverbs was built without OpenSSL's libcrypto (GPUVERBS_WITH_OPENSSL, Debian libssl-dev): "
                "records cannot be signed");
    return false;
#endif
}

void check_secret(const std::string& secret) {
    (void)or_throw([&](Status& status) { return check_secret(secret, status); });
}

std::vector<std::byte> sign_record(const std::string& secret, const std::string& domain, std::uint32_t rank,
                                   const std::string& key, std::span<const std::byte> value, Status& status) {
    if (!check_secret(secret, status)) return {};
#if GPUVERBS_HAVE_OPENSSL
    std::array<unsigned char, record_tag_size> tag{};
    if (!tag_of(secret, domain, rank, key, value, tag)) {
        status.fail(errc::unsupported, "SignedRendezvous", hmac_failed);
        return {};
    }
    std::vector<std::byte> out(value.begin(), value.end());
    for (unsigned char c : tag) out.push_back(static_cast<std::byte>(c));
    return out;
#else
    (void)domain, (void)rank, (void)key, (void)value;
    return {};
#endif
}

bool open_record(const std::string& secret, const std::string& domain, std::uint32_t rank, const std::string& key,
                 std::span<const std::byte> signed_bytes, std::vector<std::byte>& value, std::string& why) {
    value.clear();
#if GPUVERBS_HAVE_OPENSSL
    if (signed_bytes.size() < record_tag_size) {
        why = "has " + std::to_string(signed_bytes.size()) + " bytes, fewer than a signature's " +
              std::to_string(record_tag_size) + ": it is not signed (a member without the secret published it)";
        return false;
    }
    const std::span<const std::byte> body = signed_bytes.first(signed_bytes.size() - record_tag_size);
    std::array<unsigned char, record_tag_size> expected{};
    if (!tag_of(secret, domain, rank, key, body, expected)) {
        why = std::string("could not be checked: ") + hmac_failed;
        return false;
    }
    if (CRYPTO_memcmp(expected.data(), signed_bytes.data() + body.size(), record_tag_size) != 0) {
        why =
            "does not carry a signature of this service's secret for that rank and key: it was forged, "
            "published without the secret or with another one, or copied from another rank, key or domain";
        return false;
    }
    value.assign(body.begin(), body.end());
    return true;
#else
    (void)secret, (void)domain, (void)rank, (void)key, (void)signed_bytes;
    why = "cannot be checked: this gpuverbs was built without OpenSSL's libcrypto";
    return false;
#endif
}

} // namespace gpuverbs::detail
