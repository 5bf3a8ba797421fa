#include "gpuverbs/error.hpp"

namespace gpuverbs {
namespace {

class GpuverbsCategory final : public std::error_category {
public:
    const char* name() const noexcept override { return "gpuverbs"; }

    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
            case errc::no_rdma_device: return "no RDMA device on this machine";
            case errc::device_not_found: return "no RDMA device has this name";
            case errc::port_not_found: return "the RDMA device has no such port";
            case errc::gid_not_found: return "no suitable GID on this port";
            case errc::built_without_cuda: return "gpuverbs was built without CUDA";
            case errc::no_gpu_driver: return "the NVIDIA GPU driver (libcuda.so.1) is not available";
            case errc::no_gpu: return "no GPU is visible to the CUDA driver";
            case errc::cuda_error: return "a CUDA driver call failed";
            case errc::unsupported: return "not supported by this device or system";
            case errc::invalid_argument: return "invalid argument";
            case errc::local_range_outside_region:
                return "the local buffer is not inside its memory region; nothing was posted";
            case errc::remote_range_outside_region:
                return "the remote range is not inside the remote memory it came from; nothing was posted";
            case errc::inline_too_large:
                return "inline data is longer than the queue pair's max_inline_data; nothing was posted";
            case errc::too_many_sges:
                return "more scatter/gather entries than the queue pair allows; nothing was posted";
            case errc::send_queue_full:
                return "the send queue is full: poll the completion queue (and signal at least one request per "
                       "queue depth); nothing was posted";
            case errc::receive_queue_full:
                return "the receive queue is full: poll the completion queue; nothing was posted";
            case errc::misaligned_atomic:
                return "atomics need 8-byte aligned local and remote addresses and an 8-byte local buffer; "
                       "nothing was posted";
            case errc::batch_full: return "the send batch is full; post it and start another";
            case errc::receives_through_srq:
                return "this queue pair takes its receives from a SharedReceiveQueue: post receives to the "
                       "SharedReceiveQueue, not to the queue pair; nothing was posted";
            case errc::invalid_endpoint: return "the remote endpoint cannot be used with this queue pair";
            case errc::malformed_record: return "the received record is truncated, oversized or not a gpuverbs record";
            case errc::unsupported_version: return "the received record has a version this gpuverbs cannot read";
            case errc::peer_closed: return "the peer closed the connection before the exchange completed";
            case errc::no_executor:
                return "the queue pair's completion queue is not bound to an executor: create the CompletionQueue "
                       "with an executor to use asynchronous operations";
            case errc::not_gpu_memory:
                return "the pointer is not GPU device memory that CUDA knows (host, managed or unmapped memory)";
            case errc::gpu_direct_unavailable:
                return "the RDMA device cannot reach this GPU memory: neither DMA-BUF nor nvidia-peermem works here";
            case errc::rendezvous_unavailable:
                return "the rendezvous (launcher or store) cannot be reached or refused the request";
            case errc::rank_taken: return "another live member of the rendezvous already holds this rank";
            case errc::peer_missing: return "a peer did not publish its record before the deadline";
            case errc::connection_rejected: return "the peer refused the connection";
            case errc::not_connected: return "the connection is not established";
            case errc::stale_block_list:
                return "the block list is older than one already received from its owner (its blocks may have been "
                       "reused)";
            case errc::blocks_leased: return "the blocks are leased to a reader that has not released them yet";
            case errc::stale_metadata:
                return "the pool metadata is older than the one already loaded from that peer (a record from before "
                       "the peer's pool was made again)";
            case errc::reads_not_granted:
                return "the queue pair may have no RDMA read or atomic outstanding (its initiator depth is 0: the "
                       "peer granted no reads or atomics, so one would wait for ever); nothing was posted";
            case errc::device_queue_failed:
                return "the device queue's proxy failed the queue (DeviceQueueProxy::failure() says why: a peer "
                       "with no rail left, or a request it refused)";
            case errc::queue_pair_in_error:
                return "the queue pair is in the error state (QueuePair::failure() says since when and why): "
                       "nothing more can be posted on it; connect a new queue pair (or reset this one and "
                       "connect it again)";
            case errc::queue_pair_stalled:
                return "the queue pair's requests made no progress for longer than the transport's own retry "
                       "bound: gpuverbs declared it failed and moved it to the error state";
            case errc::port_down:
                return "the queue pair's port went down with requests outstanding: gpuverbs moved it to the error "
                       "state";
            case errc::lease_unknown:
                return "no live lease has this id: it was released already, expired, or never granted";
            case errc::lease_not_yours:
                return "the lease was granted to another reader: only that reader may release it (refused; the "
                       "blocks stay leased)";
            case errc::async_needs_one_cq:
                return "asynchronous operations need the queue pair's send and receive completion queue to be the "
                       "same CompletionQueue";
        }
        return "unknown gpuverbs error " + std::to_string(value);
    }

