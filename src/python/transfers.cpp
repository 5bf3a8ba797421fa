// Block-list transfers from Python: the lists are arrays of offsets and
// lengths (NumPy arrays, array.array, any buffer of integers: no Python loop
// over 10,000 blocks), the plan and the transfer are the C++ ones.
#include "binding.hpp"

#include <boost/asio/bind_cancellation_slot.hpp>

#include <cmath>
#include <cstring>

namespace gpuverbs::python {

namespace {

/// Integers from a buffer of 4- or 8-byte integers, a sequence, or one int
/// repeated `count` times (count 0: the int alone).
std::vector<std::uint64_t> integers(const py::handle& obj, const char* name, std::size_t count) {
    std::vector<std::uint64_t> out;
    auto check = [&](std::int64_t v) {
        if (v < 0) {
            throw py::value_error(std::string(name) + " must not hold negative values (got " + std::to_string(v) +
                                  " at index " + std::to_string(out.size()) + ")");
        }
        out.push_back(static_cast<std::uint64_t>(v));
    };
    if (py::isinstance<py::int_>(obj)) {
        const auto v = obj.cast<std::int64_t>();
        for (std::size_t i = 0; i < std::max<std::size_t>(count, 1); ++i) check(v);
        return out;
    }
    if (PyObject_CheckBuffer(obj.ptr()) != 0) {
        py::buffer_info info = py::reinterpret_borrow<py::buffer>(obj).request();
        if (info.ndim != 1) {
            throw py::value_error(std::string(name) + " must be one-dimensional (got " + std::to_string(info.ndim) +
                                  " dimensions)");
        }
        const char f = info.format.empty() ? '?' : info.format.back();
        const bool is_signed = f == 'b' || f == 'h' || f == 'i' || f == 'l' || f == 'q';
        const bool is_unsigned = f == 'B' || f == 'H' || f == 'I' || f == 'L' || f == 'Q';
        if (!is_signed && !is_unsigned) {
            throw py::type_error(std::string(name) + " must hold integers (its format is '" + info.format + "')");
        }
        out.reserve(static_cast<std::size_t>(info.size));
        const auto* base = static_cast<const char*>(info.ptr);
        for (py::ssize_t i = 0; i < info.size; ++i) {
            const char* p = base + i * info.strides[0]; // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
            std::int64_t v = 0;
            switch (info.itemsize) {
                case 1:
                    v = is_signed ? std::int64_t{*reinterpret_cast<const std::int8_t*>(p)}
                                  : std::int64_t{*reinterpret_cast<const std::uint8_t*>(p)};
                    break;
                case 2: {
                    std::int16_t s = 0;
                    std::memcpy(&s, p, 2);
                    v = is_signed ? s : static_cast<std::uint16_t>(s);
                    break;
                }
                case 4: {
                    std::int32_t s = 0;
                    std::memcpy(&s, p, 4);
                    v = is_signed ? s : static_cast<std::uint32_t>(s);
                    break;
                }
                case 8: {
                    std::uint64_t u = 0;
                    std::memcpy(&u, p, 8);
                    if (is_unsigned) {
                        out.push_back(u);
                        continue;
                    }
                    v = static_cast<std::int64_t>(u);
                    break;
                }
                default:
                    throw py::type_error(std::string(name) + " has items of " + std::to_string(info.itemsize) +
                                         " bytes");
            }
            check(v);
        }
    } else if (py::isinstance<py::sequence>(obj)) {
        for (const py::handle item : py::reinterpret_borrow<py::sequence>(obj)) check(item.cast<std::int64_t>());
    } else {
        throw py::type_error(std::string(name) + " must be an int, a sequence of ints or an array of integers, not " +
                             py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>());
    }
    if (count != 0 && out.size() != count) {
        throw py::value_error(std::string(name) + " has " + std::to_string(out.size()) + " values; the offsets have " +
                              std::to_string(count));
    }
    return out;
}

py::object uint64_array(const std::vector<std::uint64_t>& v) {
    return py::module_::import("array").attr("array")(
        "Q", py::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(std::uint64_t)));
}

/// Blocks of local regions (one region each; a list may mix regions).
struct LocalBlocks {
    std::vector<LocalBuffer> blocks;
    std::vector<std::shared_ptr<Region>> regions;
};

/// A plan and the regions its pieces lie in.
struct Plan {
    TransferPlan plan;
    std::vector<std::shared_ptr<Region>> regions;
};

LocalBlocks make_local(const std::shared_ptr<Region>& region, const py::handle& offsets, const py::handle& lengths) {
    LocalBlocks out;
    std::vector<std::uint64_t> at = integers(offsets, "offsets", 0);
    std::vector<std::uint64_t> n = integers(lengths, "lengths", at.size());
    out.blocks.reserve(at.size());
    for (std::size_t i = 0; i < at.size(); ++i) {
        if (n[i] > 0xffffffffULL) {
            throw py::value_error("lengths[" + std::to_string(i) + "] is " + std::to_string(n[i]) +
                                  " bytes: a block is at most 4 GiB - 1");
        }
        if (at[i] > region->length || n[i] > region->length - at[i]) {
            throw py::value_error("block " + std::to_string(i) + " [" + std::to_string(at[i]) + ", " +
                                  std::to_string(at[i] + n[i]) + ") is outside the region's " +
                                  std::to_string(region->length) + " bytes");
        }
        out.blocks.push_back(region->slice(at[i], n[i]));
    }
    out.regions.push_back(region);
    return out;
}

RemoteBlocks make_remote(const RemoteMemory& remote, const py::handle& offsets, const py::handle& lengths) {
    RemoteBlocks out;
    std::vector<std::uint64_t> at = integers(offsets, "offsets", 0);
    std::vector<std::uint64_t> n = integers(lengths, "lengths", at.size());
    out.blocks.reserve(at.size());
    for (std::size_t i = 0; i < at.size(); ++i) out.blocks.push_back({remote, at[i], n[i]});
    return out;
}

/// Block ids from any array of integers (or one int), each below 2^32.
std::vector<std::uint32_t> block_ids(const py::handle& obj, const char* name) {
    const std::vector<std::uint64_t> wide = integers(obj, name, 0);
    std::vector<std::uint32_t> ids(wide.size());
    for (std::size_t i = 0; i < wide.size(); ++i) {
        if (wide[i] > UINT32_MAX) {
            throw py::value_error(std::string(name) + "[" + std::to_string(i) + "] is " + std::to_string(wide[i]) +
                                  ": block ids are below 2^32");
        }
        ids[i] = static_cast<std::uint32_t>(wide[i]);
    }
    return ids;
}

/// A pool over Python regions: they (and the objects they borrowed) live as long as it.

/// A rail from Python: a QueuePair (the plan's keys), a TransferRail (a KvPool's rail), or None (missing).
TransferRail rail_from(const py::handle& r, std::shared_ptr<Qp>& qp, std::shared_ptr<Rail>& keyed) {
    if (r.is_none()) return TransferRail{};
    if (py::isinstance<Rail>(r)) {
        keyed = r.cast<std::shared_ptr<Rail>>();
        qp = keyed->qp;
        TransferRail t = keyed->keys;
        t.qp = &qp->get();
        return t;
    }
    if (py::isinstance<Qp>(r)) {
        qp = r.cast<std::shared_ptr<Qp>>();
        return TransferRail{&qp->get(), {}, {}};
    }
    throw py::type_error("a rail is a gpuverbs.QueuePair, a gpuverbs.TransferRail or None (missing for now)");
}

py::dict rail_health_dict(const RailHealth& h) {
    py::dict d;
    d["bytes_per_second"] = h.bytes_per_second;
    d["transfers"] = h.transfers;
    d["failures"] = h.failures;
    d["bytes"] = h.bytes;
    d["busy_seconds"] = std::chrono::duration<double>(h.busy).count();
    d["requests_moved_away"] = h.requests_moved_away;
    d["requests_taken_over"] = h.requests_taken_over;
    d["cooling"] = h.cooling;
    // time.monotonic()'s clock (steady_clock's on Linux); None when it never failed.
    d["failed_at"] = h.failed_at == std::chrono::steady_clock::time_point{}
                         ? py::object(py::none())
                         : py::object(py::float_(monotonic_seconds(h.failed_at)));
    d["last_error"] = h.last_error ? h.last_error.message() : std::string();
    d["last_failure"] = h.last_failure;
    d["last_cause"] = h.last_cause;
    return d;
}

/// The regions of `regions` as the pool takes them: each tensor's own registration.
std::vector<const MemoryRegion*> pool_regions(const std::vector<std::shared_ptr<Region>>& regions) {
    std::vector<const MemoryRegion*> mrs;
    mrs.reserve(regions.size());
    for (std::size_t t = 0; t < regions.size(); ++t) {
        const std::shared_ptr<Region>& r = regions[t];
        // The pool addresses blocks from each region's first byte, and
        // keeps the region (not a cache's entry) alive: a region the
        // cache served may start inside a larger registration.
        if (r && r->cached) {
            throw py::value_error("regions[" + std::to_string(t) +
                                  "] comes from a RegistrationCache: a KvPool needs each tensor's own "
                                  "registration (ProtectionDomain.register)");
        }
        mrs.push_back(r ? &r->mr() : nullptr);
    }
    return mrs;
}

TransferDirection direction_of(const std::string& d) {
    if (d == "write") return TransferDirection::write;
    if (d == "read") return TransferDirection::read;
    throw py::value_error("direction must be 'write' or 'read', not '" + d + "'");
}

std::string_view state_name(BlockState s) {
    switch (s) {
        case BlockState::landed: return "landed";
        case BlockState::not_posted: return "not_posted";
        case BlockState::uncertain: return "uncertain";
    }
    return "?";
}

py::list states_list(const std::vector<BlockState>& states) {
    py::list out;
    for (BlockState s : states) out.append(std::string(state_name(s)));
    return out;
}

py::dict rail_dict(const TransferReport::Rail& rail) {
    py::dict d;
    d["bytes"] = rail.bytes;
    d["error"] = rail.error ? rail.error.message() : std::string();
    d["failure"] = rail.failure;
    d["cause"] = rail.cause;
    d["taken_over"] = rail.taken_over;
    d["took_over"] = rail.took_over;
    d["busy_seconds"] = std::chrono::duration<double>(rail.busy).count();
    return d;
}

struct FinishTransfer {
    std::shared_ptr<Operation> op;
    void operator()(const boost::system::error_code& ec, TransferResult r) const noexcept {
        // What Python reads from the operation: the bytes, .report, and the failed blocks as the error's detail.
        op->bytes = r.bytes;
        // A device's status says what happened, the blocks where: both (a refusal's words say it all).
        const std::error_code code = static_cast<std::error_code>(ec);
        op->detail =
            code.category() == wc_category() ? code.message() + ": " + r.failed_blocks : std::move(r.failed_blocks);
        op->report = std::move(r.report);
        op->finish_noexcept(ec);
    }
};

std::shared_ptr<Operation> transfer(const py::object& rails, const std::shared_ptr<Plan>& plan,
                                    std::optional<std::int64_t> notify, bool failover, std::uint32_t doorbell_batch,
                                    std::optional<double> deadline, std::optional<double> timeout,
                                    std::optional<py::bytes> notify_message, double notification_timeout) {
    std::shared_ptr<PyRailGroup> group;
    std::vector<std::shared_ptr<Qp>> qps;
    std::vector<std::shared_ptr<Rail>> keyed; // per rail: a KvPool rail (its keys), or null (the plan's own)
    std::vector<TransferRail> bound;
    auto take = [&](const py::handle r) {
        if (r.is_none()) throw py::type_error("rails must hold gpuverbs.QueuePair or gpuverbs.TransferRail objects");
        qps.emplace_back();
        keyed.emplace_back();
        bound.push_back(rail_from(r, qps.back(), keyed.back()));
    };
    if (py::isinstance<PyRailGroup>(rails)) {
        group = rails.cast<std::shared_ptr<PyRailGroup>>(); // its own rails
    } else if (py::isinstance<Qp>(rails) || py::isinstance<Rail>(rails)) {
        take(rails);
    } else if (py::isinstance<py::sequence>(rails)) {
        for (const py::handle r : py::reinterpret_borrow<py::sequence>(rails)) take(r);
    } else {
        throw py::type_error(
            "rails must be a gpuverbs.QueuePair, a gpuverbs.TransferRail, a list of them, or a gpuverbs.RailGroup");
    }
    if (!group && qps.empty()) throw py::value_error("rails is empty: give at least one QueuePair");
    for (const auto& q : qps) {
        if (q->context != qps.front()->context) {
            throw py::value_error("rails: every rail's completion queue must be on the same gpuverbs.Context");
        }
    }
    if (notify && (*notify < 0 || *notify > 0xffffffffLL)) {
        throw py::value_error("notify must be a 32-bit unsigned value (got " + std::to_string(*notify) + ")");
    }
    if (deadline && timeout) throw py::value_error("give deadline or timeout, not both");
    if (timeout && !(*timeout >= 0)) throw py::value_error("timeout must be 0 or more seconds");
    if (deadline && !std::isfinite(*deadline)) throw py::value_error("deadline must be a time.monotonic() value");
    const std::shared_ptr<Context> context = group ? group->context : qps.front()->context;
    auto op = std::make_shared<Operation>(context, Operation::Kind::transfer, "async_transfer");
    if (group) {
        // The plan and the group (whose rails it holds), until the transfer ends.
        op->plan = std::make_shared<std::pair<std::shared_ptr<Plan>, std::shared_ptr<PyRailGroup>>>(plan, group);
    } else {
        op->plan = plan;
    }
    op->regions = plan->regions;
    TransferOptions options;
    options.doorbell_batch = doorbell_batch;
    if (notify) options.notify = static_cast<std::uint32_t>(*notify);
    options.failover = failover;
    options.notification_timeout = checked_milliseconds(notification_timeout, "notification_timeout");
    options.report_blocks = true; // Operation.report
    std::string message;          // copied by the transfer when it starts (in async_transfer, below)
    if (notify_message) {
        message = std::string(*notify_message);
        options.notify_message = std::as_bytes(std::span(message));
    }
    using Clock = std::chrono::steady_clock;
    if (deadline) options.deadline = from_monotonic(*deadline);
    if (timeout) {
        options.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(std::min(*timeout, 1e9)));
    }
    if (group) {
        async_transfer(*group->group, plan->plan, options,
                       boost::asio::bind_cancellation_slot(op->slot(), FinishTransfer{op}));
    } else {
        async_transfer(std::span<const TransferRail>(bound), plan->plan, options,
                       boost::asio::bind_cancellation_slot(op->slot(), FinishTransfer{op}));
    }
    return op;
}

