// Leases on advertised blocks, and the Prometheus text, for Python: the
// owner's BlockLeases, the reader's LeaseReader and the list that travels
// between them (gpuverbs/transfers/leases.hpp, connections/wire.hpp), and
// PrometheusText (observability/prometheus.hpp). Durations are seconds, as
// everywhere in the package; refusals raise the library's gpuverbs.Error with
// its words and code (a release by another reader: .code is Errc.lease_not_yours).
#include "binding.hpp"

#include <algorithm>
#include <chrono>
#include <memory>

namespace gpuverbs::python {

namespace {

py::dict lease_statistics_dict(const BlockLeasesStatistics& s) {
    py::dict d;
    d["granted"] = s.granted;
    d["released"] = s.released;
    d["revoked"] = s.revoked;
    d["expired"] = s.expired;
    d["refused_releases"] = s.refused_releases;
    d["unknown_releases"] = s.unknown_releases;
    return d;
}

const char* scope_name(LeaseScope s) {
    return s == LeaseScope::lease_regions ? "lease_regions" : "whole_regions";
}

/// BlockLeases is neither movable nor copyable (it has a lock): held by pointer.
struct Leases {
    std::unique_ptr<BlockLeases> table;
};

} // namespace

void bind_leases(py::module_& m) {
    record_fields(m, "BlockLeasesStatistics", lease_statistics_dict(BlockLeasesStatistics{}));

    py::class_<LeasedBlockList>(m, "LeasedBlockList",
                                "A block list under a lease: what the owner sends its reader (to_bytes), and the "
                                "lease id the reader's notification carries back.")
        .def_readonly("version", &LeasedBlockList::version, "Grows with every list the owner hands out.")
        .def_readonly("lease", &LeasedBlockList::lease, "The id to send back as the transfer's notify.")
        .def_property_readonly(
            "ttl", [](const LeasedBlockList& l) { return std::chrono::duration<double>(l.ttl).count(); },
            "Seconds the reader may use the blocks after receiving the list.")
        .def_property_readonly(
            "blocks", [](const LeasedBlockList& l) { return RemoteBlocks{l.blocks}; }, "The leased blocks.")
        .def_property_readonly(
            "scope", [](const LeasedBlockList& l) { return std::string(scope_name(l.scope)); },
            "\"whole_regions\" (the blocks' own regions) or \"lease_regions\" (regions of this lease alone).")
        .def(
            "to_bytes",
            [](const LeasedBlockList& l) {
                const std::vector<std::byte> w = wire::serialize(l);
                return py::bytes(reinterpret_cast<const char*>(w.data()), w.size());
            },
            "The wire form (LeasedBlockList.from_bytes reads it; so does C++'s wire::parse_leased_block_list).")
        .def_static(
            "from_bytes",
            [](const py::bytes& data) {
                const std::string_view v = data;
                std::error_code ec;
                Diagnostics why;
                LeasedBlockList l =
                    wire::parse_leased_block_list(std::as_bytes(std::span(v.data(), v.size())), ec, why);
                if (ec) raise_error(ec, "LeasedBlockList.from_bytes", why.detail());
                return l;
            },
            py::arg("data"))
        .def("__len__", [](const LeasedBlockList& l) { return l.blocks.size(); });

    py::class_<Leases, std::shared_ptr<Leases>>(
        m, "BlockLeases",
        "The owner's side of leases: which of its blocks are leased to which reader. Only the reader a lease was "
        "granted to can release it; the owner reuses a block only when claim() finds no live lease on it.")
        .def(py::init([](double ttl, double grace) {
                 BlockLeasesOptions o;
                 o.ttl = checked_milliseconds(ttl, "ttl");
                 o.grace = checked_milliseconds(grace, "grace");
                 std::error_code ec;
                 Diagnostics why;
                 auto out = std::make_shared<Leases>();
                 out->table.reset(new BlockLeases(BlockLeases::create(o, ec, why))); // not movable: made in place
                 if (ec) raise_error(ec, "BlockLeases", why.detail());
                 return out;
             }),
             py::arg("ttl") = seconds_of(BlockLeasesOptions{}.ttl),
             py::arg("grace") = seconds_of(BlockLeasesOptions{}.grace),
             "ttl: seconds each lease tells its reader; grace: how much longer the owner keeps an unreleased one.")
        .def(
            "grant",
            [](Leases& self, const RemoteBlocks& blocks, std::uint64_t reader, const ProtectionDomain* pd,
               unsigned access) {
                std::error_code ec;
                Diagnostics why;
                LeasedBlockList out;
                if (pd == nullptr) {
                    if (access != 0) throw py::value_error("grant: access is for lease regions: give pd as well");
                    out = self.table->grant(blocks.blocks, reader, ec, why);
                } else {
                    constexpr unsigned allowed =
                        static_cast<unsigned>(Access::local_write | Access::remote_write | Access::remote_read);
                    if (access == 0 || (access & ~allowed) != 0) {
                        throw py::value_error("grant: access " + std::to_string(access) +
                                              " for lease regions: give Access.remote_read (a reader that reads), "
                                              "or local_write | remote_write (one that writes)");
                    }
                    py::gil_scoped_release unlocked; // registrations
                    out = self.table->grant(blocks.blocks, reader, *pd, static_cast<Access>(access), ec, why);
                }
                if (ec) raise_error(ec, why.verb().empty() ? "BlockLeases.grant" : why.verb(), why.detail());
                return out;
            },
            py::arg("blocks"), py::arg("reader"), py::arg("pd") = nullptr, py::arg("access") = 0,
            "Leases `blocks` to `reader` (an int the owner can tell from where a notification arrives). With pd "
            "and access, each run of blocks is registered for this lease alone, so the reader reaches exactly "
            "those bytes, and nothing once the lease ends.")
        .def(
            "release",
            [](Leases& self, std::uint32_t lease, std::uint64_t reader) {
                if (const std::error_code ec = self.table->release(lease, reader)) {
                    raise_error(ec, "BlockLeases.release",
                                "lease " + std::to_string(lease) + " named by reader " + std::to_string(reader));
                }
            },
            py::arg("lease"), py::arg("reader"),
            "The reader's notification carried `lease`: its blocks are free of it. Raises gpuverbs.Error "
            "(Errc.lease_not_yours, counted) when the lease is another reader's, Errc.lease_unknown when none is "
            "live.")
        .def(
            "revoke", [](Leases& self, std::uint32_t lease) { return self.table->revoke(lease); }, py::arg("lease"),
            "The owner ends a lease itself; False when none such is live.")
        .def(
            "held",
            [](Leases& self, const RemoteBlocks& blocks) {
                return std::any_of(blocks.blocks.begin(), blocks.blocks.end(),
                                   [&](const RemoteBlock& b) { return self.table->held(b); });
            },
            py::arg("blocks"), "Whether a live lease holds any byte of any of `blocks`.")
        .def(
            "claim",
            [](Leases& self, const RemoteBlocks& blocks) {
                Diagnostics why;
                if (const std::error_code ec = self.table->claim(blocks.blocks, why)) {
                    raise_error(ec, "BlockLeases.claim", why.detail());
                }
            },
            py::arg("blocks"),
            "The owner is about to reuse `blocks`: raises gpuverbs.Error (Errc.blocks_leased, naming the first "
            "block held and its lease) when a live lease holds any of them.")
        .def_property_readonly(
            "active", [](Leases& self) { return self.table->active(); }, "Live leases.")
        .def(
            "expire", [](Leases& self) { return self.table->expire(); },
            "Drops the leases past their ttl and grace; their ids (readers that never released).")
        .def_property_readonly(
            "statistics", [](Leases& self) { return lease_statistics_dict(self.table->statistics()); },
            "granted, released, revoked, expired, refused_releases, unknown_releases.");

    // LeaseReader has a lock: held by pointer too.
    struct Reader {
        std::unique_ptr<LeaseReader> reader = std::make_unique<LeaseReader>();
    };
    py::class_<Reader, std::shared_ptr<Reader>>(
        m, "LeaseReader", "The reader's side: refuses a list not newer than one already accepted from its owner.")
        .def(py::init([] { return std::make_shared<Reader>(); }))
        .def(
            "accept",
            [](Reader& self, std::uint64_t owner, const LeasedBlockList& list) {
                Diagnostics why;
                if (const std::error_code ec = self.reader->accept(owner, list, why)) {
                    raise_error(ec, "LeaseReader.accept", why.detail());
                }
            },
            py::arg("owner"), py::arg("list"),
            "Raises gpuverbs.Error (Errc.stale_block_list, naming both versions) for a list not newer than the "
            "last accepted from `owner`.")
        .def_static(
            "deadline",
            [](const LeasedBlockList& list, double received) {
                return monotonic_seconds(LeaseReader::deadline(list, from_monotonic(received)));
            },
            py::arg("list"), py::arg("received"),
            "The latest a transfer under the lease may end, on time.monotonic()'s clock: received + ttl "
            "(give it to transfer(deadline=)).");

    struct Prometheus {
        PrometheusText text;
    };
    py::class_<Prometheus, std::shared_ptr<Prometheus>>(
        m, "PrometheusText",
        "Counters in Prometheus' text format (0.0.4): queue pairs' requests and errors, the ports' hardware "
        "counters.")
        .def(py::init([] { return std::make_shared<Prometheus>(); }))
        .def(
            "add_queue_pair",
            [](Prometheus& self, const std::string& name, const Qp& qp) { self.text.add(name, qp.get()); },
            py::arg("name"), py::arg("qp"), "A queue pair's counters, labelled qp=\"name\".")
        .def(
            "add_rail_group",
            [](Prometheus& self, const std::string& name, PyRailGroup& group) { self.text.add(name, *group.group); },
            py::arg("name"), py::arg("group"),
            "A rail group's health, labelled group=\"name\", rail=\"k\": bytes, busy seconds, transfers, "
            "failures, requests moved away and taken over, throughput, cooling.")
        .def(
            "add_device_queue_proxy",
            [](Prometheus& self, const std::string& name, PyDeviceQueueProxy& proxy) {
                if (proxy.busy.load()) {
                    throw std::runtime_error(
                        "PrometheusText.add_device_queue_proxy: another thread is in one of the "
                        "proxy's members: read it from the thread that drives it");
                }
                self.text.add(name, proxy.get());
            },
            py::arg("name"), py::arg("proxy"),
            "A device queue proxy's counters and rails, labelled queue=\"name\": descriptors, chains, requests, "
            "completed, skipped, rail failures, reposts, chain lengths and completion times.")
        .def(
            "add_port",
            [](Prometheus& self, const Device& device, std::uint8_t port) {
                std::error_code ec;
                Diagnostics why;
                self.text.add_port(device, port, ec, why);
                if (ec) raise_error(ec, why.verb().empty() ? "PrometheusText.add_port" : why.verb(), why.detail());
            },
            py::arg("device"), py::arg("port") = 1,
            "The hardware counters the driver exports for the port (none when it exports none).")
        .def(
            "text", [](const Prometheus& self) { return self.text.text(); },
            "The exposition text: each family once, with HELP and TYPE.");
}

} // namespace gpuverbs::python
