// The shared state behind completion queues, queue pairs and shared receive
// queues. A QP's core holds its CQs' and PD's cores, so they outlive it; a CQ
// knows the QPs attached to it (by number) so that poll() can turn a
// completion's wr_id back into the caller's context.
#pragma once

#include "gpuverbs/completion.hpp"
#include "gpuverbs/detail/device_core.hpp"
#include "gpuverbs/detail/work_queue_state.hpp"
#include "gpuverbs/protection_domain.hpp"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <vector>

namespace gpuverbs::detail {

/// A lock for the rare attach/detach against the per-batch lookup in poll();
/// noexcept, unlike std::mutex::lock.
class SpinLock {
public:
    void lock() noexcept {
        while (flag_.test_and_set(std::memory_order_acquire)) flag_.wait(true, std::memory_order_relaxed);
    }
    void unlock() noexcept {
        flag_.clear(std::memory_order_release);
        flag_.notify_one();
    }

private:
    std::atomic_flag flag_;
};

class ChannelCore {
public:
    ChannelCore(std::shared_ptr<DeviceCore> device, ibv_comp_channel* channel) noexcept
        : device_(std::move(device)), channel_(channel) {}
    ChannelCore(const ChannelCore&) = delete;
    ChannelCore& operator=(const ChannelCore&) = delete;
    ~ChannelCore() { (void)ibv_destroy_comp_channel(channel_); }
    [[nodiscard]] ibv_comp_channel* channel() const noexcept { return channel_; }

private:
    std::shared_ptr<DeviceCore> device_;
    ibv_comp_channel* channel_;
};

class SrqCore {
public:
    SrqCore(std::shared_ptr<PdCore> pd, ibv_srq* srq, std::uint32_t capacity, std::uint32_t max_sge)
        : pd_(std::move(pd)), srq_(srq), receive(capacity), max_sge(max_sge) {}
    SrqCore(const SrqCore&) = delete;
    SrqCore& operator=(const SrqCore&) = delete;
    ~SrqCore() { (void)ibv_destroy_srq(srq_); }
    [[nodiscard]] ibv_srq* srq() const noexcept { return srq_; }

private:
    std::shared_ptr<PdCore> pd_;
    ibv_srq* srq_;

public:
    WorkQueueState receive;
    std::uint32_t max_sge;
};

class QpCore;
class AsyncDriver;

class CqCore {
public:
    CqCore(std::shared_ptr<DeviceCore> device, std::shared_ptr<ChannelCore> channel, ibv_cq* cq) noexcept
        : device_(std::move(device)), channel_(std::move(channel)), cq_(cq) {}
    CqCore(const CqCore&) = delete;
    CqCore& operator=(const CqCore&) = delete;
    ~CqCore() {
        // Events got from the channel must be acknowledged before destruction.
        if (unacked_events_ != 0) ibv_ack_cq_events(cq_, unacked_events_);
        (void)ibv_destroy_cq(cq_);
    }

    [[nodiscard]] ibv_cq* cq() const noexcept { return cq_; }
    [[nodiscard]] ibv_comp_channel* channel() const noexcept { return channel_ ? channel_->channel() : nullptr; }
    [[nodiscard]] const std::shared_ptr<ChannelCore>& channel_core() const noexcept { return channel_; }
    /// The driver of asynchronous operations, when the CQ is bound to an executor.
    /// Set once, before any operation, and never changed.
    [[nodiscard]] AsyncDriver* driver() const noexcept { return driver_.get(); }
    void set_driver(std::shared_ptr<AsyncDriver> driver) noexcept { driver_ = std::move(driver); }

    void attach(QpCore* qp) noexcept {
        lock_.lock();
        qps_.push_back(qp); // reserved in the constructor of the QP's owner: see QpCore
        lock_.unlock();
    }
    void detach(QpCore* qp) noexcept {
        lock_.lock();
        qps_.erase(std::remove(qps_.begin(), qps_.end(), qp), qps_.end());
        lock_.unlock();
    }
    void reserve_one_more() { qps_.reserve(qps_.size() + 1); }

    /// Polls up to out.size() completions; negative errno on failure.
    int poll(Completion* out, int max) noexcept;

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
    SpinLock lock_;
    std::vector<QpCore*> qps_;
    unsigned unacked_events_ = 0;
    std::shared_ptr<AsyncDriver> driver_;
};

class QpCore {
public:
    struct Caps {
        std::uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
    };