/// A NotificationInbox on a Python queue pair: it holds the queue pair (and
/// so its CQ and context) while it lives.
struct Inbox {
    std::shared_ptr<Qp> qp;
    NotificationInbox inbox;
};

py::dict inbox_statistics_dict(const NotificationInbox::Statistics& s) {
    py::dict d;
    d["received"] = s.received;
    d["failed"] = s.failed;
    d["paused"] = s.paused;
    return d;
}

} // namespace

// One function per concern; bind_transfers calls them in the order a
// signature needs its classes (a class is named in a docstring only once bound).
namespace {

/// Notifications and their inbox; the records they report in.
void bind_notifications(py::module_& m) {
    record_fields(m, "TransferReport::Rail", rail_dict(TransferReport::Rail{}));
    record_fields(m, "NotificationInbox::Statistics", inbox_statistics_dict(NotificationInbox::Statistics{}));

    py::class_<Notification>(m, "Notification", "What a peer's notification said.")
        .def_property_readonly(
            "qp_num", [](const Notification& n) { return n.qp_num; },
            "The local queue pair it arrived on: which reader.")
        .def_property_readonly(
            "immediate", [](const Notification& n) { return n.immediate; },
            "The transfer's notify value (e.g. a lease id).")
        .def_property_readonly("size", [](const Notification& n) { return n.size; })
        .def_property_readonly(
            "bytes",
            [](const Notification& n) { return py::bytes(reinterpret_cast<const char*>(n.bytes.data()), n.size); },
            "The transfer's notify_message (size bytes).")
        .def("__repr__", [](const Notification& n) {
            return "Notification(qp_num=" + std::to_string(n.qp_num) +
                   ", immediate=" + (n.immediate ? std::to_string(*n.immediate) : std::string("None")) +
                   ", size=" + std::to_string(n.size) + ")";
        });

    py::class_<Inbox, std::shared_ptr<Inbox>>(
        m, "NotificationInbox",
        "Receives the notifications peers send on one queue pair (a read's owner learns the reader is done): "
        "slots of 64 bytes posted as receives and posted again as each is read. The queue pair's receive queue "
        "is the inbox's.")
        .def(py::init([](const std::shared_ptr<Qp>& qp, ProtectionDomain& pd, std::uint32_t slots) {
                 auto in = std::make_shared<Inbox>();
                 in->qp = qp;
                 in->inbox = NotificationInbox(qp->get(), pd, slots);
                 return in;
             }),
             py::arg("qp"), py::arg("pd"), py::arg("slots") = NotificationInbox::default_slots)
        .def(
            "poll", [](Inbox& in) { return in.inbox.poll(); },
            "The oldest unread Notification, or None; never blocks (on a polled Context, call progress() first).")
        .def(
            "wait",
            [](Inbox& in, double timeout) -> std::optional<Notification> {
                using Clock = std::chrono::steady_clock;
                const auto until =
                    Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
                for (;;) {
                    if (auto n = in.inbox.poll()) return n;
                    if (std::error_code ec = in.inbox.error()) {
                        raise_error(ec, "NotificationInbox.wait", "the inbox's queue pair failed");
                    }
                    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - Clock::now());
                    if (left.count() <= 0) return std::nullopt;
                    {
                        py::gil_scoped_release release;
                        (void)in.qp->context->run_one_for(std::min(left, std::chrono::microseconds(100000)));
                    }
                    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
                }
            },
            py::arg("timeout") = seconds_of(default_bootstrap_timeout),
            "Runs the context until a notification is unread (returned) or timeout seconds passed (None); raises "
            "the queue pair's failure.")
        .def_property_readonly("unread", [](const Inbox& in) { return in.inbox.unread(); })
        .def_property_readonly("statistics",
                               [](const Inbox& in) { return inbox_statistics_dict(in.inbox.statistics()); });
}

