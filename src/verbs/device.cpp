#include "gpuverbs/verbs/device.hpp"

#include "gpuverbs/detail/verbs/device_core.hpp"
#include "gpuverbs/detail/verbs/rdma_presence.hpp"

#include <endian.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>

namespace gpuverbs {

std::string_view to_string(NodeType type) noexcept {
    switch (type) {
        case NodeType::unknown: return "unknown";
        case NodeType::ca: return "CA";
        case NodeType::switch_node: return "switch";
        case NodeType::router: return "router";
        case NodeType::rnic: return "RNIC";
        case NodeType::usnic: return "usNIC";
        case NodeType::usnic_udp: return "usNIC UDP";
        case NodeType::unspecified: return "unspecified";
    }
    return "unknown";
}

std::string_view to_string(Transport transport) noexcept {
    switch (transport) {
        case Transport::unknown: return "unknown";
        case Transport::infiniband: return "InfiniBand";
        case Transport::iwarp: return "iWARP";
        case Transport::usnic: return "usNIC";
        case Transport::usnic_udp: return "usNIC UDP";
        case Transport::unspecified: return "unspecified";
    }
    return "unknown";
}

std::string_view to_string(PortState state) noexcept {
    switch (state) {
        case PortState::nop: return "NOP";
        case PortState::down: return "DOWN";
        case PortState::init: return "INIT";
        case PortState::armed: return "ARMED";
        case PortState::active: return "ACTIVE";
        case PortState::active_defer: return "ACTIVE_DEFER";
    }
    return "unknown";
}

unsigned mtu_bytes(Mtu mtu) noexcept {
    auto v = static_cast<unsigned>(mtu);
    return v >= 1 && v <= 5 ? 128u << v : 0;
}

double port_speed_gbps(std::uint8_t active_width, std::uint8_t active_speed) noexcept {
    double lanes = 0;
    switch (active_width) {
        case 1: lanes = 1; break;
        case 2: lanes = 4; break;
        case 4: lanes = 8; break;
        case 8: lanes = 12; break;
        case 16: lanes = 2; break;
        default: return 0;
    }
    double lane_gbps = 0;
    switch (active_speed) {
        case 1: lane_gbps = 2.5; break;   // SDR
        case 2: lane_gbps = 5; break;     // DDR
        case 4:                           // QDR
        case 8: lane_gbps = 10; break;    // FDR10
        case 16: lane_gbps = 14; break;   // FDR
        case 32: lane_gbps = 25; break;   // EDR
        case 64: lane_gbps = 50; break;   // HDR
        case 128: lane_gbps = 100; break; // NDR
        default: return 0;
    }
    return lanes * lane_gbps;
}

std::string format_guid(std::uint64_t guid) {
    char text[20];
    std::snprintf(text, sizeof text, "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff,
                  unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff);
    return text;
}

namespace {

NodeType node_type_from(ibv_node_type t) noexcept {
    switch (t) {
        case IBV_NODE_CA: return NodeType::ca;
        case IBV_NODE_SWITCH: return NodeType::switch_node;
        case IBV_NODE_ROUTER: return NodeType::router;
        case IBV_NODE_RNIC: return NodeType::rnic;
        case IBV_NODE_USNIC: return NodeType::usnic;
        case IBV_NODE_USNIC_UDP: return NodeType::usnic_udp;
        case IBV_NODE_UNSPECIFIED: return NodeType::unspecified;
        default: return NodeType::unknown;
    }
}

Transport transport_from(ibv_transport_type t) noexcept {
    switch (t) {
        case IBV_TRANSPORT_IB: return Transport::infiniband;
        case IBV_TRANSPORT_IWARP: return Transport::iwarp;
        case IBV_TRANSPORT_USNIC: return Transport::usnic;
        case IBV_TRANSPORT_USNIC_UDP: return Transport::usnic_udp;
        case IBV_TRANSPORT_UNSPECIFIED: return Transport::unspecified;
        default: return Transport::unknown;
    }
}

LinkLayer link_layer_from(std::uint8_t l) noexcept {
    switch (l) {
        case IBV_LINK_LAYER_INFINIBAND: return LinkLayer::infiniband;
        case IBV_LINK_LAYER_ETHERNET: return LinkLayer::ethernet;
        default: return LinkLayer::unspecified;
    }
}

GidType gid_type_from(std::uint32_t t) noexcept {
    switch (t) {
        case IBV_GID_TYPE_ROCE_V1: return GidType::roce_v1;
        case IBV_GID_TYPE_ROCE_V2: return GidType::roce_v2;
        default: return GidType::ib;
    }
}

struct DeviceListDeleter {
    void operator()(ibv_device** list) const noexcept { ibv_free_device_list(list); }
};
using DeviceList = std::unique_ptr<ibv_device*[], DeviceListDeleter>;

// ibv_get_device_list, with "no kernel support" treated as an empty list.
DeviceList get_device_list(int& count, detail::Status& status) {
    count = 0;
    errno = 0;
    DeviceList list(ibv_get_device_list(&count));
    if (!list) {
        int err = errno;
        if (err == ENOSYS || err == 0) {
            count = 0;
        } else {
            status.fail_errno(err, "ibv_get_device_list", "cannot list RDMA devices");
        }
    }
    return list;
}

std::vector<DeviceInfo> list_impl(detail::Status& status) {
    int count = 0;
    DeviceList list = get_device_list(count, status);
    std::vector<DeviceInfo> out;
    for (int i = 0; list && i < count; ++i) {
        ibv_device* d = list[i];
        out.push_back(DeviceInfo{ibv_get_device_name(d), be64toh(ibv_get_device_guid(d)), node_type_from(d->node_type),
                                 transport_from(d->transport_type)});
    }
    return out;
}

const std::string& empty_name() {
    static const std::string empty;
    return empty;
}

bool fail_if_empty(const std::shared_ptr<detail::DeviceCore>& core, std::string_view verb, detail::Status& status) {
    if (core) return false;
    status.fail(errc::invalid_argument, verb, "the Device is empty (default-constructed or moved from)");
    return true;
}

} // namespace

std::vector<DeviceInfo> Device::list() {
    return detail::or_throw([&](detail::Status& status) { return list_impl(status); });
}

std::vector<DeviceInfo> Device::list(std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& status) { return list_impl(status); });
}

