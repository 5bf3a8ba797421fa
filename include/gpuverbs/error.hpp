// Errors: one exception type that names the failing call, and error codes in
// gpuverbs' own category next to std::system_category for errno values.
//
// Set-up calls come in two forms, as in fmt and Asio: one that throws
// gpuverbs::Error, and one taking std::error_code& that never throws. The
// throwing form carries the full explanation (which verb, which object, what
// to do); the error_code form carries the code, and the calls whose words
// matter most (opening a device, registering memory, connecting) take a
// Diagnostics beside it that receives the same explanation, as Boost.MySQL's
// diagnostics do:
//
//   std::error_code ec;
//   gpuverbs::Diagnostics diag;
//   auto dev = gpuverbs::Device::open("mlx5_9", ec, diag);
//   if (ec) std::fprintf(stderr, "%s\n", diag.message().c_str());
#pragma once

#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace gpuverbs {

/// Failures that are gpuverbs' own, not an errno from the kernel.
enum class errc {
    no_rdma_device = 1, ///< the machine has no RDMA device at all
    device_not_found,   ///< no RDMA device has the requested name
    port_not_found,     ///< the device has no port with that number
    gid_not_found,      ///< no GID of the wanted kind on that port
    built_without_cuda, ///< gpuverbs was compiled without the CUDA toolkit
    no_gpu_driver,      ///< libcuda.so.1 could not be loaded or initialised
    no_gpu,             ///< the driver is there but sees no GPU
    cuda_error,         ///< a CUDA driver call failed (see the message)
    unsupported,        ///< the operation is not supported by this device or system
    invalid_argument,   ///< an argument is out of range or inconsistent
    // The data path's local checks: nothing was posted.
    local_range_outside_region,  ///< a local buffer is not inside its memory region
    remote_range_outside_region, ///< a remote range is not inside the RemoteMemory it came from
    inline_too_large,            ///< inline data longer than the QP's max_inline_data
    too_many_sges,               ///< more scatter/gather entries than the QP allows
    send_queue_full,             ///< no free send slot: poll completions (or signal more often)
    receive_queue_full,          ///< no free receive slot: poll completions
    misaligned_atomic,           ///< an atomic's addresses are not 8-byte aligned, or its buffer is not 8 bytes
    batch_full,                  ///< the SendBatch holds as many requests as it can
    receives_through_srq,        ///< the queue pair takes its receives from a SharedReceiveQueue: post them there
    // Connection set-up and the wire format.
    invalid_endpoint,    ///< a remote Endpoint cannot be used with this QP
    malformed_record,    ///< a received record is truncated, oversized or not a gpuverbs record
    unsupported_version, ///< a received record has a version this gpuverbs cannot read
    peer_closed,         ///< the peer closed the connection before the exchange completed
    // The asynchronous layer.
    no_executor,        ///< the QP's completion queue is not bound to an executor
    async_needs_one_cq, ///< asynchronous operations need the QP's send and receive CQ to be the same
    // GPU memory.
    not_gpu_memory,         ///< the pointer is not device memory CUDA knows (host, managed or unmapped memory)
    gpu_direct_unavailable, ///< no registration method lets this NIC reach this GPU memory (see the reasons)
    // Many peers (rendezvous.hpp, mesh.hpp).
    rendezvous_unavailable, ///< the launcher or store cannot be reached, or refused us (see the message)
    rank_taken,             ///< another live member already holds this rank in the rendezvous
    peer_missing,           ///< a peer did not publish what we need before the deadline
    // rdma_cm (rdma_cm.hpp).
    connection_rejected, ///< the peer refused the connection (CmConnection::rejection() has its reason and data)
    not_connected,       ///< the connection is not (or no longer) established
    // Leases on a peer's blocks (leases.hpp).
    stale_block_list, ///< a block list older than one already received from the same owner
    blocks_leased,    ///< the owner may not reuse these blocks yet: a reader holds a lease on them
    // Liveness: what gpuverbs knows of a queue pair's state (QueuePair::failure()).
    queue_pair_in_error, ///< the queue pair is in the error state: nothing more can be posted on it; reconnect it
    queue_pair_stalled,  ///< its requests made no progress for longer than the transport's retry bound: gpuverbs moved
                         ///< it to error
    port_down,           ///< its port went down with requests outstanding: gpuverbs moved it to error
    // Leases, continued (leases.hpp).
    lease_unknown,   ///< no live lease has this id (released already, expired, or never granted)
    lease_not_yours, ///< the lease was granted to another reader: only that reader may release it
    // KV-cache pools (kv_pool.hpp).
    stale_metadata, ///< pool metadata older than the one already loaded from that peer (a restarted peer's old record)
    // The device queue (device_queue/proxy.hpp).
    device_queue_failed, ///< the proxy failed the queue: a peer with no rail left, or a request it refused (its
                         ///< failure())
    // The data path's local checks, continued: nothing was posted.
    reads_not_granted, ///< a read or atomic on a queue pair whose initiator depth is 0 (the peer granted no reads or
                       ///< atomics): it would wait for ever
};

