// The doctor's report as text for people and as JSON for programs.
#include "gpuverbs/gpu/doctor.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace gpuverbs {
namespace {

std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\t': out += "\\t"; break;
            case '\r': out += "\\r"; break;
            default:
                if (static_cast<unsigned char>(c) < 0x20) {
                    char u[8];
                    std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
                    out += u;
                } else {
                    out += c;
                }
        }
    }
    return out + "\"";
}

const char* colour_of(CheckStatus s) {
    switch (s) {
        case CheckStatus::ok: return "\033[32m";
        case CheckStatus::warn: return "\033[33m";
        case CheckStatus::fail: return "\033[31m";
        default: return "\033[2m";
    }
}

std::string format_check(const DoctorCheck& c, bool colour) {
    std::string status = "[" + std::string(to_string(c.status)) + "]";
    status.resize(10, ' ');
    if (colour) status = colour_of(c.status) + status + "\033[0m";
    std::string out = "  " + status + c.id + ": " + c.found + "\n";
    if (!c.advice.empty()) out += "            -> " + c.advice + (c.doc.empty() ? "" : " (docs/" + c.doc + ")") + "\n";
    return out;
}

} // namespace

std::string format_report(const DoctorReport& report, bool colour) {
    std::string out;
    // Grouped by subject, in the order subjects first appear.
    std::vector<std::string> subjects;
    for (const auto& c : report.checks) {
        if (std::find(subjects.begin(), subjects.end(), c.subject) == subjects.end()) subjects.push_back(c.subject);
    }
    for (const auto& subject : subjects) {
        out += "\n" + subject + "\n";
        for (const auto& c : report.checks) {
            if (c.subject == subject) out += format_check(c, colour);
        }
    }
    if (!report.paths.empty()) {
        out += "\nPCIe distance, GPU to NIC (PIX nearest .. SYS farthest)\n";
        for (const auto& p : report.paths) {
            out += "  " + p.gpu + " - " + p.nic + ": " + (p.path ? std::string(to_string(*p.path)) : "n/a") + "\n";
        }
    }
    if (!report.conclusions.empty()) {
        out += "\nConclusions\n";
        for (const auto& c : report.conclusions) {
            out += "  GPU " + c.gpu + ": ";
            if (c.nic.empty()) {
                out += "no RDMA device";
            } else {
                out += "nearest NIC " + c.nic + (c.path ? " (" + std::string(to_string(*c.path)) + ")" : "");
            }
            out += c.method ? ", register_gpu_memory would use " + std::string(to_string(*c.method))
                            : ", no registration method works";
            if (!c.device_queue_why.empty()) out += "; a device queue would use " + c.device_queue_why;
            out += "\n";
        }
    }
    std::string worst(to_string(report.worst()));
    out += "\nworst result: " + (colour ? colour_of(report.worst()) + worst + "\033[0m" : worst) + "\n";
    return out;
}

std::string to_json(const DoctorReport& report) {
    std::string out =
        "{\n  \"schema\": \"gpuverbs-doctor/1\",\n  \"worst\": " + json_string(to_string(report.worst())) +
        ",\n  \"checks\": [";
    bool first = true;
    for (const auto& c : report.checks) {
        out += first ? "\n" : ",\n";
        first = false;
        out += "    {\"id\": " + json_string(c.id) + ", \"subject\": " + json_string(c.subject) +
               ", \"status\": " + json_string(to_string(c.status)) + ", \"found\": " + json_string(c.found) +
               ", \"advice\": " + json_string(c.advice) + ", \"doc\": " + json_string(c.doc) + "}";
    }
    out += "\n  ],\n  \"paths\": [";
    first = true;
    for (const auto& p : report.paths) {
        out += first ? "\n" : ",\n";
        first = false;
        out += "    {\"gpu\": " + json_string(p.gpu) + ", \"nic\": " + json_string(p.nic) +
               ", \"class\": " + (p.path ? json_string(to_string(*p.path)) : "null") + ", \"bridges\": [";
        for (std::size_t i = 0; i < p.bridges.size(); ++i) out += (i ? ", " : "") + json_string(p.bridges[i]);
        out += "]}";
    }
    out += "\n  ],\n  \"conclusions\": [";
    first = true;
    for (const auto& c : report.conclusions) {
        out += first ? "\n" : ",\n";
        first = false;
        out += "    {\"gpu\": " + json_string(c.gpu) + ", \"nic\": " + (c.nic.empty() ? "null" : json_string(c.nic)) +
               ", \"class\": " + (c.path ? json_string(to_string(*c.path)) : "null") + ", \"method\": " +
               (c.method ? json_string(c.method == Registration::dmabuf ? "dmabuf" : "peermem") : "null") +
               ", \"rejected\": [";
        for (std::size_t i = 0; i < c.rejected.size(); ++i) {
            out += std::string(i ? ", " : "") +
                   "{\"method\": " + json_string(c.rejected[i].method == Registration::dmabuf ? "dmabuf" : "peermem") +
                   ", \"reason\": " + json_string(c.rejected[i].reason) + "}";
        }
        out += "], \"nccl\": {\"NCCL_IB_HCA\": " + json_string(c.nccl_ib_hca) +
               ", \"NCCL_NET_GDR_LEVEL\": " + json_string(c.nccl_net_gdr_level) +
               "}, \"device_queue\": " + (c.device_queue.empty() ? "null" : json_string(c.device_queue)) +
               ", \"device_queue_why\": " + (c.device_queue_why.empty() ? "null" : json_string(c.device_queue_why)) +
               "}";
    }
    out += "\n  ]\n}\n";
    return out;
}

} // namespace gpuverbs
