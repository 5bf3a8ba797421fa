// The shared state behind completion queues, queue pairs and shared receive
// queues: who keeps whom alive. A QP's core holds its CQs' and PD's cores, so
// they outlive it; a CQ's registry knows its QPs by a small index that every
// wr_id carries (work_queue_state.hpp), so a completion finds its queue's
// state without a lock or a search (the completion path: completion_path.hpp).
#pragma once

#include "gpuverbs/detail/verbs/device_core.hpp"
#include "gpuverbs/detail/verbs/qp_health.hpp"
#include "gpuverbs/detail/verbs/work_queue_state.hpp"
#include "gpuverbs/verbs/completion.hpp"
#include "gpuverbs/verbs/protection_domain.hpp"
#include "gpuverbs/verbs/queue_pair_types.hpp"

#include <infiniband/verbs.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace gpuverbs::detail {

/// Release builds ignore a failed destroy (nothing useful can be done in a
/// destructor); debug builds stop at it, because it means a leak or a bug
/// (e.g. a CQ destroyed while a QP still uses it).
inline void destroyed(int rc) noexcept {
    assert(rc == 0 && "an ibv_destroy_* / ibv_dealloc_* call failed");
    (void)rc;
}

class ChannelCore {
public:
    ChannelCore(std::shared_ptr<DeviceCore> device, ibv_comp_channel* channel) noexcept
        : device_(std::move(device)), channel_(channel) {}
    ChannelCore(const ChannelCore&) = delete;
    ChannelCore& operator=(const ChannelCore&) = delete;
    ~ChannelCore() { destroyed(ibv_destroy_comp_channel(channel_)); }
    [[nodiscard]] ibv_comp_channel* channel() const noexcept { return channel_; }

private:
    std::shared_ptr<DeviceCore> device_;
    ibv_comp_channel* channel_;
};

/// Process-wide numbers for shared receive queues: an SRQ's receives carry
/// its number in their wr_id (an SRQ completion cannot name the QP that
/// consumed it), and each CQ finds the SRQ by that number in its registry.
class SrqNumbers {
public:
    /// A free number and its next generation, as a WrId tag. Throws
    /// std::length_error past 65,536 SRQs alive at once.
    static std::uint32_t take() {
        SrqNumbers& n = instance();
        std::lock_guard lock(n.mutex_);
        std::uint32_t index = 0;
        if (!n.free_.empty()) {
            index = n.free_.back();
            n.free_.pop_back();
        } else {
            if (n.generations_.size() == 0x10000) throw std::length_error("more than 65536 shared receive queues");
            index = static_cast<std::uint32_t>(n.generations_.size());
            n.generations_.push_back(0);
        }
        n.free_.reserve(n.generations_.size()); // so that give_back() never allocates
        const std::uint32_t generation = (n.generations_[index] + 1) & WrId::generation_mask;
        n.generations_[index] = generation;
        return WrId::tag(index, generation);
    }
    static void give_back(std::uint32_t tag) noexcept {
        SrqNumbers& n = instance();
        std::lock_guard lock(n.mutex_);  // NOLINT(bugprone-exception-escape): an owned mutex
        n.free_.push_back(tag & 0xffff); // reserved in take()
    }

private:
    static SrqNumbers& instance() {
        static SrqNumbers* n = new SrqNumbers; // never destroyed: SRQs may outlive static destruction
        return *n;
    }
    std::mutex mutex_;
    std::vector<std::uint16_t> generations_;
    std::vector<std::uint32_t> free_;
};

class SrqCore {
public:
    SrqCore(std::shared_ptr<PdCore> pd, ibv_srq* srq, std::uint32_t capacity, std::uint32_t max_sge)
        : pd_(std::move(pd)), srq_(srq), tag_(SrqNumbers::take()), receive(capacity), max_sge(max_sge) {
        pd_->device()->subjects().add(srq_, id_);
    }
    SrqCore(const SrqCore&) = delete;
    SrqCore& operator=(const SrqCore&) = delete;
    ~SrqCore() {
        destroyed(ibv_destroy_srq(srq_));
        pd_->device()->subjects().remove(srq_, id_);
        SrqNumbers::give_back(tag_);
    }
    [[nodiscard]] ibv_srq* srq() const noexcept { return srq_; }
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }
    /// What its receives' wr_ids carry (its number and generation).
    [[nodiscard]] std::uint32_t tag() const noexcept { return tag_; }

private:
    std::shared_ptr<PdCore> pd_;
    ibv_srq* srq_;
    std::uint64_t id_ = next_object_id();
    std::uint32_t tag_;

public:
    WorkQueueState receive;
    std::uint32_t max_sge;
};

