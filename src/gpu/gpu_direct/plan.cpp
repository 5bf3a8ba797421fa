// The pure half of GPU registration: the decision, the policy, the texts and
// the arithmetic. No I/O here; tests/unit/gpu_direct_test.cpp covers it all.
#include "gpuverbs/detail/gpu/gpu_registration.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>

namespace gpuverbs {

std::string_view to_string(GpuRegistration policy) noexcept {
    switch (policy) {
        case GpuRegistration::automatic: return "auto";
        case GpuRegistration::dmabuf: return "dmabuf";
        case GpuRegistration::peermem: return "peermem";
    }
    return "?";
}

std::optional<GpuRegistration> parse_gpu_registration(std::string_view text) noexcept {
    if (text == "auto") return GpuRegistration::automatic;
    if (text == "dmabuf") return GpuRegistration::dmabuf;
    if (text == "peermem") return GpuRegistration::peermem;
    return std::nullopt;
}

namespace {

// The failed checks' reasons, each once, joined with ", and ".
std::string reasons_of(std::initializer_list<const Check*> checks) {
    std::vector<std::string> seen;
    std::string out;
    for (const Check* c : checks) {
        if (c->ok) continue;
        std::string why = c->reason.empty() ? std::string("unsupported (no reason given)") : c->reason;
        if (std::find(seen.begin(), seen.end(), why) != seen.end()) continue;
        if (!out.empty()) out += ", and ";
        out += why;
        seen.push_back(std::move(why));
    }
    return out;
}

} // namespace

GpuRegistrationPlan plan_gpu_registration(GpuRegistration policy, const GpuDirectProbes& p) {
    GpuRegistrationPlan plan;
    plan.policy = policy;
    auto consider = [&](Registration method, GpuRegistration only, std::initializer_list<const Check*> needs) {
        if (policy != GpuRegistration::automatic && policy != only) {
            plan.rejected.push_back({method, "not tried: the registration policy is " + std::string(to_string(policy)) +
                                                 " (GpuRegistration or " + gpu_registration_env + ")"});
            return;
        }
        std::string why = reasons_of(needs);
        if (why.empty()) {
            plan.order.push_back(method);
        } else {
            plan.rejected.push_back({method, std::move(why)});
        }
    };
    consider(Registration::dmabuf, GpuRegistration::dmabuf,
             {&p.gpu_direct_rdma, &p.memory, &p.gpu_dmabuf, &p.nic_dmabuf});
    consider(Registration::peermem, GpuRegistration::peermem, {&p.gpu_direct_rdma, &p.memory, &p.peermem});
    return plan;
}

std::string describe_rejections(const std::vector<Rejection>& rejected) {
    std::string out;
    for (const Rejection& r : rejected) {
        if (!out.empty()) out += "; ";
        out += to_string(r.method);
        out += ": ";
        out += r.reason;
    }
    return out;
}

GpuRegistrationError::GpuRegistrationError(std::string_view detail, std::vector<Rejection> rejections)
    : Error(make_error_code(errc::gpu_direct_unavailable), "register_gpu_memory", detail),
      rejections_(std::move(rejections)) {}

namespace detail {

GpuRegistration effective_policy(GpuRegistration policy, const char* env_value, Status& status) {
    if (policy != GpuRegistration::automatic || env_value == nullptr || *env_value == '\0') return policy;
    if (auto parsed = parse_gpu_registration(env_value)) return *parsed;
    status.fail(errc::invalid_argument, "register_gpu_memory",
                std::string(gpu_registration_env) + "='" + env_value +
                    "' is not a registration policy: use auto, dmabuf or peermem (or unset it)");
    return policy;
}

DmabufRange dmabuf_export_range(std::uint64_t address, std::uint64_t size, std::uint64_t page_size) noexcept {
    DmabufRange r;
    r.start = address / page_size * page_size;
    r.offset = address - r.start;
    std::uint64_t end = address + size;
    r.size = (end + page_size - 1) / page_size * page_size - r.start;
    return r;
}

std::uint64_t registered_iova(Registration method, std::uint64_t gpu_address, std::uint64_t mr_addr) noexcept {
    return method == Registration::dmabuf ? gpu_address : mr_addr;
}

std::optional<std::pair<int, int>> parse_kernel_release(std::string_view release) noexcept {
    int major = 0, minor = 0;
    const char* p = release.data();
    const char* end = p + release.size();
    auto r = std::from_chars(p, end, major);
    if (r.ec != std::errc{} || r.ptr == end || *r.ptr != '.') return std::nullopt;
    r = std::from_chars(r.ptr + 1, end, minor);
    if (r.ec != std::errc{}) return std::nullopt;
    return std::pair{major, minor};
}

Check nic_dmabuf_answer(std::string_view device, bool symbol_found, int probe_errno) {
    std::string nic = "the NIC " + std::string(device);
    if (!symbol_found) {
        return Check::no(
            "rdma-core on this machine has no ibv_reg_dmabuf_mr (libibverbs IBVERBS_1.12, rdma-core 34 "
            "or newer): update rdma-core");
    }
    switch (probe_errno) {
        case EBADF: // it looked at the (invalid) fd: the device takes dma-bufs
        case 0: return Check::yes();
        case EOPNOTSUPP:
            return Check::no(nic +
                             " does not support dma-buf memory regions (EOPNOTSUPP): its driver has no "
                             "dma-buf support (Soft-RoCE and older NIC drivers)");
        case EPROTONOSUPPORT:
            return Check::no(nic +
                             " does not support dma-buf memory regions (EPROTONOSUPPORT): the kernel's "
                             "RDMA stack or the NIC driver is too old");
        default:
            return Check::no("probing dma-buf support on " + std::string(device) +
                             " failed unexpectedly: " + errno_text(probe_errno));
    }
}

} // namespace detail
} // namespace gpuverbs