/// Block lists (ours and a peer's) and the plan made of two of them.
void bind_block_lists(py::module_& m) {
    py::class_<LocalBlocks>(m, "LocalBlocks", "Blocks of a registered region: offsets and lengths (arrays).")
        .def(py::init(&make_local), py::arg("region"), py::arg("offsets"), py::arg("lengths"),
             "offsets: an array (or sequence) of byte offsets into region; lengths: one per offset, or one int for "
             "all.")
        .def("__len__", [](const LocalBlocks& b) { return b.blocks.size(); });

    py::class_<RemoteBlocks>(m, "RemoteBlocks", "Blocks of a peer's memory: what it sends as its block list.")
        .def(py::init(&make_remote), py::arg("remote"), py::arg("offsets"), py::arg("lengths"))
        .def("__len__", [](const RemoteBlocks& b) { return b.blocks.size(); })
        .def_property_readonly("offsets",
                               [](const RemoteBlocks& b) {
                                   std::vector<std::uint64_t> v;
                                   v.reserve(b.blocks.size());
                                   for (const RemoteBlock& r : b.blocks) v.push_back(r.offset);
                                   return uint64_array(v);
                               })
        .def_property_readonly("lengths",
                               [](const RemoteBlocks& b) {
                                   std::vector<std::uint64_t> v;
                                   v.reserve(b.blocks.size());
                                   for (const RemoteBlock& r : b.blocks) v.push_back(r.length);
                                   return uint64_array(v);
                               })
        .def_property_readonly(
            "memories",
            [](const RemoteBlocks& b) {
                py::list out;
                for (const RemoteBlock& r : b.blocks) out.append(py::cast(r.memory));
                return out;
            },
            "Per block, the RemoteMemory its offset is in.")
        .def(
            "to_bytes",
            [](const RemoteBlocks& b) {
                std::vector<std::byte> w = wire::serialize(std::span<const RemoteBlock>(b.blocks));
                return py::bytes(reinterpret_cast<const char*>(w.data()), w.size());
            },
            "The wire form of the list (RemoteBlocks.from_bytes reads it; so does C++'s wire::parse_block_list).")
        .def_static(
            "from_bytes",
            [](const py::bytes& data) {
                std::string_view v = data;
                return RemoteBlocks{wire::parse_block_list(std::as_bytes(std::span(v.data(), v.size())))};
            },
            py::arg("data"));

    py::class_<Plan, std::shared_ptr<Plan>>(m, "TransferPlan",
                                            "Two block lists checked, cut to match and coalesced into requests.")
        .def(py::init(
                 [](const std::string& direction, const LocalBlocks& local, const RemoteBlocks& remote, const Qp& qp) {
                     auto p = std::make_shared<Plan>();
                     const TransferDirection d = direction_of(direction);
                     const QueuePairCapabilities caps = qp.get().capabilities();
                     py::gil_scoped_release release;
                     p->plan = TransferPlan(d, local.blocks, remote.blocks, caps);
                     p->regions = local.regions;
                     return p;
                 }),
             py::arg("direction"), py::arg("local"), py::arg("remote"), py::arg("qp"),
             "direction 'write' (local to remote) or 'read'; qp gives the limits (scatter/gather entries).")
        .def_property_readonly("requests", [](const Plan& p) { return p.plan.requests().size(); })
        .def_property_readonly("bytes", [](const Plan& p) { return p.plan.bytes(); })
        .def(
            "blocks_of", [](const Plan& p, std::size_t request) { return p.plan.blocks_of(request); },
            py::arg("request"));
}

