// Completion: one finished work request, as CompletionQueue::poll reports it,
// and the error category of work-completion statuses (ibv_wc_status).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

namespace gpuverbs {

/// The operation a completion reports.
enum class Opcode : std::uint8_t {
    unknown, ///< a completion for a queue pair that no longer exists
    send,
    send_with_imm,
    write,
    write_with_imm,
    read,
    compare_swap,
    fetch_add,
    receive,          ///< a receive consumed by the peer's send
    receive_with_imm, ///< a receive consumed by the peer's write-with-immediate (no payload here)
};

std::string_view to_string(Opcode op) noexcept;

/// The category of work-completion statuses: value() is the ibv_wc_status,
/// message() says what it means and the usual cause.
const std::error_category& wc_category() noexcept;

inline std::error_code make_wc_error(ibv_wc_status status) noexcept {
    return status == IBV_WC_SUCCESS ? std::error_code() : std::error_code(static_cast<int>(status), wc_category());
}

/// A work completion's status as the device reported it (ibv_wc_status),
/// made into a std::error_code only when asked: polling a successful
/// completion costs a 4-byte store, not an error_code. Converts to
/// std::error_code (empty on success, else a wc_category() code such as
/// IBV_WC_REM_ACCESS_ERR) and compares with one.
class CompletionStatus {
public:
    constexpr CompletionStatus() noexcept = default;
    constexpr explicit CompletionStatus(ibv_wc_status raw) noexcept : raw_(raw) {}

    /// The device's own value.
    [[nodiscard]] constexpr ibv_wc_status raw() const noexcept { return raw_; }
    [[nodiscard]] std::error_code code() const noexcept { return make_wc_error(raw_); }
    operator std::error_code() const noexcept {
        return code();
    } // NOLINT(google-explicit-constructor): a status is an error code
    /// True when the request failed.
    constexpr explicit operator bool() const noexcept { return raw_ != IBV_WC_SUCCESS; }
    [[nodiscard]] int value() const noexcept { return code().value(); }
    [[nodiscard]] const std::error_category& category() const noexcept { return code().category(); }
    [[nodiscard]] std::string message() const { return code().message(); }

    friend bool operator==(const CompletionStatus& a, const std::error_code& b) noexcept { return a.code() == b; }
    friend constexpr bool operator==(CompletionStatus a, CompletionStatus b) noexcept { return a.raw_ == b.raw_; }

private:
    ibv_wc_status raw_ = IBV_WC_SUCCESS;
};

/// A finished work request. Plain value; no allocation.
struct Completion {
    Opcode opcode = Opcode::unknown;
    /// Success, or why the request failed (converts to std::error_code).
    CompletionStatus status;
    /// The context the request was posted with.
    std::uint64_t context = 0;
    /// Bytes received (receives) or transferred (reads, atomics: 8).
    std::uint32_t byte_length = 0;
    /// Immediate data, in host byte order, when the peer sent any.
    std::optional<std::uint32_t> immediate;
    /// The local queue pair's number.
    std::uint32_t qp_num = 0;
    /// The sender's QP number (unreliable datagram receives).
    std::uint32_t source_qp = 0;
    /// The provider's own error code, for failures.
    std::uint32_t vendor_error = 0;

    [[nodiscard]] bool ok() const noexcept { return !status; }
};

} // namespace gpuverbs