    std::error_condition default_error_condition(int value) const noexcept override {
        switch (static_cast<errc>(value)) {
            case errc::unsupported: return std::errc::operation_not_supported;
            case errc::invalid_argument:
            case errc::receives_through_srq:
            case errc::local_range_outside_region:
            case errc::remote_range_outside_region:
            case errc::inline_too_large:
            case errc::too_many_sges:
            case errc::misaligned_atomic: return std::errc::invalid_argument;
            case errc::reads_not_granted: return std::errc::permission_denied;
            case errc::blocks_leased: return std::errc::device_or_resource_busy;
            case errc::lease_not_yours: return std::errc::permission_denied;
            case errc::send_queue_full:
            case errc::receive_queue_full:
            case errc::batch_full: return std::errc::no_buffer_space;
            case errc::device_not_found:
            case errc::no_rdma_device:
            case errc::port_not_found: return std::errc::no_such_device;
            case errc::peer_missing: return std::errc::timed_out;
            case errc::connection_rejected: return std::errc::connection_refused;
            case errc::not_connected: return std::errc::not_connected;
            case errc::queue_pair_stalled: return std::errc::timed_out;
            case errc::port_down: return std::errc::network_down;
            default: return {value, *this};
        }
    }
};

std::string what_text(std::string_view verb, std::string_view detail, std::error_code code) {
    std::string text(verb);
    text += ": ";
    text += detail.empty() ? code.message() : std::string(detail);
    return text;
}

} // namespace

const std::error_category& gpuverbs_category() noexcept {
    static const GpuverbsCategory category;
    return category;
}

namespace {

class ConditionCategory final : public std::error_category {
public:
    const char* name() const noexcept override { return "gpuverbs condition"; }

    std::string message(int value) const override {
        switch (static_cast<condition>(value)) {
            case condition::refused_locally:
                return "refused locally: a check of the data path refused the request before anything was posted";
        }
        return "unknown gpuverbs condition " + std::to_string(value);
    }

    bool equivalent(const std::error_code& code, int value) const noexcept override {
        if (code.category() != gpuverbs_category()) return false;
        switch (static_cast<condition>(value)) {
            case condition::refused_locally:
                switch (static_cast<errc>(code.value())) {
                    case errc::local_range_outside_region:
                    case errc::remote_range_outside_region:
                    case errc::inline_too_large:
                    case errc::too_many_sges:
                    case errc::send_queue_full:
                    case errc::receive_queue_full:
                    case errc::misaligned_atomic:
                    case errc::batch_full:
                    case errc::receives_through_srq:
                    case errc::reads_not_granted:
                    case errc::no_executor:
                    case errc::async_needs_one_cq: return true;
                    default: return false;
                }
        }
        return false;
    }
};

} // namespace

const std::error_category& condition_category() noexcept {
    static const ConditionCategory category;
    return category;
}

Error::Error(std::error_code code, std::string_view verb, std::string_view detail)
    : std::system_error(code), verb_(verb), detail_(detail), text_(what_text(verb, detail, code)) {}

namespace detail {

std::string errno_text(int err) {
    std::string text = std::error_code(err, std::system_category()).message(); // strerror is not thread-safe
    text += " (errno ";
    text += std::to_string(err);
    text += ')';
    return text;
}

void Status::fail_errno(int err, std::string_view v, std::string_view what) {
    std::string d(what);
    d += ": ";
    d += errno_text(err);
    fail({err, std::system_category()}, v, std::move(d));
}

} // namespace detail

void Diagnostics::set(std::error_code code, std::string_view verb, std::string_view detail) {
    detail::Status status;
    status.fail(code, verb, std::string(detail));
    status.report(*this);
}

namespace detail {

void Status::raise() const {
    throw Error(code, verb, detail);
}

void Status::report(Diagnostics& diagnostics) const {
    if (ok()) {
        diagnostics.clear();
        return;
    }
    diagnostics.verb_ = verb;
    diagnostics.detail_ = detail.empty() ? code.message() : detail;
    diagnostics.message_ = what_text(verb, detail, code);
}

void Status::adopt(std::error_code ec, const Diagnostics& diagnostics, std::string_view fallback_verb) {
    if (!ec) {
        *this = Status{};
        return;
    }
    fail(ec, diagnostics.verb().empty() ? fallback_verb : std::string_view(diagnostics.verb()),
         diagnostics.verb().empty() ? std::string() : diagnostics.detail());
}

} // namespace detail
} // namespace gpuverbs