/// KV-cache layouts and a peer's pool as loaded from its record.
void bind_kv_layouts(py::module_& m) {
    py::class_<KvLayout>(m, "KvLayout",
                         "Where block b of half h (K, V) of layer l lies in a KV cache's tensors: "
                         "l * layer_stride + h * half_stride + b * block_stride (layer_stride 0: a tensor per layer).")
        .def(py::init<>())
        .def_static("per_layer", &KvLayout::per_layer, py::arg("layers"), py::arg("blocks"), py::arg("block_bytes"),
                    py::arg("halves") = KvLayout{}.halves,
                    "A tensor per layer shaped [halves, blocks, block_size, heads, head_dim].")
        .def_static("blocks_first", &KvLayout::blocks_first, py::arg("layers"), py::arg("blocks"),
                    py::arg("block_bytes"), py::arg("halves") = KvLayout{}.halves,
                    "A tensor per layer shaped [blocks, halves, block_size, heads, head_dim].")
        .def_static("one_tensor", &KvLayout::one_tensor, py::arg("layers"), py::arg("blocks"), py::arg("block_bytes"),
                    py::arg("halves") = KvLayout{}.halves,
                    "One tensor shaped [layers, halves, blocks, block_size, heads, head_dim].")
        .def_readwrite("layers", &KvLayout::layers)
        .def_readwrite("blocks", &KvLayout::blocks)
        .def_readwrite("halves", &KvLayout::halves)
        .def_readwrite("block_bytes", &KvLayout::block_bytes)
        .def_readwrite("block_stride", &KvLayout::block_stride)
        .def_readwrite("half_stride", &KvLayout::half_stride)
        .def_readwrite("layer_stride", &KvLayout::layer_stride)
        .def_property_readonly("tensors", &KvLayout::tensors)
        .def_property_readonly("tensor_bytes", &KvLayout::tensor_bytes)
        .def("offset", &KvLayout::offset, py::arg("layer"), py::arg("half"), py::arg("block"))
        .def_property_readonly("problem", &KvLayout::problem, "'' for a usable layout, else what is wrong.")
        .def(
            "__eq__", [](const KvLayout& a, const KvLayout& b) { return a == b; }, py::arg("other"));

    py::class_<RemoteKvPool>(m, "RemoteKvPool", "A peer's KV pool, loaded from the bytes of its describe().")
        .def_static(
            "load",
            // A pointer, not std::optional<RemoteKvPool>: GCC 13 warns (maybe-uninitialized) inside
            // pybind11's optional caster of a class with vectors.
            [](const py::bytes& data, const RemoteKvPool* previous) {
                std::string_view v = data;
                return RemoteKvPool::load(std::as_bytes(std::span(v.data(), v.size())),
                                          previous != nullptr ? *previous : RemoteKvPool{});
            },
            py::arg("data"), py::arg("previous") = py::none(),
            "Checks the metadata and reads it; raises gpuverbs.Error naming what is wrong. previous: the record "
            "already loaded from this peer; one not newer is refused (Errc.stale_metadata).")
        .def_property_readonly("layout", [](const RemoteKvPool& p) { return p.layout(); })
        .def_property_readonly("pool_id", &RemoteKvPool::pool_id)
        .def_property_readonly("made_ns", &RemoteKvPool::made_ns)
        .def_property_readonly(
            "lease_ttl", [](const RemoteKvPool& p) { return static_cast<double>(p.lease_ttl().count()) / 1000.0; },
            "The lease terms the owner announced: seconds a reader may use blocks it is handed (0: none).")
        .def_property_readonly(
            "tensors",
            [](const RemoteKvPool& p) { return std::vector<RemoteMemory>(p.tensors().begin(), p.tensors().end()); },
            "Per tensor, the peer's RemoteMemory (on rail 0).")
        .def_property_readonly("rails", &RemoteKvPool::rails, "The rails (NICs) the peer registered its pool on.");
}

