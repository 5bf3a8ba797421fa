// PrometheusText (observability/prometheus.hpp).
#include "gpuverbs/observability/prometheus.hpp"

#include "gpuverbs/device_queue/proxy.hpp"
#include "gpuverbs/transfers/rail_group.hpp"
#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include <infiniband/verbs.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace gpuverbs {

namespace {

/// The length of the well-formed UTF-8 sequence at the start of `v` (1 to
/// 4), or 0 when it is not one (a stray continuation byte, a truncated or
/// overlong sequence, a surrogate, a code point above U+10FFFF).
std::size_t utf8_sequence(std::string_view v) {
    const auto b = [&](std::size_t i) { return static_cast<unsigned char>(v[i]); };
    const unsigned char c = b(0);
    if (c < 0x80) return 1;
    std::size_t n = 0;
    unsigned char low = 0x80, high = 0xbf; // the second byte's range
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) low = 0xa0;  // not overlong
        if (c == 0xed) high = 0x9f; // not a surrogate
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) low = 0x90;  // not overlong
        if (c == 0xf4) high = 0x8f; // not above U+10FFFF
    } else {
        return 0;
    }
    if (v.size() < n || b(1) < low || b(1) > high) return 0;
    for (std::size_t i = 2; i < n; ++i) {
        if (b(i) < 0x80 || b(i) > 0xbf) return 0;
    }
    return n;
}

/// A label value as the format wants it: backslash, double quote and newline
/// escaped, and every byte that is not part of well-formed UTF-8 replaced by
/// U+FFFD (a scraper refuses the whole page for one invalid byte).
std::string escaped(std::string_view v) {
    std::string out;
    out.reserve(v.size());
    while (!v.empty()) {
        const std::size_t n = utf8_sequence(v);
        if (n == 0) {
            out += "\xef\xbf\xbd"; // U+FFFD
            v.remove_prefix(1);
            continue;
        }
        const char c = v[0];
        if (c == '\\' || c == '"') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out.append(v.substr(0, n));
        }
        v.remove_prefix(n);
    }
    return out;
}

std::string label(std::string_view key, std::string_view value) {
    return std::string(key) + "=\"" + escaped(value) + "\"";
}

std::string number(double v) {
    if (std::isnan(v)) return "NaN";
    std::array<char, 64> buffer{};
    // Integers exactly (counters), others with enough digits to round-trip.
    if (v == std::floor(v) && std::fabs(v) < 9.0e15) {
        std::snprintf(buffer.data(), buffer.size(), "%.0f", v);
    } else {
        std::snprintf(buffer.data(), buffer.size(), "%.17g", v);
    }
    return buffer.data();
}

} // namespace

std::string_view wc_status_name(unsigned status) noexcept {
    static constexpr std::array<std::string_view, 24> names{"SUCCESS",
                                                            "LOC_LEN_ERR",
                                                            "LOC_QP_OP_ERR",
                                                            "LOC_EEC_OP_ERR",
                                                            "LOC_PROT_ERR",
                                                            "WR_FLUSH_ERR",
                                                            "MW_BIND_ERR",
                                                            "BAD_RESP_ERR",
                                                            "LOC_ACCESS_ERR",
                                                            "REM_INV_REQ_ERR",
                                                            "REM_ACCESS_ERR",
                                                            "REM_OP_ERR",
                                                            "RETRY_EXC_ERR",
                                                            "RNR_RETRY_EXC_ERR",
                                                            "LOC_RDD_VIOL_ERR",
                                                            "REM_INV_RD_REQ_ERR",
                                                            "REM_ABORT_ERR",
                                                            "INV_EECN_ERR",
                                                            "INV_EEC_STATE_ERR",
                                                            "FATAL_ERR",
                                                            "RESP_TIMEOUT_ERR",
                                                            "GENERAL_ERR",
                                                            "TM_ERR",
                                                            "TM_RNDV_INCOMPLETE"};
    static_assert(IBV_WC_GENERAL_ERR == 21);
    return status < names.size() ? names[status] : std::string_view("OTHER");
}

void PrometheusText::sample(const std::string& family, const char* type, const char* help, const std::string& labels,
                            double value) {
    Family& f = families_[family];
    if (f.type.empty()) {
        f.type = type;
        f.help = help;
    }
    f.samples.push_back(family + "{" + labels + "} " + number(value));
}

