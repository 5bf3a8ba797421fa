// A KV-cache hand-off side by side with the transport NIXL uses by default.
// Prefill (DEV1) writes `--ids` scattered blocks of every layer's K and V
// halves into decode's pool (DEV0) and tells decode which request it was;
// the clock stops when decode holds that notification. Written twice, in one
// process and one rig boot, the rounds alternating:
//   gpuverbs  KvPool::plan by id, one transfer ending with a 12-byte
//             notify_message, decode's NotificationInbox, progress() in a loop;
//   ucx       what NIXL's UCX backend does for a write: one ucp_put_nbx per
//             block and half (memory handles given, as NIXL registers its
//             descriptors), ucp_ep_flush_nbx, then ucp_am_send_nbx carrying
//             the request id; both workers progressed in the same loop.
// Both sides post one RDMA write per block (scattered ids leave nothing to
// coalesce), so the difference is the software around them. Every sampled
// byte is checked after each hand-off, outside the timed part. Run it in the
// rig with UCX_TLS=rc_v and UCX_UD_VERBS_ETH_DGID_CHECK=n (benchmarks/kv-ucx).
//
//   kv_ucx_bench [--layers 32] [--blocks 1024] [--ids 1000] [--block 512] [--rounds 5]
#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/io_context.hpp>

#include <ucp/api/ucp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace gv = gpuverbs;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
    std::fprintf(stderr, "kv_ucx_bench: %s\n", what.c_str());
    std::exit(1);
}
void check(ucs_status_t s, const char* what) {
    if (s != UCS_OK) die(std::string(what) + ": " + ucs_status_string(s));
}

std::vector<std::uint32_t> scattered(std::uint32_t blocks, std::uint32_t count, unsigned seed) {
    std::vector<std::uint32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0u);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    ids.resize(count);
    return ids;
}

/// One side's cache: a tensor per layer, in host memory.
struct Cache {
    std::vector<std::vector<std::byte>> tensors;
    Cache(const gv::KvLayout& layout) {
        for (std::uint32_t t = 0; t < layout.tensors(); ++t) tensors.emplace_back(layout.tensor_bytes());
    }
};

/// A UCX context and worker on one device ("rxe0:1").
struct UcxSide {
    ucp_context_h context = nullptr;
    ucp_worker_h worker = nullptr;
    std::vector<ucp_mem_h> memh;

    explicit UcxSide(const std::string& device) {
        ucp_config_t* config = nullptr;
        check(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read");
        check(ucp_config_modify(config, "NET_DEVICES", device.c_str()), "NET_DEVICES");
        ucp_params_t params{};
        params.field_mask = UCP_PARAM_FIELD_FEATURES;
        params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
        check(ucp_init(&params, config, &context), "ucp_init");
        ucp_config_release(config);
        ucp_worker_params_t wp{};
        wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
        wp.thread_mode = UCS_THREAD_MODE_SINGLE;
        check(ucp_worker_create(context, &wp, &worker), "ucp_worker_create");
    }
    void map(Cache& cache) {
        for (auto& t : cache.tensors) {
            ucp_mem_map_params_t mp{};
            mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
            mp.address = t.data();
            mp.length = t.size();
            ucp_mem_h h = nullptr;
            check(ucp_mem_map(context, &mp, &h), "ucp_mem_map");
            memh.push_back(h);
        }
    }
    UcxSide(const UcxSide&) = delete;
    UcxSide& operator=(const UcxSide&) = delete;
    ~UcxSide() {
        for (ucp_mem_h h : memh) ucp_mem_unmap(context, h);
        ucp_worker_destroy(worker);
        ucp_cleanup(context);
    }
};

/// Decode's side of a UCX notification: the request id its AM carried.
struct Inbox {
    std::string last;
    bool arrived = false;
};
ucs_status_t on_notification(void* arg, const void* header, std::size_t header_length, void*, std::size_t,
                             const ucp_am_recv_param_t*) {
    auto* inbox = static_cast<Inbox*>(arg);
    inbox->last.assign(static_cast<const char*>(header), header_length);
    inbox->arrived = true;
    return UCS_OK;
}

/// Waits for a request of UCX's (progressing both workers) and frees it.
void wait_ucx(ucs_status_ptr_t request, ucp_worker_h a, ucp_worker_h b, const char* what) {
    if (request == nullptr) return;
    if (UCS_PTR_IS_ERR(request)) die(std::string(what) + ": " + ucs_status_string(UCS_PTR_STATUS(request)));
    ucs_status_t s;
    while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS) {
        ucp_worker_progress(a);
        ucp_worker_progress(b);
    }
    ucp_request_free(request);
    check(s, what);
}

} // namespace