/// Rails and rail groups (health across transfers).
void bind_rails(py::module_& m) {
    py::class_<Rail, std::shared_ptr<Rail>>(m, "TransferRail",
                                            "A rail of a KvPool's transfer: a queue pair and that rail's keys.")
        .def_property_readonly("qp", [](const Rail& r) { return r.qp; });

    record_fields(m, "RailHealth", rail_health_dict(RailHealth{}));
    py::class_<PyRailGroup, std::shared_ptr<PyRailGroup>>(
        m, "RailGroup",
        "Rails that transfers share over time: striped by measured throughput, a failed rail left out until its "
        "cooldown has passed, replace() for a reconnected one. Give it to transfer() as its rails.")
        .def(py::init([](const py::sequence& rails, double cooldown, double smoothing, std::uint64_t min_measured_bytes,
                         bool stripe_by_health) {
                 auto g = std::make_shared<PyRailGroup>();
                 std::vector<TransferRail> bound;
                 for (const py::handle r : rails) {
                     g->qps.emplace_back();
                     g->keyed.emplace_back();
                     bound.push_back(rail_from(r, g->qps.back(), g->keyed.back()));
                     if (g->qps.back()) {
                         if (g->context && g->qps.back()->context != g->context) {
                             throw py::value_error(
                                 "rails: every rail's completion queue must be on the same gpuverbs.Context");
                         }
                         g->context = g->qps.back()->context;
                     }
                 }
                 if (!g->context) throw py::value_error("rails: give at least one gpuverbs.QueuePair");
                 RailGroupOptions o;
                 o.cooldown = checked_milliseconds(cooldown, "cooldown");
                 o.smoothing = smoothing;
                 o.min_measured_bytes = min_measured_bytes;
                 o.stripe_by_health = stripe_by_health;
                 std::error_code ec;
                 Diagnostics why;
                 g->group.reset(new RailGroup(RailGroup::create(std::move(bound), o, ec, why))); // not movable
                 if (ec) raise_error(ec, "RailGroup", why.detail());
                 return g;
             }),
             py::arg("rails"), py::kw_only(), py::arg("cooldown") = seconds_of(RailGroupOptions{}.cooldown),
             py::arg("smoothing") = RailGroupOptions{}.smoothing,
             py::arg("min_measured_bytes") = RailGroupOptions{}.min_measured_bytes,
             py::arg("stripe_by_health") = RailGroupOptions{}.stripe_by_health,
             "rails: QueuePairs, KvPool TransferRails, or None for one missing for now (replace() it later).")
        .def("__len__", [](const PyRailGroup& g) { return g.group->size(); })
        .def(
            "health",
            [](const PyRailGroup& g, std::size_t k) {
                if (k >= g.group->size()) {
                    throw py::index_error("rail " + std::to_string(k) + ": the group has " +
                                          std::to_string(g.group->size()));
                }
                return rail_health_dict(g.group->health(k));
            },
            py::arg("k"),
            "What rail k did: bytes_per_second, transfers, failures, bytes, busy_seconds, requests_moved_away, "
            "requests_taken_over, cooling, failed_at (time.monotonic(), or None), last_error, last_failure, "
            "last_cause.")
        .def(
            "replace",
            [](PyRailGroup& g, std::size_t k, const py::handle& rail) {
                if (k >= g.group->size()) {
                    throw py::index_error("rail " + std::to_string(k) + ": the group has " +
                                          std::to_string(g.group->size()));
                }
                std::shared_ptr<Qp> qp;
                std::shared_ptr<Rail> keyed;
                TransferRail r = rail_from(rail, qp, keyed);
                if (!qp) throw py::value_error("replace: give the rail's new QueuePair (or TransferRail)");
                if (qp->context != g.context) {
                    throw py::value_error("replace: the new rail's completion queue is on another gpuverbs.Context");
                }
                g.group->replace(k, std::move(r));
                // The old queue pair is let go (unless Python still holds it): a transfer still using it fails over.
                g.qps[k] = std::move(qp);
                g.keyed[k] = std::move(keyed);
            },
            py::arg("k"), py::arg("rail"),
            "Rail k is now this queue pair (reconnected after a failure): it takes part in the next transfer.");
}