void PrometheusText::add(std::string_view name, const QueuePair& qp) {
    const QueuePairCounters c = qp.counters();
    const std::string qp_label = label("qp", name);
    const char* posted = "Work requests posted to the queue pair (since it was last connected)";
    const char* completed = "Work requests known to be finished (a completion at or after them arrived)";
    sample("gpuverbs_qp_requests_posted_total", "counter", posted, qp_label + "," + label("queue", "send"),
           static_cast<double>(c.sends_posted));
    sample("gpuverbs_qp_requests_posted_total", "counter", posted, qp_label + "," + label("queue", "receive"),
           static_cast<double>(c.receives_posted));
    sample("gpuverbs_qp_requests_completed_total", "counter", completed, qp_label + "," + label("queue", "send"),
           static_cast<double>(c.sends_completed));
    sample("gpuverbs_qp_requests_completed_total", "counter", completed, qp_label + "," + label("queue", "receive"),
           static_cast<double>(c.receives_completed));
    const char* outstanding = "Work requests posted and not yet known to be finished";
    sample("gpuverbs_qp_outstanding_requests", "gauge", outstanding, qp_label + "," + label("queue", "send"),
           static_cast<double>(c.sends_posted - c.sends_completed));
    sample("gpuverbs_qp_outstanding_requests", "gauge", outstanding, qp_label + "," + label("queue", "receive"),
           static_cast<double>(c.receives_posted - c.receives_completed));
    for (std::size_t s = 1; s < c.errors.size(); ++s) {
        if (c.errors[s] == 0) continue;
        sample("gpuverbs_qp_errors_total", "counter", "Failed work completions by status",
               qp_label + "," + label("status", wc_status_name(static_cast<unsigned>(s))),
               static_cast<double>(c.errors[s]));
    }
}

void PrometheusText::add(std::string_view name, RailGroup& group) {
    for (std::size_t k = 0; k < group.size(); ++k) {
        const RailHealth h = group.health(k);
        const std::string labels = label("group", name) + "," + label("rail", std::to_string(k));
        sample("gpuverbs_rail_bytes_total", "counter", "Bytes the rail moved in transfers", labels,
               static_cast<double>(h.bytes));
        sample("gpuverbs_rail_busy_seconds_total", "counter",
               "Time the rail spent in transfers (per transfer, from its start to the rail's last request)", labels,
               std::chrono::duration<double>(h.busy).count());
        sample("gpuverbs_rail_transfers_total", "counter", "Transfers the rail carried part of", labels,
               static_cast<double>(h.transfers));
        sample("gpuverbs_rail_failures_total", "counter", "Transfers in which the rail failed", labels,
               static_cast<double>(h.failures));
        sample("gpuverbs_rail_requests_moved_away_total", "counter",
               "Requests of the rail that other rails posted again after it failed (failover)", labels,
               static_cast<double>(h.requests_moved_away));
        sample("gpuverbs_rail_requests_taken_over_total", "counter",
               "Requests of failed rails that this rail posted (failover)", labels,
               static_cast<double>(h.requests_taken_over));
        sample("gpuverbs_rail_throughput_bytes_per_second", "gauge",
               "Moving estimate of the rail's throughput while busy (0: not measured)", labels, h.bytes_per_second);
        sample("gpuverbs_rail_cooling", "gauge", "1 while the rail is left out of new transfers after a failure",
               labels, h.cooling ? 1 : 0);
        if (!h.last_cause.empty()) {
            sample("gpuverbs_rail_last_failure", "gauge",
                   "1 for the cause of the rail's last failure (port_down, stalled, notification_not_taken, "
                   "queue_pair_error, aborted, completion)",
                   labels + "," + label("cause", h.last_cause), 1);
        }
    }
}

void PrometheusText::histogram(const std::string& family, const char* help, const std::string& labels,
                               const std::vector<std::string>& bounds, const std::uint64_t* counts, double sum) {
    Family& f = families_[family];
    if (f.type.empty()) {
        f.type = "histogram";
        f.help = help;
    }
    std::uint64_t cumulative = 0;
    for (std::size_t k = 0; k <= bounds.size(); ++k) {
        cumulative += counts[k];
        const std::string le = k < bounds.size() ? bounds[k] : "+Inf";
        std::string line = family;
        line += "_bucket{";
        line += labels;
        line += ",";
        line += label("le", le);
        line += "} ";
        line += number(static_cast<double>(cumulative));
        f.samples.push_back(std::move(line));
    }
    f.samples.push_back(family + "_sum{" + labels + "} " + number(sum));
    f.samples.push_back(family + "_count{" + labels + "} " + number(static_cast<double>(cumulative)));
}

