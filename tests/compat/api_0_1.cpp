// gpuverbs 0.1's documented API, written as 0.1's README, docs/ and examples/
// wrote it: the old header paths, the old names. Nothing here runs (no
// function is called); compiling is the test. The unit test build compiles it
// through tests/compat/expect-deprecations, which fails the compile unless the
// compiler warned for every line marked "expect-deprecated" (a header at
// 0.1's path, or a name 0.1 had) and for nothing else.
//
// A marked line must not sit in an #if block: the check reads the source, not
// the preprocessor. What a build may lack (rdma_cm) is only unmarked code.

// 0.1's headers, at 0.1's paths (gpuverbs.hpp listed them all).
#include <gpuverbs/async.hpp>
#include <gpuverbs/completion.hpp>       // expect-deprecated
#include <gpuverbs/completion_queue.hpp> // expect-deprecated
#include <gpuverbs/data_path.hpp>        // expect-deprecated
#include <gpuverbs/datagram.hpp>         // expect-deprecated
#include <gpuverbs/device.hpp>           // expect-deprecated
#include <gpuverbs/device_events.hpp>    // expect-deprecated
#include <gpuverbs/doctor.hpp>           // expect-deprecated
#include <gpuverbs/error.hpp>
#include <gpuverbs/gid.hpp>        // expect-deprecated
#include <gpuverbs/gpu.hpp>        // expect-deprecated
#include <gpuverbs/gpu_buffer.hpp> // expect-deprecated
#include <gpuverbs/gpu_direct.hpp> // expect-deprecated
#include <gpuverbs/gpuverbs.hpp>
#include <gpuverbs/memory_region.hpp>        // expect-deprecated
#include <gpuverbs/mesh.hpp>                 // expect-deprecated
#include <gpuverbs/protection_domain.hpp>    // expect-deprecated
#include <gpuverbs/queue_pair.hpp>           // expect-deprecated
#include <gpuverbs/queue_pair_types.hpp>     // expect-deprecated
#include <gpuverbs/rdma_cm.hpp>              // expect-deprecated
#include <gpuverbs/registration_cache.hpp>   // expect-deprecated
#include <gpuverbs/rendezvous.hpp>           // expect-deprecated
#include <gpuverbs/rendezvous/pmix.hpp>      // expect-deprecated
#include <gpuverbs/rendezvous/redis.hpp>     // expect-deprecated
#include <gpuverbs/send_batch.hpp>           // expect-deprecated
#include <gpuverbs/shared_receive_queue.hpp> // expect-deprecated
#include <gpuverbs/staging.hpp>              // expect-deprecated
#include <gpuverbs/tcp_bootstrap.hpp>        // expect-deprecated
#include <gpuverbs/transfer.hpp>             // expect-deprecated
#include <gpuverbs/version.hpp>
#include <gpuverbs/wire.hpp>         // expect-deprecated
#include <gpuverbs/work_request.hpp> // expect-deprecated

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace asio = boost::asio;
using boost::asio::use_awaitable;
using gpuverbs::Access;

namespace compat_0_1 {

// What the snippets leave to the program around them.
void log(const std::string& line);
void reconnect_all();
void recover(gpuverbs::QueuePair& qp);
void tear_down_everything_on(const std::string& device);
void send_to_peer(const gpuverbs::Endpoint& endpoint);

// --- README.md, "Using it" ---------------------------------------------------
asio::awaitable<void> readme(asio::io_context& io, std::vector<std::byte>& buffer) {
    gpuverbs::Device dev = gpuverbs::Device::open("mlx5_0"); // or open_first()
    gpuverbs::ProtectionDomain pd(dev);
    gpuverbs::CompletionQueue cq(dev, 256);
    gpuverbs::MemoryRegion mr(pd, buffer, Access::local_write | Access::remote_write | Access::remote_read);
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq);

    auto socket = gpuverbs::tcp_connect(io, "10.0.0.2", 18515); // or a TcpListener
    gpuverbs::Handshake peer = gpuverbs::exchange_handshake(socket, {prepared.endpoint(), {mr.remote()}});
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);

    std::error_code ec = qp.post_write(mr.slice(0, 4096), peer.regions[0], 0, {.context = 1});
    std::array<gpuverbs::Completion, 16> done;
    std::size_t n = cq.poll(done); // done[i].status is a std::error_code that says why

    ec = qp.post(gpuverbs::WorkRequest::write(mr.slice(0, 64), peer.regions[0], 0).context(2).inline_data());
    gpuverbs::SendBatch batch = qp.batch();
    ec = batch.add(gpuverbs::WorkRequest::write(mr.slice(0, 4096), peer.regions[0], 4096).unsignaled());
    if (!ec) ec = batch.post();
    std::size_t bytes =
        co_await qp.async_post(gpuverbs::WorkRequest::read(mr.slice(0, 8), peer.regions[0], 0), use_awaitable);
    std::printf("%zu %zu %s\n", n, bytes, done[0].status.message().c_str());
}

