// Device: an opened RDMA device (ibv_context), its attributes, ports and GIDs.
//
//   for (auto& info : gpuverbs::Device::list()) std::cout << info.name << '\n';
//   gpuverbs::Device dev = gpuverbs::Device::open("rxe0");
//   gpuverbs::PortAttributes port = dev.query_port(1);
//   gpuverbs::GidEntry gid = dev.select_gid(1);   // RoCE v2, IPv4-mapped if any
//
// Thread safety: a Device may be used from several threads at once (the
// underlying verbs calls are thread-safe); moving or destroying it is not
// concurrent-safe. Objects made from a Device (protection domains, queues)
// keep the device open, so destruction order never matters.
#pragma once

#include "gpuverbs/error.hpp"
#include "gpuverbs/verbs/gid.hpp"

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace gpuverbs::detail {
struct access; // detail/access.hpp: how the library reaches an object's core
} // namespace gpuverbs::detail

namespace gpuverbs {

/// What kind of node the device is (ibv_node_type).
enum class NodeType : std::uint8_t { unknown, ca, switch_node, router, rnic, usnic, usnic_udp, unspecified };
/// The transport the device speaks (ibv_transport_type).
enum class Transport : std::uint8_t { unknown, infiniband, iwarp, usnic, usnic_udp, unspecified };
/// Logical port state (ibv_port_state).
enum class PortState : std::uint8_t { nop, down, init, armed, active, active_defer };
/// Path MTU; the values are ibv_mtu's.
enum class Mtu : std::uint8_t { mtu_256 = 1, mtu_512, mtu_1024, mtu_2048, mtu_4096 };

std::string_view to_string(NodeType type) noexcept;
std::string_view to_string(Transport transport) noexcept;
std::string_view to_string(PortState state) noexcept;
/// The MTU in bytes (256 … 4096); 0 for a value outside ibv_mtu.
unsigned mtu_bytes(Mtu mtu) noexcept;
/// Link speed in Gb/s from ibv_port_attr's active_width and active_speed codes,
/// using the per-lane rates ibv_devinfo prints (SDR 2.5 … NDR 100, XDR 200);
/// 0 when either code is unknown. Pure function.
double port_speed_gbps(std::uint8_t active_width, std::uint8_t active_speed) noexcept;
/// A GUID (host byte order) in the usual "xxxx:xxxx:xxxx:xxxx" form.
std::string format_guid(std::uint64_t guid);

/// One entry of Device::list().
struct DeviceInfo {
    std::string name;            ///< e.g. "mlx5_0", "rxe0"
    std::uint64_t node_guid = 0; ///< host byte order
    NodeType node_type = NodeType::unknown;
    Transport transport = Transport::unknown;
};

/// The device attributes most programs look at, plus the full ibv_device_attr.
struct DeviceAttributes {
    std::string firmware_version;
    std::uint64_t node_guid = 0; ///< host byte order
    std::uint32_t vendor_id = 0;
    std::uint32_t vendor_part_id = 0;
    std::uint8_t port_count = 0;
    std::uint64_t max_mr_size = 0;
    int max_qp = 0;
    int max_qp_wr = 0; ///< work requests per queue
    int max_sge = 0;   ///< scatter/gather entries per work request
    int max_cq = 0;
    int max_cqe = 0; ///< entries per completion queue
    int max_mr = 0;
    int max_pd = 0;
    int max_qp_rd_atom = 0;      ///< RDMA reads/atomics a QP can have outstanding as target
    int max_qp_init_rd_atom = 0; ///< … and as initiator
    bool atomics = false;        ///< atomic_cap is not IBV_ATOMIC_NONE
    ibv_device_attr native{};
};

/// A port's state and link.
struct PortAttributes {
    std::uint8_t port = 0;
    PortState state = PortState::nop;
    LinkLayer link_layer = LinkLayer::unspecified;
    Mtu max_mtu = Mtu::mtu_256;
    Mtu active_mtu = Mtu::mtu_256;
    std::uint16_t lid = 0; ///< 0 on Ethernet; must be non-zero on InfiniBand
    double speed_gbps = 0; ///< width × lane rate, see port_speed_gbps
    int gid_table_length = 0;
    ibv_port_attr native{};
};

namespace detail {
/// The opened ibv_context; shared by a Device and everything made from it.
class DeviceCore;
/// The valid GID entries of `port`, in index order (ibv_query_gid_table);
/// `gid_table_length` and `port_count` size the query. Fails `status` with the errno.
std::vector<GidEntry> read_gid_table(ibv_context* context, const std::string& device_name, std::uint8_t port,
                                     int gid_table_length, int port_count, Status& status);
} // namespace detail

/// An opened RDMA device. Move-only; an empty (default or moved-from) Device
/// has no context and every query on it fails with errc::invalid_argument.
class Device {
public:
    Device() noexcept = default;
    Device(Device&&) noexcept = default;
    Device& operator=(Device&&) noexcept = default;
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;
    ~Device() = default;