Device Device::open_impl(std::string_view name, bool first, detail::Status& status) {
    int count = 0;
    DeviceList list = get_device_list(count, status);
    if (!status.ok()) return {};
    if (count == 0) {
        status.fail(errc::no_rdma_device, "ibv_get_device_list", detail::explain_no_rdma_devices());
        return {};
    }
    ibv_device* found = nullptr;
    std::string present;
    for (int i = 0; i < count; ++i) {
        std::string_view n = ibv_get_device_name(list[i]);
        if (first || n == name) {
            found = list[i];
            break;
        }
        if (!present.empty()) present += ", ";
        present += n;
    }
    if (found == nullptr) {
        status.fail(errc::device_not_found, "ibv_open_device",
                    "no RDMA device named '" + std::string(name) + "'; devices present: " + present);
        return {};
    }
    std::string found_name = ibv_get_device_name(found);
    errno = 0;
    ibv_context* context = ibv_open_device(found);
    if (context == nullptr) {
        int err = errno != 0 ? errno : ENODEV;
        status.fail_errno(err, "ibv_open_device",
                          "cannot open " + found_name +
                              (err == EACCES || err == EPERM ? " (no permission on /dev/infiniband/uverbs*)" : ""));
        return {};
    }
    return Device(std::make_shared<detail::DeviceCore>(context, std::move(found_name)));
}

Device Device::open(std::string_view name) {
    return detail::or_throw([&](detail::Status& status) { return open_impl(name, false, status); });
}

Device Device::open(std::string_view name, std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& status) { return open_impl(name, false, status); });
}

Device Device::open(std::string_view name, std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& status) { return open_impl(name, false, status); });
}

Device Device::open_first() {
    return detail::or_throw([&](detail::Status& status) { return open_impl({}, true, status); });
}

Device Device::open_first(std::error_code& ec) {
    return detail::or_code(ec, [&](detail::Status& status) { return open_impl({}, true, status); });
}