// --- docs/concepts.md ---------------------------------------------------------
asio::awaitable<void> concepts(asio::io_context& io, gpuverbs::Device& device, gpuverbs::ProtectionDomain& pd,
                               gpuverbs::CompletionQueue& cq, gpuverbs::MemoryRegion& mr,
                               const gpuverbs::Endpoint& theirs, const gpuverbs::RemoteMemory& peer,
                               gpuverbs::SendBatch& batch, const gpuverbs::RemoteMemory& peer_memory,
                               const gpuverbs::LocalBuffer& result, const gpuverbs::RemoteMemory& counter) {
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq, {.max_send_wr = 512}); // created, in INIT
    gpuverbs::Endpoint mine = prepared.endpoint();                          // QPN, PSN, LID, GID, MTU, link layer
    gpuverbs::QueuePair qp = std::move(prepared).connect(theirs);           // INIT -> RTR -> RTS
    std::printf("%u\n", static_cast<unsigned>(gpuverbs::mtu_bytes(mine.mtu)));

    auto w = gpuverbs::WorkRequest::write(mr.slice(0, 64), peer, 0).context(7).inline_data().fence();
    std::error_code ec = qp.post(w);          // synchronous
    ec = batch.add(w);                        // batched (SendBatch: one doorbell for up to 32)
    co_await qp.async_post(w, use_awaitable); // asynchronous

    gpuverbs::CompletionQueue async_cq(device, 1024, io.get_executor(), {gpuverbs::CompletionMode::adaptive});
    std::size_t n = co_await qp.async_write(mr.slice(0, 4096), peer_memory, 0, asio::use_awaitable);
    gpuverbs::Received r = co_await qp.async_receive(mr.slice(0, 4096), asio::use_awaitable);
    std::uint64_t old = co_await qp.async_fetch_add(result, counter, 0, 1, asio::use_awaitable);
    std::printf("%zu %zu %llu\n", n, r.bytes, static_cast<unsigned long long>(old));
}

void errors() {
    gpuverbs::Device dev = gpuverbs::Device::open("mlx5_9"); // throws gpuverbs::Error
    std::error_code ec;
    gpuverbs::Device dev2 = gpuverbs::Device::open("mlx5_9", ec); // never throws
    gpuverbs::Diagnostics diag;                                   // … and keeps the words
    gpuverbs::Device dev3 = gpuverbs::Device::open("mlx5_9", ec, diag);
    if (ec) std::fprintf(stderr, "%s\n", diag.message().c_str());
}

// --- docs/events.md -----------------------------------------------------------
void events(asio::io_context& io, gpuverbs::Device& device, gpuverbs::QueuePair& qp,
            const gpuverbs::Endpoint& peer_endpoint, const gpuverbs::ConnectOptions& options) {
    gpuverbs::DeviceEvents events(device, io.get_executor()); // or DeviceEvents(device) for poll()/wait_for()
    events.async_wait([&](boost::system::error_code ec, const gpuverbs::DeviceEvent& e) {
        if (ec) return;
        log(e.describe());
        if (e.type == gpuverbs::DeviceEventType::port_active) reconnect_all();
        if (e.concerns(qp)) recover(qp);
        if (e.device_lost()) tear_down_everything_on(e.device);
    });

    gpuverbs::PreparedQueuePair again = std::move(qp).reset(); // RESET -> INIT, a new PSN, queues emptied
    send_to_peer(again.endpoint());
    qp = std::move(again).connect(peer_endpoint, options); // RTR -> RTS
}

// --- docs/troubleshooting.md: "set ConnectOptions::rnr_retry = 7" -------------
gpuverbs::QueuePair patient(gpuverbs::PreparedQueuePair prepared, const gpuverbs::Endpoint& peer) {
    gpuverbs::ConnectOptions options;
    options.rnr_retry = 7;                                                 // expect-deprecated
    gpuverbs::ConnectOptions designated{.retry_count = 6, .rnr_retry = 7}; // expect-deprecated
    (void)designated;
    return std::move(prepared).connect(peer, options);
}