void PrometheusText::add(std::string_view name, const DeviceQueueProxy& proxy) {
    const DeviceQueueProxyCounters& c = proxy.counters();
    const std::string queue = label("queue", name);
    const auto counter = [&](const char* family, const char* help, std::uint64_t value) {
        sample(family, "counter", help, queue, static_cast<double>(value));
    };
    counter("gpuverbs_device_queue_descriptors_total", "Descriptors the proxy took from the ring", c.descriptors);
    counter("gpuverbs_device_queue_completed_total",
            "Descriptors whose requests completed (their credit returned to the producers)", c.completed);
    counter("gpuverbs_device_queue_requests_total", "Work requests the proxy posted (a put_signal is two)", c.requests);
    counter("gpuverbs_device_queue_doorbells_total", "Chains the proxy posted (one ibv_post_send each)", c.chains);
    counter("gpuverbs_device_queue_passes_total", "progress() calls", c.passes);
    counter("gpuverbs_device_queue_idle_passes_total", "progress() calls that found nothing to take or reap",
            c.idle_passes);
    counter("gpuverbs_device_queue_send_queue_full_total",
            "Passes that left descriptors in the ring because a send queue had no room", c.queue_full);
    counter("gpuverbs_device_queue_ring_full_passes_total",
            "Passes that found every slot taken and not completed: producers wait for credit", c.ring_full);
    counter("gpuverbs_device_queue_rail_failures_total",
            "Rails found failed (a path error, a refused post, the request timeout)", c.rail_failures);
    counter("gpuverbs_device_queue_reposted_total",
            "Descriptors posted again on another rail after theirs failed (failover)", c.reposted);
    counter("gpuverbs_device_queue_skipped_total",
            "Positions the proxy skipped: their producer gave up (a push that timed out or found the queue failed)",
            c.skipped);
    sample("gpuverbs_device_queue_failed", "gauge", "1 once the queue failed or closed (DeviceQueueProxy::failure)",
           queue, proxy.failure().empty() ? 0 : 1);
    histogram("gpuverbs_device_queue_chain_descriptors", "Descriptors per chain (per doorbell)", queue,
              {"1", "2", "4", "8", "16", "32", "64"}, c.chain_lengths.data(), static_cast<double>(c.chained));
    histogram("gpuverbs_device_queue_completion_seconds",
              "Time from a chain's post to its completion, as the proxy's passes see it", queue,
              {"1e-05", "0.0001", "0.001", "0.01", "0.1", "1"}, c.completion_times.data(), c.completion_seconds);
    for (const DeviceQueueRailState& r : proxy.rails()) {
        const std::string labels =
            queue + "," + label("peer", std::to_string(r.peer)) + "," + label("rail", std::to_string(r.rail));
        sample("gpuverbs_device_queue_rail_up", "gauge", "1 while the proxy has not found the rail failed", labels,
               r.failed ? 0 : 1);
        sample("gpuverbs_device_queue_rail_active", "gauge", "1 for the rail that carries the peer's new requests",
               labels, r.active ? 1 : 0);
    }
}

bool PrometheusText::add_port_impl(const Device& device, std::uint8_t port, detail::Status& status) {
    std::error_code ec;
    Diagnostics why;
    (void)device.query_port(port, ec, why); // an empty Device, a port it does not have
    if (ec) {
        status.fail(ec, why.verb(), why.detail());
        return false;
    }
    return add_port_from_impl(
        device.name(), port,
        "/sys/class/infiniband/" + device.name() + "/ports/" + std::to_string(port) + "/hw_counters", status);
}

bool PrometheusText::add_port_from_impl(std::string_view device_name, std::uint8_t port, const std::string& dir,
                                        detail::Status& status) {
    std::error_code ec;
    std::map<std::string, double> values; // in name order
    std::filesystem::directory_iterator it(dir, ec);
    if (ec == std::errc::no_such_file_or_directory) return true; // the driver exports none
    for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
        std::ifstream in(it->path());
        double v = 0;
        std::error_code type_ec;
        if (it->is_regular_file(type_ec) && (in >> v)) values[it->path().filename().string()] = v;
    }
    if (ec) {
        status.fail_errno(ec.value(), "PrometheusText::add_port", "cannot read the hardware counters in " + dir);
        return false;
    }
    for (const auto& [counter, v] : values) {
        sample(
            "gpuverbs_port_hw_counter", "untyped",
            "A hardware counter the RDMA driver exports for the port (sysfs hw_counters)",
            label("device", device_name) + "," + label("port", std::to_string(port)) + "," + label("counter", counter),
            v);
    }
    return true;
}

void PrometheusText::add_port(const Device& device, std::uint8_t port) {
    (void)detail::or_throw([&](detail::Status& s) { return add_port_impl(device, port, s); });
}

void PrometheusText::add_port(const Device& device, std::uint8_t port, std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return add_port_impl(device, port, s); });
}

void PrometheusText::add_port(const Device& device, std::uint8_t port, std::error_code& ec, Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics, [&](detail::Status& s) { return add_port_impl(device, port, s); });
}

void PrometheusText::add_port_from(std::string_view device_name, std::uint8_t port, const std::string& dir) {
    (void)detail::or_throw([&](detail::Status& s) { return add_port_from_impl(device_name, port, dir, s); });
}

void PrometheusText::add_port_from(std::string_view device_name, std::uint8_t port, const std::string& dir,
                                   std::error_code& ec) {
    (void)detail::or_code(ec, [&](detail::Status& s) { return add_port_from_impl(device_name, port, dir, s); });
}

void PrometheusText::add_port_from(std::string_view device_name, std::uint8_t port, const std::string& dir,
                                   std::error_code& ec, Diagnostics& diagnostics) {
    (void)detail::or_code(ec, diagnostics,
                          [&](detail::Status& s) { return add_port_from_impl(device_name, port, dir, s); });
}

std::string PrometheusText::text() const {
    std::string out;
    for (const auto& [name, f] : families_) {
        out += "# HELP " + name + " " + f.help + "\n";
        out += "# TYPE " + name + " " + f.type + "\n";
        for (const std::string& s : f.samples) out += s + "\n";
    }
    return out;
}

} // namespace gpuverbs