/// Our KV pool: tensors under a layout, plans by block id.
void bind_kv_pools(py::module_& m) {
    py::class_<PyKvPool, std::shared_ptr<PyKvPool>>(
        m, "KvPool", "A KV cache over registered regions (one per tensor, in layer order), named by block ids.")
        .def(py::init([](const KvLayout& layout, const std::vector<std::shared_ptr<Region>>& regions) {
                 auto p = std::make_shared<PyKvPool>();
                 p->regions = regions;
                 p->pool = KvPool(layout, pool_regions(regions));
                 return p;
             }),
             py::arg("layout"), py::arg("regions"))
        .def(
            "add_rail",
            [](PyKvPool& p, const std::vector<std::shared_ptr<Region>>& regions) {
                const std::size_t k = p.pool.add_rail(pool_regions(regions));
                p.regions.insert(p.regions.end(), regions.begin(), regions.end());
                return k;
            },
            py::arg("regions"),
            "Another rail (NIC): the same tensors registered in that NIC's protection domain, in layer order. "
            "Returns the rail's index; describe() then carries its keys.")
        .def_property_readonly("rails", [](const PyKvPool& p) { return p.pool.rails(); })
        .def(
            "remote_blocks",
            [](const PyKvPool& p, const py::handle& ids,
               std::optional<std::pair<std::uint32_t, std::uint32_t>> layers) {
                const std::vector<std::uint32_t> v = block_ids(ids, "ids");
                LayerRange range;
                if (layers) range = LayerRange{layers->first, layers->second};
                return RemoteBlocks{p.pool.remote_blocks(v, range)};
            },
            py::arg("ids"), py::arg("layers") = py::none(),
            "Our blocks `ids` (both halves of each layer) as a peer addresses them: what BlockLeases.grant leases "
            "to the reader of a request's blocks.")
        .def(
            "rail",
            [](const std::shared_ptr<PyKvPool>& p, std::size_t index, const std::shared_ptr<Qp>& qp,
               const RemoteKvPool& remote) {
                auto out = std::make_shared<Rail>();
                out->qp = qp;
                out->pool = p;
                out->keys = p->pool.rail(index, qp->get(), remote);
                out->keys.qp = nullptr; // bound by transfer(), which checks the queue pair is still open
                return out;
            },
            py::arg("index"), py::arg("qp"), py::arg("remote"),
            "Rail `index` of a transfer this pool planned: `qp` (on that rail's NIC) with our and the peer's keys "
            "of that rail. Give a list of them to transfer().")
        .def_property_readonly("layout", [](const PyKvPool& p) { return p.pool.layout(); })
        .def_property_readonly("pool_id", [](const PyKvPool& p) { return p.pool.pool_id(); })
        .def(
            "describe",
            [](const PyKvPool& p, double lease_ttl) {
                if (!(lease_ttl >= 0) || lease_ttl > 4e6) throw py::value_error("lease_ttl must be 0 to 4e6 seconds");
                const std::vector<std::byte> b =
                    p.pool.describe(std::chrono::milliseconds(static_cast<std::int64_t>(lease_ttl * 1000.0)));
                return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
            },
            py::arg("lease_ttl") = 0.0,
            "The metadata a peer loads (RemoteKvPool.load): carry it over the engine's own channel. lease_ttl: "
            "the seconds a reader may use blocks it is handed, announced to it.")
        .def_property_readonly("made_ns", [](const PyKvPool& p) { return p.pool.made_ns(); })
        .def(
            "plan",
            [](const PyKvPool& p, const std::string& direction, const py::handle& local_ids, const RemoteKvPool& remote,
               const py::handle& remote_ids, const Qp& qp,
               std::optional<std::pair<std::uint32_t, std::uint32_t>> layers) {
                const std::vector<std::uint32_t> ours = block_ids(local_ids, "local_ids");
                const std::vector<std::uint32_t> theirs = block_ids(remote_ids, "remote_ids");
                const TransferDirection d = direction_of(direction);
                const TransferLimits limits{qp.get().capabilities().max_send_sge};
                LayerRange range;
                if (layers) range = LayerRange{layers->first, layers->second};
                auto plan = std::make_shared<Plan>();
                // Under the GIL: a region's close() on another thread must not run meanwhile.
                plan->plan = p.pool.plan(d, ours, remote, theirs, range, limits);
                plan->regions = p.regions;
                return plan;
            },
            py::arg("direction"), py::arg("local_ids"), py::arg("remote"), py::arg("remote_ids"), py::arg("qp"),
            py::arg("layers") = py::none(),
            "The TransferPlan moving our blocks local_ids[i] and the peer's remote_ids[i] (any integer arrays) for "
            "both halves of each layer: 'write' ours to theirs, 'read' theirs to ours; layers=(first, count).");
}