/// The category of gpuverbs::errc values; its name is "gpuverbs".
const std::error_category& gpuverbs_category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), gpuverbs_category()};
}

/// Kinds of failure that several codes share, to compare an error with:
/// `if (ec == gpuverbs::condition::refused_locally) …`.
enum class condition {
    /// A local check of the data path refused the request before anything
    /// was posted (a range outside its region, inline data too large, too
    /// many pieces, a full queue or batch, a misaligned atomic, receives
    /// that belong to the SRQ, no executor, send and receive CQs apart):
    /// nothing reached the device, the queue pair is unchanged, and the same
    /// request fails again until it is corrected (or, for a full queue, until
    /// room is made).
    refused_locally = 1,
};
/// The category of gpuverbs::condition (name "gpuverbs condition").
const std::error_category& condition_category() noexcept;
inline std::error_condition make_error_condition(condition c) noexcept {
    return {static_cast<int>(c), condition_category()};
}

/// The error thrown by the throwing forms of gpuverbs calls.
///
/// what() reads "VERB: DETAIL", e.g. "ibv_open_device: no RDMA device named
/// 'mlx5_9'; devices present: rxe0, rxe1". code() is the errno (system
/// category) or a gpuverbs::errc.
class Error : public std::system_error {
public:
    Error(std::error_code code, std::string_view verb, std::string_view detail);

    /// The library or system call that failed, e.g. "ibv_query_port".
    [[nodiscard]] const std::string& verb() const noexcept { return verb_; }

    /// What happened and what to do, without the verb (Diagnostics::detail()).
    [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

    /// "VERB: DETAIL" (std::system_error would append the code's message again).
    [[nodiscard]] const char* what() const noexcept override { return text_.c_str(); }

private:
    std::string verb_;
    std::string detail_;
    std::string text_;
};

namespace detail {
struct Status;
}

/// What went wrong, in words, for the error_code forms of set-up calls: the
/// verb and explanation the throwing form's Error would carry. Empty after a
/// call that succeeded; the error_code beside it says whether it failed.
class Diagnostics {
public:
    /// The library or system call that failed, e.g. "ibv_open_device".
    [[nodiscard]] const std::string& verb() const noexcept { return verb_; }
    /// What happened and what to do, without the verb.
    [[nodiscard]] const std::string& detail() const noexcept { return detail_; }
    /// "VERB: DETAIL": exactly the text Error::what() would have had.
    [[nodiscard]] const std::string& message() const noexcept { return message_; }
    /// Sets the words as a gpuverbs call would: for code that implements one
    /// of gpuverbs' extension points (a Rendezvous of its own) and reports its
    /// failures the way the library's calls do. `detail` empty: the words of `code`.
    void set(std::error_code code, std::string_view verb, std::string_view detail);
    /// Empties all three (the calls that take a Diagnostics clear it on success).
    void clear() noexcept {
        verb_.clear();
        detail_.clear();
        message_.clear();
    }

private:
    friend struct detail::Status;
    std::string verb_;
    std::string detail_;
    std::string message_;
};

/// Throws Error(ec, verb) when `ec` is set. For programs that prefer
/// exceptions, around the data path's error codes:
/// `gpuverbs::throw_if(qp.post_write(src, dst), "post_write");`
inline void throw_if(std::error_code ec, std::string_view verb) {
    if (ec) throw Error(ec, verb, "");
}
namespace detail {

/// "<strerror text> (errno N)" for an errno value, e.g. "Bad address (errno
/// 14)": the one place gpuverbs spells out an errno (thread-safe, unlike strerror).
std::string errno_text(int err);

/// The outcome of an internal call: the code plus the words for the user.
/// Internals fill one of these; the public throwing form raises it and the
/// error_code form keeps only the code, so each call is written once.
struct Status {
    std::error_code code;
    std::string verb;
    std::string detail;