    /// The RDMA devices on this machine; empty when there are none (also when
    /// the kernel has no RDMA support). Throws only on unexpected failures.
    static std::vector<DeviceInfo> list();
    static std::vector<DeviceInfo> list(std::error_code& ec);

    /// Opens the device called `name`. When none has that name the error
    /// (errc::device_not_found) lists the devices that exist.
    static Device open(std::string_view name);
    static Device open(std::string_view name, std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    static Device open(std::string_view name, std::error_code& ec, Diagnostics& diagnostics);
    /// Opens the first device ibv_get_device_list reports.
    static Device open_first();
    static Device open_first(std::error_code& ec);
    /// … with the explanation the exception would carry kept in `diagnostics`.
    static Device open_first(std::error_code& ec, Diagnostics& diagnostics);

    /// Wraps a context opened elsewhere; with `owned` false it is never closed
    /// here (e.g. librdmacm's contexts, which it keeps for the process).
    static Device from_native(ibv_context* context, bool owned);

    [[nodiscard]] const std::string& name() const noexcept;
    explicit operator bool() const noexcept { return core_ != nullptr; }

    [[nodiscard]] DeviceAttributes query() const;
    [[nodiscard]] DeviceAttributes query(std::error_code& ec) const;

    /// Port numbers start at 1.
    [[nodiscard]] PortAttributes query_port(std::uint8_t port) const;
    [[nodiscard]] PortAttributes query_port(std::uint8_t port, std::error_code& ec) const;
    /// … with the words of the failure in `diagnostics` (cleared on success).
    [[nodiscard]] PortAttributes query_port(std::uint8_t port, std::error_code& ec, Diagnostics& diagnostics) const;

    /// The valid entries of the port's GID table, in index order.
    [[nodiscard]] std::vector<GidEntry> gid_table(std::uint8_t port) const;
    [[nodiscard]] std::vector<GidEntry> gid_table(std::uint8_t port, std::error_code& ec) const;

    /// The GID a connection on this port should use (see gpuverbs::select_gid).
    /// Fails with errc::gid_not_found, saying what the table holds, when none fits.
    [[nodiscard]] GidEntry select_gid(std::uint8_t port, const GidPreference& preference = {}) const;
    [[nodiscard]] GidEntry select_gid(std::uint8_t port, const GidPreference& preference, std::error_code& ec) const;

    /// The raw context, for verbs gpuverbs does not wrap. Owned by the Device.
    [[nodiscard]] ibv_context* native_handle() const noexcept;

private:
    friend struct detail::access;
    explicit Device(std::shared_ptr<detail::DeviceCore> core) noexcept : core_(std::move(core)) {}
    static Device open_impl(std::string_view name, bool first, detail::Status& status);
    DeviceAttributes query_impl(detail::Status& status) const;
    PortAttributes query_port_impl(std::uint8_t port, detail::Status& status) const;
    std::vector<GidEntry> gid_table_impl(std::uint8_t port, detail::Status& status) const;
    GidEntry select_gid_impl(std::uint8_t port, const GidPreference& preference, detail::Status& status) const;

    std::shared_ptr<detail::DeviceCore> core_;
};

} // namespace gpuverbs