Device Device::open_first(std::error_code& ec, Diagnostics& diagnostics) {
    return detail::or_code(ec, diagnostics, [&](detail::Status& status) { return open_impl({}, true, status); });
}

Device Device::from_native(ibv_context* context, bool owned) {
    if (context == nullptr) throw Error(errc::invalid_argument, "Device::from_native", "the context is null");
    if (owned)
        return Device(std::make_shared<detail::DeviceCore>(context, ibv_get_device_name(context->device), owned));
    // A context another library keeps (librdmacm's, one per device for the
    // process): one core per context, so that every connection on it shares its
    // DeviceEvents reader and the registry naming its objects in events.
    static std::mutex mutex;
    static std::map<ibv_context*, std::weak_ptr<detail::DeviceCore>> cores;
    std::lock_guard lock(mutex);
    std::weak_ptr<detail::DeviceCore>& known = cores[context];
    if (auto core = known.lock()) return Device(std::move(core));
    auto core = std::make_shared<detail::DeviceCore>(context, ibv_get_device_name(context->device), false);
    known = core;
    return Device(std::move(core));
}

const std::string& Device::name() const noexcept {
    return core_ ? core_->name() : empty_name();
}

ibv_context* Device::native_handle() const noexcept {
    return core_ ? core_->context() : nullptr;
}

DeviceAttributes Device::query_impl(detail::Status& status) const {
    DeviceAttributes a;
    if (fail_if_empty(core_, "ibv_query_device", status)) return a;
    if (int rc = ibv_query_device(core_->context(), &a.native); rc != 0) {
        status.fail_errno(rc, "ibv_query_device", "cannot query " + name());
        return a;
    }
    const ibv_device_attr& n = a.native;
    a.firmware_version = n.fw_ver;
    a.node_guid = be64toh(n.node_guid);
    a.vendor_id = n.vendor_id;
    a.vendor_part_id = n.vendor_part_id;
    a.port_count = n.phys_port_cnt;
    a.max_mr_size = n.max_mr_size;
    a.max_qp = n.max_qp;
    a.max_qp_wr = n.max_qp_wr;
    a.max_sge = n.max_sge;
    a.max_cq = n.max_cq;
    a.max_cqe = n.max_cqe;
    a.max_mr = n.max_mr;
    a.max_pd = n.max_pd;
    a.max_qp_rd_atom = n.max_qp_rd_atom;
    a.max_qp_init_rd_atom = n.max_qp_init_rd_atom;
    a.atomics = n.atomic_cap != IBV_ATOMIC_NONE;
    return a;
}

DeviceAttributes Device::query() const {
    return detail::or_throw([&](detail::Status& status) { return query_impl(status); });
}

DeviceAttributes Device::query(std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& status) { return query_impl(status); });
}

PortAttributes Device::query_port_impl(std::uint8_t port, detail::Status& status) const {
    PortAttributes p;
    p.port = port;
    if (fail_if_empty(core_, "ibv_query_port", status)) return p;
    ibv_device_attr dev{};
    if (int rc = ibv_query_device(core_->context(), &dev); rc != 0) {
        status.fail_errno(rc, "ibv_query_device", "cannot query " + name());
        return p;
    }
    if (port == 0 || port > dev.phys_port_cnt) {
        status.fail(errc::port_not_found, "ibv_query_port",
                    name() + " has no port " + std::to_string(port) + " (ports are 1.." +
                        std::to_string(dev.phys_port_cnt) + ")");
        return p;
    }
    if (int rc = ibv_query_port(core_->context(), port, &p.native); rc != 0) {
        status.fail_errno(rc, "ibv_query_port", "cannot query " + name() + " port " + std::to_string(port));
        return p;
    }
    const ibv_port_attr& n = p.native;
    p.state = static_cast<PortState>(n.state);
    p.link_layer = link_layer_from(n.link_layer);
    p.max_mtu = static_cast<Mtu>(n.max_mtu);
    p.active_mtu = static_cast<Mtu>(n.active_mtu);
    p.lid = n.lid;
    p.speed_gbps = port_speed_gbps(n.active_width, n.active_speed);
    p.gid_table_length = n.gid_tbl_len;
    return p;
}