    [[nodiscard]] bool ok() const noexcept { return !code; }
    void fail(std::error_code c, std::string_view v, std::string d) {
        code = c;
        verb = v;
        detail = std::move(d);
    }
    /// Fails with errno: detail is "<what>: " + errno_text(err).
    void fail_errno(int err, std::string_view v, std::string_view what);
    [[noreturn]] void raise() const;
    /// Hands the words to the user's Diagnostics (cleared when this succeeded).
    void report(Diagnostics& diagnostics) const;
    /// The outcome of a call's error_code form: `ec` and its words, kept as
    /// this Status (`fallback_verb` when the call left `diagnostics` empty).
    void adopt(std::error_code ec, const Diagnostics& diagnostics, std::string_view fallback_verb);
    /// Throws if failed, else does nothing.
    void check() const {
        if (!ok()) raise();
    }
};

/// Where a constructor's outcome goes, for the types that cannot be moved
/// (a mutex, or a pointer others keep to them): their create() forms return
/// a prvalue made by a private constructor that takes one of these. No code:
/// throw, as the public constructor does; else the code, and the words when
/// `diagnostics` is given.
struct Outcome {
    std::error_code* code = nullptr;
    Diagnostics* diagnostics = nullptr;
    /// Throws or reports `status`, as the form this Outcome stands for.
    void settle(const Status& status) const {
        if (code == nullptr) {
            status.check();
            return;
        }
        *code = status.code;
        if (diagnostics != nullptr) status.report(*diagnostics);
    }
};

/// Runs `impl(Status&)` as the throwing form of a call.
template <class Impl>
auto or_throw(Impl&& impl) {
    Status status;
    if constexpr (std::is_void_v<decltype(impl(status))>) {
        impl(status);
        status.check();
    } else {
        auto result = impl(status);
        status.check();
        return result;
    }
}

/// Runs `impl(Status&)` as the error_code form of a call.
template <class Impl>
auto or_code(std::error_code& ec, Impl&& impl) {
    Status status;
    if constexpr (std::is_void_v<decltype(impl(status))>) {
        impl(status);
        ec = status.code;
    } else {
        auto result = impl(status);
        ec = status.code;
        return result;
    }
}

/// The error_code form with the words kept in `diagnostics`.
template <class Impl>
auto or_code(std::error_code& ec, Diagnostics& diagnostics, Impl&& impl) {
    Status status;
    if constexpr (std::is_void_v<decltype(impl(status))>) {
        impl(status);
        ec = status.code;
        status.report(diagnostics);
    } else {
        auto result = impl(status);
        ec = status.code;
        status.report(diagnostics);
        return result;
    }
}

} // namespace detail
} // namespace gpuverbs

template <>
struct std::is_error_code_enum<gpuverbs::errc> : std::true_type {};
template <>
struct std::is_error_condition_enum<gpuverbs::condition> : std::true_type {};