// --- docs/gpu-memory.md -------------------------------------------------------
void gpu_memory(gpuverbs::ProtectionDomain& pd, gpuverbs::QueuePair& qp, const gpuverbs::RemoteMemory& peer_region,
                void* data_ptr, std::size_t nbytes) {
    gpuverbs::GpuBuffer buffer(64 << 20); // GPU 0
    gpuverbs::MemoryRegion mr = gpuverbs::register_gpu_memory(pd, buffer, gpuverbs::access_all);
    qp.post_write(mr.all(), peer_region); // as for host memory; mr.remote() goes to the peer

    auto tensor = gpuverbs::GpuMemory::from_pointer(data_ptr, nbytes); // someone else's memory
    auto mr2 = gpuverbs::register_gpu_memory(pd, tensor, gpuverbs::Access::local_write);
    (void)mr2;
}

// --- docs/many-peers.md -------------------------------------------------------
void many_peers(gpuverbs::ProtectionDomain& pd, gpuverbs::CompletionQueue& cq, std::vector<std::byte>& buffer,
                std::size_t n, std::uint64_t offset) {
    gpuverbs::PmixRendezvous job; // or MpiRendezvous, RedisRendezvous
    gpuverbs::MemoryRegion mr(pd, buffer, Access::local_write | Access::remote_write);
    gpuverbs::Mesh mesh(job, pd, cq, {mr.remote()});
    mesh.connect_all(); // collective: a full mesh
    auto& peer = mesh.peer(3);
    peer.qp.post_write(mr.slice(0, n), peer.regions[0], offset);
}

void redis(gpuverbs::ProtectionDomain& pd, gpuverbs::CompletionQueue& cq, gpuverbs::MemoryRegion& mr) {
    gpuverbs::RedisOptions options;
    options.host = "10.0.0.1";
    options.service = "kv";
    options.password = gpuverbs::RedisOptions::secret_from_environment("GPUVERBS_REDIS_PASSWORD");
    gpuverbs::RedisRendezvous store(options);
    gpuverbs::Mesh mesh(store, pd, cq, {mr.remote()}, gpuverbs::MeshOptions{.queue_pair = {.max_send_wr = 64}});
    mesh.connect(1);
    mesh.disconnect(1);
}

// --- docs/rdma-cm.md ----------------------------------------------------------
#if GPUVERBS_HAVE_RDMACM
void rdma_cm_server(gpuverbs::MemoryRegion& mr, std::span<const std::byte> answer) {
    gpuverbs::CmListener listener("::", 7471);
    auto conn = listener.accept();
    (void)conn.requested();
    (void)conn.peer_private_data();
    gpuverbs::ProtectionDomain pd(conn.device());
    gpuverbs::CompletionQueue cq(conn.device(), 256);
    gpuverbs::QueuePair& qp = conn.create_qp(pd, cq, cq);
    qp.post_receive(mr.slice(0, 4096)); // before accept
    conn.accept({}, answer);            // up to 196 bytes, or std::move(conn).reject(reason)
}

void rdma_cm_client(gpuverbs::MemoryRegion& mr, std::span<const std::byte> hello) {
    auto conn = gpuverbs::cm_resolve("fd00::2", 7471);
    gpuverbs::ProtectionDomain pd(conn.device());
    gpuverbs::CompletionQueue cq(conn.device(), 256);
    gpuverbs::QueuePair& qp = conn.create_qp(pd, cq, cq);
    qp.post_receive(mr.slice(0, 4096));
    conn.connect({}, hello); // up to 56 bytes
    (void)conn.peer_private_data();
}
#endif