/// The transfer itself, its report, and the operation that awaits it.
void bind_transfer_call(py::module_& m) {
    py::class_<TransferReport>(m, "TransferReport", "Which blocks landed, which never moved, which may have.")
        .def_readonly("landed", &TransferReport::landed)
        .def_readonly("not_posted", &TransferReport::not_posted)
        .def_readonly("uncertain", &TransferReport::uncertain)
        .def_property_readonly(
            "requests", [](const TransferReport& r) { return states_list(r.requests); },
            "Per request of the plan: 'landed', 'not_posted' or 'uncertain'.")
        .def_property_readonly(
            "remote_blocks", [](const TransferReport& r) { return states_list(r.remote_blocks); },
            "Per remote block, in the list's order: 'landed', 'not_posted' or 'uncertain'.")
        .def_property_readonly(
            "rails",
            [](const TransferReport& r) {
                py::list out;
                for (const TransferReport::Rail& rail : r.rails) out.append(rail_dict(rail));
                return out;
            },
            "Per rail, a dict: bytes, error, failure, cause (one word: port_down, stalled, ...), taken_over, "
            "took_over, "
            "busy_seconds.");

    // Here, after TransferReport, so that its signature names the class.
    py::class_<Operation, std::shared_ptr<Operation>>(m.attr("Operation"))
        .def_property_readonly(
            "report", [](const Operation& op) { return op.report; },
            "A transfer's TransferReport (filled when it completes).");

    m.def("transfer", &transfer, py::arg("rails"), py::arg("plan"), py::kw_only(), py::arg("notify") = py::none(),
          py::arg("failover") = TransferOptions{}.failover,
          py::arg("doorbell_batch") = TransferOptions{}.doorbell_batch, py::arg("deadline") = py::none(),
          py::arg("timeout") = py::none(), py::arg("notify_message") = py::none(),
          py::arg("notification_timeout") = seconds_of(TransferOptions{}.notification_timeout),
          "Moves every block of plan over rails (a QueuePair or a list: striped, failing over) in one operation "
          "ending, with notify, in a zero-byte write with that immediate at the peer (with notify_message, up to 64 "
          "bytes, a send carrying them: a NotificationInbox receives it). deadline (a "
          "time.monotonic() value) or timeout (seconds from now): nothing is posted after it, and the transfer "
          "ends with gpuverbs.Error (ETIMEDOUT) once the device is done with what it took; if it comes while the "
          "notification waits for the peer's receive, the notification's queue pair is moved to error and the "
          "transfer ends at once. notification_timeout (seconds; 0: none): the same for a notification the peer "
          "does not take in that time, whatever rnr_retry_count is. Await it, wait() or poll(): bytes moved; "
          ".report says what landed.");
}

} // namespace

void bind_transfers(py::module_& m) {
    bind_notifications(m);
    bind_block_lists(m);
    bind_kv_layouts(m);
    bind_rails(m);
    bind_kv_pools(m);
    bind_transfer_call(m);
}

} // namespace gpuverbs::python