class QpCore;
class AsyncDriver;

/// The QPs of one CQ, by index. Lookups are lock-free; adding and removing
/// (QP creation and destruction) take a mutex, and removal waits for a poll in
/// progress to finish, so a poll never touches a QP being destroyed.
class QpRegistry {
public:
    static constexpr std::uint32_t chunk_size = 256;
    static constexpr std::uint32_t max_chunks = 256; ///< 65,536 QPs per CQ (16 index bits in the wr_id)

    QpRegistry() = default;
    QpRegistry(const QpRegistry&) = delete;
    QpRegistry& operator=(const QpRegistry&) = delete;
    ~QpRegistry() {
        for (auto& c : chunks_) delete c.load(std::memory_order_relaxed);
        for (auto& c : srq_chunks_) delete c.load(std::memory_order_relaxed);
    }

    /// Registers `qp`; returns its tag (WrId::tag). Throws std::bad_alloc, or
    /// std::length_error past 65,536 QPs on one CQ.
    std::uint32_t add(QpCore* qp) {
        std::lock_guard lock(mutex_);
        std::uint32_t index = 0;
        if (!free_.empty()) {
            index = free_.back();
            free_.pop_back();
        } else {
            index = next_.load(std::memory_order_relaxed);
            if (index == chunk_size * max_chunks) throw std::length_error("more than 65536 queue pairs on one CQ");
            auto& chunk = chunks_[index / chunk_size];
            if (chunk.load(std::memory_order_relaxed) == nullptr) {
                chunk.store(new Chunk, std::memory_order_release);
            }
        }
        free_.reserve(next_.load(std::memory_order_relaxed) + 1); // so that remove() never allocates
        if (index == next_.load(std::memory_order_relaxed)) next_.store(index + 1, std::memory_order_release);
        Entry& e = entry(index);
        const std::uint32_t generation = (e.generation.load(std::memory_order_relaxed) + 1) & WrId::generation_mask;
        e.generation.store(generation, std::memory_order_relaxed);
        e.qp.store(qp, std::memory_order_release);
        return WrId::tag(index, generation);
    }