    /// `owner`, when given, owns the ibv_qp (an rdma_cm id): releasing it
    /// destroys the QP, so the QpCore does not.
    QpCore(std::shared_ptr<PdCore> pd, std::shared_ptr<CqCore> send_cq, std::shared_ptr<CqCore> recv_cq,
           std::shared_ptr<SrqCore> srq, ibv_qp* qp, const Caps& caps, std::shared_ptr<void> owner = nullptr)
        : pd_(std::move(pd)),
          send_cq_(std::move(send_cq)),
          recv_cq_(std::move(recv_cq)),
          srq_(std::move(srq)),
          qp_(qp),
          caps_(caps),
          owner_(std::move(owner)),
          send(caps.max_send_wr),
          receive(caps.max_recv_wr) {
        send_cq_->reserve_one_more();
        recv_cq_->reserve_one_more();
        send_cq_->attach(this);
        if (recv_cq_ != send_cq_) recv_cq_->attach(this);
    }
    QpCore(const QpCore&) = delete;
    QpCore& operator=(const QpCore&) = delete;
    ~QpCore() {
        if (!owner_) (void)ibv_destroy_qp(qp_);
        owner_.reset(); // destroys an rdma_cm QP, while the CQs and PD are still alive
        send_cq_->detach(this);
        if (recv_cq_ != send_cq_) recv_cq_->detach(this);
    }

    [[nodiscard]] ibv_qp* qp() const noexcept { return qp_; }
    [[nodiscard]] std::uint32_t qp_num() const noexcept { return qp_->qp_num; }
    [[nodiscard]] const Caps& caps() const noexcept { return caps_; }
    [[nodiscard]] SrqCore* srq() const noexcept { return srq_.get(); }
    [[nodiscard]] CqCore* send_cq() const noexcept { return send_cq_.get(); }
    [[nodiscard]] CqCore* recv_cq() const noexcept { return recv_cq_.get(); }
    [[nodiscard]] const std::shared_ptr<PdCore>& pd() const noexcept { return pd_; }

private:
    std::shared_ptr<PdCore> pd_;
    std::shared_ptr<CqCore> send_cq_;
    std::shared_ptr<CqCore> recv_cq_;
    std::shared_ptr<SrqCore> srq_;
    ibv_qp* qp_;
    Caps caps_;
    std::shared_ptr<void> owner_;

public:
    WorkQueueState send;
    WorkQueueState receive;
    /// Asynchronous operations of this QP waiting for room (guarded by its CQ driver's mutex).
    std::size_t async_pending = 0;
};

/// Turns one work completion into a Completion, using the owning queue's slot
/// for the caller's context and the operation. Pure apart from the slot update.
inline Completion translate(const ibv_wc& wc, QpCore* qp) noexcept {
    Completion c;
    c.status = make_wc_error(wc.status);
    c.byte_length = wc.byte_len;
    c.qp_num = wc.qp_num;
    c.source_qp = wc.src_qp;
    c.vendor_error = wc.vendor_err;
    if ((wc.wc_flags & IBV_WC_WITH_IMM) != 0) c.immediate = ntohl(wc.imm_data);
    if (qp == nullptr) return c; // the QP was destroyed before its completions were polled
    WorkQueueState* queue = nullptr;
    switch (wr_id_kind(wc.wr_id)) {
        case QueueKind::send: queue = &qp->send; break;
        case QueueKind::receive: queue = &qp->receive; break;
        case QueueKind::shared_receive: queue = qp->srq() != nullptr ? &qp->srq()->receive : nullptr; break;
    }
    if (queue == nullptr) return c;
    WorkQueueState::Finished f = queue->complete(wr_id_slot(wc.wr_id));
    c.context = f.context;
    c.opcode = f.opcode;
    if (c.opcode == Opcode::receive && c.ok() && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
        c.opcode = Opcode::receive_with_imm;
    }
    return c;
}

inline int CqCore::poll(Completion* out, int max) noexcept {
    constexpr int batch = 32;
    ibv_wc wc[batch];
    int total = 0;
    while (total < max) {
        int want = std::min(batch, max - total);
        int got = ibv_poll_cq(cq_, want, wc);
        if (got < 0) return total > 0 ? total : got;
        if (got == 0) break;
        lock_.lock();
        QpCore* last = nullptr;
        for (int i = 0; i < got; ++i) {
            if (last == nullptr || last->qp_num() != wc[i].qp_num) {
                last = nullptr;
                for (QpCore* q : qps_) {
                    if (q->qp_num() == wc[i].qp_num) {
                        last = q;
                        break;
                    }
                }
            }
            out[total + i] = translate(wc[i], last);
        }
        lock_.unlock();
        total += got;
        if (got < want) break;
    }
    return total;
}

} // namespace gpuverbs::detail