// --- docs/transfers.md --------------------------------------------------------
void transfers(gpuverbs::QueuePair& qp, gpuverbs::QueuePair& qp0, gpuverbs::QueuePair& qp1,
               const gpuverbs::MemoryRegion& pool_mr_on_nic0, const gpuverbs::MemoryRegion& pool_mr_on_nic1,
               const gpuverbs::RemoteMemory& peer_pool_on_nic0, const gpuverbs::RemoteMemory& peer_pool_on_nic1,
               std::uint32_t request_id) {
    std::vector<gpuverbs::LocalBuffer> mine;   // where the bytes are (or go, for reads)
    std::vector<gpuverbs::RemoteBlock> theirs; // {RemoteMemory, offset, length} each
    auto plan = gpuverbs::TransferPlan::make(gpuverbs::TransferDirection::write, mine, theirs, // expect-deprecated
                                             qp.capabilities());
    gpuverbs::async_transfer(qp, plan, {.notify = request_id}, [](boost::system::error_code, std::size_t) {});
    std::printf("%zu requests, %zu pieces, %zu bytes\n", plan.requests().size(), plan.pieces().size(), plan.bytes());

    std::vector<gpuverbs::TransferRail> rails{{&qp0, {}, {}}, {&qp1, {}, {}}};
    rails[1].local(pool_mr_on_nic0, pool_mr_on_nic1).remote(peer_pool_on_nic0, peer_pool_on_nic1);
    std::array<std::uint64_t, 2> per_rail{};
    gpuverbs::TransferOptions options;
    options.rail_bytes = per_rail; // expect-deprecated
    auto handler = [](boost::system::error_code, std::size_t) {};
    gpuverbs::async_transfer(std::span<const gpuverbs::TransferRail>(rails), plan, options, handler);

    gpuverbs::NicChoice choice = gpuverbs::choose_nic("0000:03:00.0");
    std::printf("%s %zu\n", choice.why.c_str(), choice.rails(2).size());
}

void block_list_on_the_wire(boost::asio::ip::tcp::socket& socket, std::span<const gpuverbs::RemoteBlock> blocks) {
    std::vector<std::byte> record = gpuverbs::wire::serialize(blocks);
    gpuverbs::send_record(socket, record);
    std::vector<gpuverbs::RemoteBlock> back =
        gpuverbs::wire::parse_block_list(gpuverbs::receive_record(socket, 64 << 20));
    (void)back;
}

void registration_cache(gpuverbs::ProtectionDomain& pd, std::span<std::byte> buffer) {
    gpuverbs::RegistrationCacheLimits limits{.max_regions = 256, .max_bytes = 8ull << 30}; // expect-deprecated
    gpuverbs::RegistrationCache cache(pd, limits);
    auto mr = cache.get(buffer, Access::local_write | Access::remote_write); // shared_ptr<const MemoryRegion>
    cache.invalidate(buffer.data(), buffer.size());
    gpuverbs::RegistrationCacheStats s = // expect-deprecated
        cache.stats();                   // expect-deprecated
    std::printf(
        "%llu hits, %llu misses, %llu evictions, %llu merges, %llu invalidations, %llu stale, %zu regions, "
        "%zu bytes\n",
        static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
        static_cast<unsigned long long>(s.evictions), static_cast<unsigned long long>(s.merges),
        static_cast<unsigned long long>(s.invalidations), static_cast<unsigned long long>(s.stale), s.regions,
        s.bytes_pinned);
    (void)mr;
}

void staged(gpuverbs::ProtectionDomain& pd, gpuverbs::QueuePair& qp, gpuverbs::CompletionQueue& cq,
            const gpuverbs::GpuMemory& gpu, const gpuverbs::RemoteMemory& peer_memory) {
    if (auto why = gpuverbs::StagedWriter::why_needed(pd, gpu)) { // register_gpu_memory's reasons
        gpuverbs::StagedWriter writer(pd, {.chunk = 4 << 20, .depth = 4, .gpu = 0}, *why);
        std::puts(writer.path().c_str());
        writer.write(qp, cq, gpu, peer_memory);
    }
}

// --- examples/ (what the docs above do not already show) ----------------------
void devices() { // 01_devices
    for (const gpuverbs::DeviceInfo& info : gpuverbs::Device::list()) {
        gpuverbs::Device device = gpuverbs::Device::open(info.name);
        gpuverbs::DeviceAttributes attributes = device.query();
        gpuverbs::PortAttributes port = device.query_port(1);
        for (const gpuverbs::GidEntry& gid : device.gid_table(1)) log(gid.gid.to_string());
        std::printf("%s %u\n", gpuverbs::format_guid(attributes.node_guid).c_str(),
                    static_cast<unsigned>(gpuverbs::mtu_bytes(port.active_mtu)));
        (void)device.select_gid(1);
    }
    for (const gpuverbs::GpuInfo& gpu : gpuverbs::list_gpus()) log(gpu.pci_bus_id);
}