    /// Unregisters the QP with `tag` and waits until no poll can still see it.
    void remove(std::uint32_t tag) noexcept {
        std::lock_guard lock(mutex_); // NOLINT(bugprone-exception-escape): an owned mutex
        const std::uint32_t index = tag & 0xffff;
        entry(index).qp.store(nullptr, std::memory_order_seq_cst);
        while (pollers_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
        free_.push_back(index); // reserved in add()
    }

    /// The live QP registered with (index, generation), or nullptr. Only
    /// between PollGuard's construction and destruction.
    [[nodiscard]] QpCore* find(std::uint32_t index, std::uint32_t generation) const noexcept {
        const Chunk* c = chunks_[(index / chunk_size) % max_chunks].load(std::memory_order_acquire);
        if (c == nullptr) return nullptr;
        const Entry& e = c->entries[index % chunk_size];
        QpCore* qp = e.qp.load(std::memory_order_seq_cst);
        return qp != nullptr && e.generation.load(std::memory_order_relaxed) == generation ? qp : nullptr;
    }
    /// A QP of this CQ receives through `srq`: completions naming the SRQ's
    /// number find it here (counted: several QPs may share it). Throws std::bad_alloc.
    void add_srq(SrqCore* srq) {
        std::lock_guard lock(mutex_);
        const std::uint32_t index = srq->tag() & 0xffff;
        auto& chunk = srq_chunks_[index / chunk_size];
        if (chunk.load(std::memory_order_relaxed) == nullptr) chunk.store(new SrqChunk, std::memory_order_release);
        SrqEntry& e = chunk.load(std::memory_order_relaxed)->entries[index % chunk_size];
        if (e.users++ == 0) {
            e.generation.store(srq->tag() >> 16, std::memory_order_relaxed);
            e.srq.store(srq, std::memory_order_release);
        }
    }
    /// One QP less receives through `srq`; the last one waits until no poll can still see it.
    void remove_srq(SrqCore* srq) noexcept {
        std::lock_guard lock(mutex_); // NOLINT(bugprone-exception-escape): an owned mutex
        const std::uint32_t index = srq->tag() & 0xffff;
        SrqEntry& e = srq_chunks_[index / chunk_size].load(std::memory_order_relaxed)->entries[index % chunk_size];
        if (--e.users != 0) return;
        e.srq.store(nullptr, std::memory_order_seq_cst);
        while (pollers_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    }
    /// The SRQ a shared-receive completion names, or nullptr (no QP of this
    /// CQ uses it any more). Only inside a PollGuard. No search.
    [[nodiscard]] SrqCore* find_srq(std::uint32_t index, std::uint32_t generation) const noexcept {
        const SrqChunk* c = srq_chunks_[(index / chunk_size) % max_chunks].load(std::memory_order_acquire);
        if (c == nullptr) return nullptr;
        const SrqEntry& e = c->entries[index % chunk_size];
        SrqCore* srq = e.srq.load(std::memory_order_seq_cst);
        return srq != nullptr && e.generation.load(std::memory_order_relaxed) == generation ? srq : nullptr;
    }

    /// Marks a poll in progress (see remove()).
    class PollGuard {
    public:
        explicit PollGuard(QpRegistry& r) noexcept : r_(r) { r_.pollers_.fetch_add(1, std::memory_order_seq_cst); }
        PollGuard(const PollGuard&) = delete;
        PollGuard& operator=(const PollGuard&) = delete;
        ~PollGuard() { r_.pollers_.fetch_sub(1, std::memory_order_release); }

    private:
        QpRegistry& r_;
    };

private:
    struct Entry {
        std::atomic<QpCore*> qp{nullptr};
        std::atomic<std::uint32_t> generation{0};
    };
    struct Chunk {
        std::array<Entry, chunk_size> entries;
    };
    Entry& entry(std::uint32_t index) noexcept {
        return chunks_[index / chunk_size].load(std::memory_order_relaxed)->entries[index % chunk_size];
    }

    struct SrqEntry {
        std::atomic<SrqCore*> srq{nullptr};
        std::atomic<std::uint32_t> generation{0};
        std::uint32_t users = 0; ///< QPs of this CQ receiving through it (under mutex_)
    };
    struct SrqChunk {
        std::array<SrqEntry, chunk_size> entries;
    };

    std::array<std::atomic<Chunk*>, max_chunks> chunks_{};
    std::array<std::atomic<SrqChunk*>, max_chunks> srq_chunks_{};
    std::atomic<int> pollers_{0};
    std::mutex mutex_;
    std::vector<std::uint32_t> free_;
    std::atomic<std::uint32_t> next_{0}; ///< indices below were handed out at least once
};

class CqCore {
public:
    CqCore(std::shared_ptr<DeviceCore> device, std::shared_ptr<ChannelCore> channel, ibv_cq* cq) noexcept
        : device_(std::move(device)), channel_(std::move(channel)), cq_(cq) {
        device_->subjects().add(cq_, id_);
    }
    CqCore(const CqCore&) = delete;
    CqCore& operator=(const CqCore&) = delete;
    ~CqCore() {
        // Events got from the channel must be acknowledged before destruction.
        if (unacked_events_ != 0) ibv_ack_cq_events(cq_, unacked_events_);
        destroyed(ibv_destroy_cq(cq_));
        device_->subjects().remove(cq_, id_);
    }
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }

    [[nodiscard]] ibv_cq* cq() const noexcept { return cq_; }
    [[nodiscard]] ibv_comp_channel* channel() const noexcept { return channel_ ? channel_->channel() : nullptr; }
    [[nodiscard]] const std::shared_ptr<ChannelCore>& channel_core() const noexcept { return channel_; }
    /// The driver of asynchronous operations, when the CQ is bound to an
    /// executor. Set once, before any operation. The CQ owns it; the driver
    /// refers back to the CQ without owning it (no cycle).
    [[nodiscard]] AsyncDriver* driver() const noexcept { return driver_.get(); }
    void set_driver(std::shared_ptr<AsyncDriver> driver) noexcept { driver_ = std::move(driver); }

    [[nodiscard]] QpRegistry& registry() noexcept { return registry_; }

    // Polling is the completion path's: detail::poll_into (completion_path.hpp).

    /// Events are acknowledged in batches (ibv_ack_cq_events takes a mutex).
    void count_event() noexcept {
        if (++unacked_events_ >= 64) {
            ibv_ack_cq_events(cq_, unacked_events_);
            unacked_events_ = 0;
        }
    }

private:
    std::shared_ptr<DeviceCore> device_;
    std::shared_ptr<ChannelCore> channel_;
    ibv_cq* cq_;
    std::uint64_t id_ = next_object_id();
    QpRegistry registry_;
    unsigned unacked_events_ = 0;
    std::shared_ptr<AsyncDriver> driver_;
};

/// The asynchronous layer's per-work-queue state (see async_fsm.hpp):
/// operations of this queue waiting for room, guarded by the driver's mutex.
struct AsyncWorkQueue {
    std::size_t waiting = 0;
    std::uint64_t blocked_pass = 0; ///< the machine's last retry pass that found this queue full
};

class QpCore {
public:
    using Caps = QueuePairCapabilities;

