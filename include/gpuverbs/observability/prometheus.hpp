// Counters in the Prometheus text format: what a service's /metrics handler
// returns (gpuverbs has no HTTP server; serve the text with yours).
//
//   gpuverbs::PrometheusText metrics;
//   metrics.add("decode-0", qp);           // requests, completions, errors by status
//   metrics.add("kv", rails);              // per rail: bytes, busy time, failures, failovers, throughput
//   metrics.add_port(device);              // the device's own hardware counters (retries, sequence errors)
//   metrics.add("gpu0", proxy);            // a device queue's proxy: descriptors, doorbells, chains, stalls, rails
//   std::string body = metrics.text();     // text/plain; version=0.0.4
//
// Reading costs nothing on the data path: a queue pair's counts are the
// bookkeeping it keeps anyway (plus one compare per completion for the
// error counts), a group's are updated once per transfer.
#pragma once

#include "gpuverbs/error.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace gpuverbs {

// Only referred to here (their headers: verbs/device.hpp, verbs/queue_pair.hpp,
// transfers/rail_group.hpp): the text needs none of the transfer engine.
class Device;
class QueuePair;
class RailGroup;
class DeviceQueueProxy;

class PrometheusText {
public:
    /// A queue pair's counters (QueuePair::counters), labelled qp="name":
    /// gpuverbs_qp_requests_posted_total / _completed_total {queue="send"|"receive"},
    /// gpuverbs_qp_outstanding_requests, gpuverbs_qp_errors_total {status="RETRY_EXC_ERR", ...}.
    void add(std::string_view name, const QueuePair& qp);
    /// A rail group's health, labelled group="name", rail="k": bytes, busy
    /// seconds, transfers, failures, requests moved away and taken over,
    /// measured throughput, cooling.
    void add(std::string_view name, RailGroup& group);
    /// A device queue's proxy (device_queue/proxy.hpp), labelled queue="name":
    /// descriptors taken and completed, requests, doorbells, passes (idle,
    /// with the send queue full, with the ring full: producers waiting for
    /// credit), rail failures and descriptors posted again, whether the queue
    /// failed; histograms of chain lengths (descriptors per doorbell) and of
    /// post-to-completion seconds; per rail (peer, rail): up and active.
    void add(std::string_view name, const DeviceQueueProxy& proxy);
    /// The hardware counters the driver exports for `port` of `device`
    /// (/sys/class/infiniband/DEV/ports/N/hw_counters: on rxe and mlx5 the
    /// transport's retries, sequence errors, RNR NAKs…), labelled device,
    /// port, counter. None when the driver exports none (no such directory).
    /// Throws gpuverbs::Error for an empty Device, a port the device does not
    /// have (errc::port_not_found), or a directory that cannot be read (the
    /// errno); then nothing is added.
    void add_port(const Device& device, std::uint8_t port = 1);
    /// add_port without throwing: the failure in `ec`, nothing added.
    void add_port(const Device& device, std::uint8_t port, std::error_code& ec);
    /// … with its words in `diagnostics` (cleared on success).
    void add_port(const Device& device, std::uint8_t port, std::error_code& ec, Diagnostics& diagnostics);
    /// … from a sysfs-like directory (tests): none when it does not exist,
    /// the errno when it cannot be read (not a directory, not allowed).
    void add_port_from(std::string_view device_name, std::uint8_t port, const std::string& hw_counters_dir);
    void add_port_from(std::string_view device_name, std::uint8_t port, const std::string& hw_counters_dir,
                       std::error_code& ec);
    void add_port_from(std::string_view device_name, std::uint8_t port, const std::string& hw_counters_dir,
                       std::error_code& ec, Diagnostics& diagnostics);

    /// The exposition text (format 0.0.4): each family once, with HELP and TYPE.
    [[nodiscard]] std::string text() const;

private:
    bool add_port_impl(const Device& device, std::uint8_t port, detail::Status& status);
    bool add_port_from_impl(std::string_view device_name, std::uint8_t port, const std::string& dir,
                            detail::Status& status);
    struct Family {
        std::string help;
        std::string type;
        std::vector<std::string> samples;
    };
    void sample(const std::string& family, const char* type, const char* help, const std::string& labels, double value);
    /// A histogram from per-bucket (not cumulative) counts; `bounds` are the
    /// buckets' upper bounds but the last's (+Inf).
    void histogram(const std::string& family, const char* help, const std::string& labels,
                   const std::vector<std::string>& bounds, const std::uint64_t* counts, double sum);
    std::map<std::string, Family> families_;
};

/// The short name of a work completion status ("RETRY_EXC_ERR" for IBV_WC_RETRY_EXC_ERR).
std::string_view wc_status_name(unsigned status) noexcept;

} // namespace gpuverbs