void two_processes(asio::io_context& io, gpuverbs::ProtectionDomain& pd, gpuverbs::CompletionQueue& cq,
                   gpuverbs::MemoryRegion& mr) { // 02_rdma_write
    gpuverbs::TcpListener listener(io, 18515);
    auto socket = listener.accept(gpuverbs::default_bootstrap_timeout);
    gpuverbs::PreparedQueuePair prepared(pd, cq, cq, gpuverbs::QueuePairOptions{.max_send_wr = 64});
    gpuverbs::Handshake peer = gpuverbs::exchange_handshake(socket, {prepared.endpoint(), {mr.remote()}});
    gpuverbs::QueuePair qp = std::move(prepared).connect(peer.endpoint);
    qp.post_receive(mr.slice(0, 0));
    qp.post_write_with_imm(mr.all(), peer.regions.at(0), 0, 42);
    std::array<gpuverbs::Completion, 4> done;
    for (std::size_t i = 0; i < cq.poll(done); ++i) {
        if (done[i].opcode == gpuverbs::Opcode::receive_with_imm && done[i].ok()) log("notified");
        gpuverbs::throw_if(done[i].status, "completion");
    }
}

asio::awaitable<void> echo(gpuverbs::QueuePair& qp, gpuverbs::MemoryRegion& mr) { // 03_echo_coroutines
    auto socket = co_await gpuverbs::async_tcp_connect(co_await asio::this_coro::executor, "10.0.0.1", 7000,
                                                       gpuverbs::default_bootstrap_timeout, use_awaitable);
    gpuverbs::Handshake peer = co_await gpuverbs::async_exchange_handshake(socket, {}, use_awaitable);
    gpuverbs::Received r = co_await qp.async_receive(mr.slice(0, 64), use_awaitable);
    co_await qp.async_send(mr.slice(0, r.bytes), use_awaitable);
    (void)peer;
}

void gpudirect(gpuverbs::ProtectionDomain& pd) { // 04_gpudirect_write
    std::error_code ec;
    gpuverbs::GpuBuffer buffer = gpuverbs::GpuBuffer::create(1 << 20, {.gpu = 0}, ec);
    try {
        gpuverbs::MemoryRegion mr = gpuverbs::register_gpu_memory(pd, buffer, Access::local_write);
        gpuverbs::flush_gpu_direct_rdma_writes(buffer.gpu());
        (void)gpuverbs::gpu_orders_rdma_writes(buffer.gpu());
    } catch (const gpuverbs::GpuRegistrationError& e) {
        for (const gpuverbs::Rejection& rejected : e.rejections()) log(rejected.reason);
    }
    auto explanation = gpuverbs::explain_gpu_registration(pd, buffer.gpu());
    log(std::string(gpuverbs::to_string(explanation.plan.policy)));
    for (const gpuverbs::Rejection& rejected : explanation.plan.rejected) log(rejected.reason);
}

template <gpuverbs::Rendezvous R>
void allgather(R& rendezvous, gpuverbs::ProtectionDomain& pd, gpuverbs::CompletionQueue& cq,
               gpuverbs::MemoryRegion& mr) { // 05_mesh_allgather
    gpuverbs::Mesh mesh(rendezvous, pd, cq, {mr.remote()});
    mesh.connect_all();
    for (std::uint32_t q = 0; q < rendezvous.world_size(); ++q) {
        if (q == rendezvous.rank()) continue;
        gpuverbs::MeshPeer& peer = mesh.peer(q);
        peer.qp.post_write(mr.slice(0, 64), peer.regions[0], std::uint64_t{64} * rendezvous.rank());
    }
}
template void allgather(gpuverbs::PmixRendezvous&, gpuverbs::ProtectionDomain&, gpuverbs::CompletionQueue&,
                        gpuverbs::MemoryRegion&);

void kv_cache_transfer(gpuverbs::QueuePair& qp, const gpuverbs::TransferPlan& plan,
                       std::uint32_t request_id) { // 06_kv_cache_transfer
    std::string failed;
    gpuverbs::async_transfer(qp, plan, {.notify = request_id, .failed_blocks = &failed}, // expect-deprecated
                             [&](boost::system::error_code ec, std::size_t bytes) {
                                 if (ec) throw gpuverbs::Error(ec, "async_transfer", failed);
                                 std::printf("%zu bytes\n", bytes);
                             });
    gpuverbs::TransferReport report;
    gpuverbs::TransferOptions options;
    options.report = &report; // expect-deprecated
    gpuverbs::async_transfer(qp, plan, options, [](auto ec, std::size_t bytes) { (void)ec, (void)bytes; });
}

// A transfer awaited as 0.1 awaited it: its result was the bytes.
asio::awaitable<void> transfer_awaited(gpuverbs::QueuePair& qp, const gpuverbs::TransferPlan& plan) {
    std::size_t n = co_await gpuverbs::async_transfer(qp, plan, use_awaitable);
    log(std::to_string(n));
}

} // namespace compat_0_1