    /// `owner`, when given, owns the ibv_qp (an rdma_cm id): releasing it
    /// destroys the QP, so the QpCore does not.
    QpCore(std::shared_ptr<PdCore> pd, std::shared_ptr<CqCore> send_cq, std::shared_ptr<CqCore> recv_cq,
           std::shared_ptr<SrqCore> srq, ibv_qp* qp, const Caps& caps, std::shared_ptr<void> owner = nullptr)
        : pd_(std::move(pd)),
          send_cq_(std::move(send_cq)),
          recv_cq_(std::move(recv_cq)),
          srq_(std::move(srq)),
          qp_(qp),
          qp_num_(qp->qp_num),
          caps_(caps),
          owner_(std::move(owner)),
          send(caps.max_send_wr),
          receive(caps.max_recv_wr) {
        send_tag_ = send_cq_->registry().add(this);
        if (recv_cq_ == send_cq_) {
            recv_tag_ = send_tag_;
        } else {
            try {
                recv_tag_ = recv_cq_->registry().add(this);
            } catch (...) {
                send_cq_->registry().remove(send_tag_);
                throw;
            }
        }
        if (srq_ != nullptr) {
            try {
                recv_cq_->registry().add_srq(srq_.get());
            } catch (...) {
                send_cq_->registry().remove(send_tag_);
                if (recv_cq_ != send_cq_) recv_cq_->registry().remove(recv_tag_);
                throw;
            }
        }
        pd_->device()->subjects().add(qp_, id_);
    }
    QpCore(const QpCore&) = delete;
    QpCore& operator=(const QpCore&) = delete;
    ~QpCore() {
        if (!owner_) destroyed(ibv_destroy_qp(qp_));
        owner_.reset(); // destroys an rdma_cm QP, while the CQs and PD are still alive
        send_cq_->registry().remove(send_tag_);
        if (recv_cq_ != send_cq_) recv_cq_->registry().remove(recv_tag_);
        if (srq_ != nullptr) recv_cq_->registry().remove_srq(srq_.get());
        pd_->device()->subjects().remove(qp_, id_);
    }
    [[nodiscard]] std::uint64_t id() const noexcept { return id_; }

    [[nodiscard]] ibv_qp* qp() const noexcept { return qp_; }
    /// The extended-verbs view of the QP when it was made with them (QueuePairOptions::extended_verbs).
    [[nodiscard]] ibv_qp_ex* extended() const noexcept { return qpx_; }
    void use_extended(ibv_qp_ex* qpx) noexcept { qpx_ = qpx; }
    [[nodiscard]] std::uint32_t qp_num() const noexcept { return qp_num_; }
    [[nodiscard]] const Caps& caps() const noexcept { return caps_; }
    /// The initiator depth it connected with (set while it is connected, before anything is posted).
    void set_max_rd_atomic(std::uint32_t depth) noexcept { caps_.max_rd_atomic = depth; }
    /// Moves the QP to ERROR (the provider flushes what it holds and nothing
    /// more of it goes on the wire); the errno when the provider refused.
    int move_to_error() const noexcept {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_ERR;
        return ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
    }
    [[nodiscard]] SrqCore* srq() const noexcept { return srq_.get(); }
    [[nodiscard]] CqCore* send_cq() const noexcept { return send_cq_.get(); }
    [[nodiscard]] CqCore* recv_cq() const noexcept { return recv_cq_.get(); }
    [[nodiscard]] const std::shared_ptr<PdCore>& pd() const noexcept { return pd_; }
    /// What this QP's wr_ids carry for its send and receive CQs.
    [[nodiscard]] std::uint32_t send_tag() const noexcept { return send_tag_; }
    [[nodiscard]] std::uint32_t recv_tag() const noexcept { return recv_tag_; }

private:
    std::shared_ptr<PdCore> pd_;
    std::shared_ptr<CqCore> send_cq_;
    std::shared_ptr<CqCore> recv_cq_;
    std::shared_ptr<SrqCore> srq_;
    ibv_qp* qp_;
    ibv_qp_ex* qpx_ = nullptr;
    std::uint32_t qp_num_;
    std::uint64_t id_ = next_object_id();
    Caps caps_;
    std::shared_ptr<void> owner_;
    std::uint32_t send_tag_ = 0;
    std::uint32_t recv_tag_ = 0;

public:
    WorkQueueState send;
    WorkQueueState receive;
    AsyncWorkQueue async_send;
    AsyncWorkQueue async_receive;
    /// What gpuverbs knows of its state (posting reads it; anyone may mark it failed).
    QpHealth health;
    /// The asynchronous engine's watch over it (under the driver's lock).
    QpWatch watch;
};

} // namespace gpuverbs::detail