int main(int argc, char** argv) {
    std::uint32_t layers = 32, blocks = 1024, count = 1000, block = 512, rounds = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string key = argv[i];
        const auto v = static_cast<std::uint32_t>(std::strtoul(argv[i + 1], nullptr, 10));
        if (key == "--layers") layers = v;
        if (key == "--blocks") blocks = v;
        if (key == "--ids") count = v;
        if (key == "--block") block = v;
        if (key == "--rounds") rounds = v;
    }
    const char* d0 = std::getenv("GPUVERBS_TEST_DEV0"); // NOLINT(concurrency-mt-unsafe): one thread
    const char* d1 = std::getenv("GPUVERBS_TEST_DEV1"); // NOLINT(concurrency-mt-unsafe): one thread
    if (d0 == nullptr || d1 == nullptr || count > blocks || rounds == 0) {
        std::fprintf(stderr, "kv_ucx_bench: run it in the rig (GPUVERBS_TEST_DEV0/1), with --ids <= --blocks\n");
        return 2;
    }
    const gv::KvLayout layout = gv::KvLayout::per_layer(layers, blocks, block);
    Cache decode(layout), prefill(layout);
    for (std::size_t t = 0; t < prefill.tensors.size(); ++t) {
        for (std::size_t i = 0; i < prefill.tensors[t].size(); i += 64)
            prefill.tensors[t][i] = std::byte((i / 64 + t) % 251);
    }
    const std::vector<std::uint32_t> theirs_ids = scattered(blocks, count, 1), ours_ids = scattered(blocks, count, 2);
    auto verify = [&](const char* who) {
        std::size_t bad = 0;
        for (std::uint32_t l = 0; l < layers; ++l) {
            for (std::uint32_t h = 0; h < 2; ++h) {
                for (std::size_t k = 0; k < count; ++k) {
                    const std::size_t at = layout.offset(l, h, theirs_ids[k]), from = layout.offset(l, h, ours_ids[k]);
                    bad += std::memcmp(&decode.tensors[l][at], &prefill.tensors[l][from], block) != 0 ? 1 : 0;
                }
            }
        }
        if (bad != 0) die(std::to_string(bad) + " blocks wrong after " + who + "'s hand-off");
        for (auto& t : decode.tensors) std::fill(t.begin(), t.end(), std::byte{0xff});
    };

    // gpuverbs: prefill's queue pair on DEV1 writes, decode's on DEV0 takes the notification.
    boost::asio::io_context io(1);
    const gv::AsyncOptions polled{.mode = gv::CompletionMode::polled, .single_threaded = true};
    gv::Device dev0 = gv::Device::open(d0), dev1 = gv::Device::open(d1);
    gv::ProtectionDomain pd0(dev0), pd1(dev1);
    gv::CompletionQueue cq0(dev0, 4096, io.get_executor(), polled), cq1(dev1, 4096, io.get_executor(), polled);
    gv::QueuePairOptions o;
    o.max_send_sge = 4;
    o.max_send_wr = 512;
    gv::PreparedQueuePair a(pd0, cq0, cq0, o), b(pd1, cq1, cq1, o);
    const gv::Endpoint ea = a.endpoint(), eb = b.endpoint();
    gv::ConnectOptions grant;
    grant.remote_access = gv::Access::remote_write;
    gv::QueuePair qa = std::move(a).connect(eb, grant), qb = std::move(b).connect(ea);
    gv::NotificationInbox inbox(qa, pd0);
    auto regions = [&](const gv::ProtectionDomain& pd, Cache& c, gv::Access access) {
        std::vector<gv::MemoryRegion> out;
        for (auto& t : c.tensors) out.emplace_back(pd, t, access);
        return out;
    };
    const gv::KvPool decode_pool(layout, regions(pd0, decode, gv::Access::local_write | gv::Access::remote_write));
    const gv::KvPool prefill_pool(layout, regions(pd1, prefill, gv::Access::local_write));
    const gv::RemoteKvPool decode_remote = gv::RemoteKvPool::load(decode_pool.describe());
    const gv::TransferLimits limits{qb.capabilities().max_send_sge};

    char id[16];
    auto gpuverbs_handoff = [&](std::uint32_t request) {
        std::snprintf(id, sizeof id, "req-%08u", request);
        const gv::TransferPlan plan =
            prefill_pool.plan(gv::TransferDirection::write, ours_ids, decode_remote, theirs_ids, {}, limits);
        gv::TransferOptions options;
        options.notify = request;
        options.notify_message = std::as_bytes(std::span(id, std::strlen(id)));
        gv::PendingTransfer t = gv::start_transfer(qb, plan, options);
        std::optional<gv::Notification> got;
        while (!(got = inbox.poll())) {
            gv::progress(io);
            if (t.done() && t.error()) die("gpuverbs hand-off failed: " + t.result().failed_blocks);
        }
        while (!t.done()) gv::progress(io); // its handler has run before the next hand-off starts
        const auto m = got->message();
        if (std::string(reinterpret_cast<const char*>(m.data()), m.size()) != id) die("gpuverbs: wrong notification");
    };

    // UCX: prefill's worker on DEV1 puts into decode's on DEV0, over rc_v.
    UcxSide udecode(std::string(d0) + ":1"), uprefill(std::string(d1) + ":1");
    udecode.map(decode);
    uprefill.map(prefill);
    Inbox uinbox;
    {
        ucp_am_handler_param_t hp{};
        hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
        hp.id = 1;
        hp.cb = on_notification;
        hp.arg = &uinbox;
        check(ucp_worker_set_am_recv_handler(udecode.worker, &hp), "ucp_worker_set_am_recv_handler");
    }
    ucp_address_t* address = nullptr;
    std::size_t address_length = 0;
    check(ucp_worker_get_address(udecode.worker, &address, &address_length), "ucp_worker_get_address");
    ucp_ep_h ep = nullptr;
    {
        ucp_ep_params_t ep_params{};
        ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep_params.address = address;
        check(ucp_ep_create(uprefill.worker, &ep_params, &ep), "ucp_ep_create");
    }
    ucp_worker_release_address(udecode.worker, address);
    std::vector<ucp_rkey_h> rkeys;
    for (ucp_mem_h h : udecode.memh) {
        void* packed = nullptr;
        std::size_t size = 0;
        check(ucp_rkey_pack(udecode.context, h, &packed, &size), "ucp_rkey_pack");
        ucp_rkey_h rkey = nullptr;
        check(ucp_ep_rkey_unpack(ep, packed, &rkey), "ucp_ep_rkey_unpack");
        ucp_rkey_buffer_release(packed);
        rkeys.push_back(rkey);
    }
    auto ucx_handoff = [&](std::uint32_t request) {
        std::snprintf(id, sizeof id, "req-%08u", request);
        uinbox.arrived = false;
        ucp_request_param_t put{};
        put.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
        for (std::uint32_t l = 0; l < layers; ++l) {
            put.memh = uprefill.memh[l];
            const auto remote = reinterpret_cast<std::uint64_t>(decode.tensors[l].data());
            for (std::uint32_t h = 0; h < 2; ++h) {
                for (std::size_t k = 0; k < count; ++k) {
                    const std::byte* from = prefill.tensors[l].data() + layout.offset(l, h, ours_ids[k]);
                    ucs_status_ptr_t r =
                        ucp_put_nbx(ep, from, block, remote + layout.offset(l, h, theirs_ids[k]), rkeys[l], &put);
                    if (UCS_PTR_IS_ERR(r)) die(std::string("ucp_put_nbx: ") + ucs_status_string(UCS_PTR_STATUS(r)));
                    if (r != nullptr) ucp_request_free(r); // the flush below completes it
                }
            }
        }
        ucp_request_param_t flush{};
        wait_ucx(ucp_ep_flush_nbx(ep, &flush), uprefill.worker, udecode.worker, "ucp_ep_flush_nbx");
        ucp_request_param_t am{};
        wait_ucx(ucp_am_send_nbx(ep, 1, id, std::strlen(id), nullptr, 0, &am), uprefill.worker, udecode.worker,
                 "ucp_am_send_nbx");
        while (!uinbox.arrived) {
            ucp_worker_progress(udecode.worker);
            ucp_worker_progress(uprefill.worker);
        }
        if (uinbox.last != id) die("ucx: wrong notification");
    };

    // Warm-up (UCX wires its lanes up on the first put), then paired rounds.
    gpuverbs_handoff(0);
    verify("gpuverbs");
    ucx_handoff(0);
    verify("ucx");
    std::vector<double> ratios;
    double tg = 0, tu = 0;
    for (std::uint32_t r = 1; r <= rounds; ++r) {
        const bool ucx_first = r % 2 == 0;
        double seconds[2] = {0, 0};
        for (int side = 0; side < 2; ++side) {
            const bool ucx = (side == 0) == ucx_first;
            const auto t0 = Clock::now();
            if (ucx) {
                ucx_handoff(r);
            } else {
                gpuverbs_handoff(r);
            }
            seconds[ucx ? 1 : 0] = std::chrono::duration<double>(Clock::now() - t0).count();
            verify(ucx ? "ucx" : "gpuverbs");
        }
        tg += seconds[0];
        tu += seconds[1];
        ratios.push_back(seconds[1] / seconds[0]);
        std::printf("round %u: gpuverbs %.3f s, ucx %.3f s, ucx/gpuverbs %.3f\n", r, seconds[0], seconds[1],
                    ratios.back());
    }
    std::sort(ratios.begin(), ratios.end());
    const double pieces = static_cast<double>(count) * layers * 2;
    std::printf(
        "kv hand-off, %u ids x %u layers x 2 halves of %u B (%.0f writes), %u rounds: gpuverbs %.0f blocks/s, "
        "ucx %.0f blocks/s; ucx/gpuverbs time ratio median %.3f (min %.3f, max %.3f)\n",
        count, layers, block, pieces, rounds, pieces * rounds / tg, pieces * rounds / tu, ratios[ratios.size() / 2],
        ratios.front(), ratios.back());

    for (ucp_rkey_h k : rkeys) ucp_rkey_destroy(k);
    ucp_request_param_t close{}; // flushed: both workers are progressed until it completes
    wait_ucx(ucp_ep_close_nbx(ep, &close), uprefill.worker, udecode.worker, "ucp_ep_close_nbx");
    return 0;
}