PortAttributes Device::query_port(std::uint8_t port) const {
    return detail::or_throw([&](detail::Status& status) { return query_port_impl(port, status); });
}

PortAttributes Device::query_port(std::uint8_t port, std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& status) { return query_port_impl(port, status); });
}

PortAttributes Device::query_port(std::uint8_t port, std::error_code& ec, Diagnostics& diagnostics) const {
    return detail::or_code(ec, diagnostics, [&](detail::Status& status) { return query_port_impl(port, status); });
}

std::vector<GidEntry> detail::read_gid_table(ibv_context* context, const std::string& device_name, std::uint8_t port,
                                             int gid_table_length, int port_count, Status& status) {
    std::vector<GidEntry> out;
    // ibv_query_gid_table fills entries for every port; size for all of them.
    std::vector<ibv_gid_entry> raw(static_cast<std::size_t>(gid_table_length) * static_cast<std::size_t>(port_count));
    ssize_t n = ibv_query_gid_table(context, raw.data(), raw.size(), 0);
    if (n < 0) {
        status.fail_errno(static_cast<int>(-n), "ibv_query_gid_table", "cannot read the GID table of " + device_name);
        return out;
    }
    for (ssize_t i = 0; i < n; ++i) {
        const ibv_gid_entry& e = raw[static_cast<std::size_t>(i)];
        if (e.port_num != port) continue;
        out.push_back(GidEntry{e.gid_index, static_cast<std::uint8_t>(e.port_num), Gid::from_native(e.gid),
                               gid_type_from(e.gid_type), e.ndev_ifindex});
    }
    std::sort(out.begin(), out.end(), [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
    return out;
}

std::vector<GidEntry> Device::gid_table_impl(std::uint8_t port, detail::Status& status) const {
    PortAttributes p = query_port_impl(port, status);
    if (!status.ok()) return {};
    ibv_device_attr dev{};
    (void)ibv_query_device(core_->context(), &dev);
    return detail::read_gid_table(core_->context(), name(), port, p.gid_table_length, dev.phys_port_cnt, status);
}

std::vector<GidEntry> Device::gid_table(std::uint8_t port) const {
    return detail::or_throw([&](detail::Status& status) { return gid_table_impl(port, status); });
}

std::vector<GidEntry> Device::gid_table(std::uint8_t port, std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& status) { return gid_table_impl(port, status); });
}

GidEntry Device::select_gid_impl(std::uint8_t port, const GidPreference& preference, detail::Status& status) const {
    PortAttributes p = query_port_impl(port, status);
    if (!status.ok()) return {};
    std::vector<GidEntry> table = gid_table_impl(port, status);
    if (!status.ok()) return {};
    if (auto chosen = gpuverbs::select_gid(table, p.link_layer, preference)) return *chosen;
    std::string have;
    for (const GidEntry& e : table) {
        if (!have.empty()) have += ", ";
        have += std::to_string(e.index) + "=" + e.gid.to_string() + " (" + std::string(to_string(e.type)) + ")";
    }
    std::string wanted = p.link_layer == LinkLayer::ethernet ? "RoCE GID" : "InfiniBand GID";
    if (preference.ipv4) {
        const auto& a = *preference.ipv4;
        wanted += " with address " + std::to_string(a[0]) + "." + std::to_string(a[1]) + "." + std::to_string(a[2]) +
                  "." + std::to_string(a[3]);
    }
    status.fail(
        errc::gid_not_found, "ibv_query_gid_table",
        name() + " port " + std::to_string(port) + " has no " + wanted +
            "; its GID table holds: " + (have.empty() ? "nothing" : have) +
            (p.link_layer == LinkLayer::ethernet ? " (RoCE GIDs appear once the interface has an IP address)" : ""));
    return {};
}

GidEntry Device::select_gid(std::uint8_t port, const GidPreference& preference) const {
    return detail::or_throw([&](detail::Status& status) { return select_gid_impl(port, preference, status); });
}

GidEntry Device::select_gid(std::uint8_t port, const GidPreference& preference, std::error_code& ec) const {
    return detail::or_code(ec, [&](detail::Status& status) { return select_gid_impl(port, preference, status); });
}

} // namespace gpuverbs
