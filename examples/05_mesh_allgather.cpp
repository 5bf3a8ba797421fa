// 05_mesh_allgather: N processes share one buffer. Every rank registers a
// buffer of N slices, connects a queue pair to every other rank through the
// rendezvous its launcher or service already has, RDMA-writes its own slice
// into every peer's buffer, and checks the whole result.
//
//   mpirun -np 6 05_mesh_allgather [--exchange pmix|mpi] [--devices rxe0,rxe1] [--slice BYTES] [--lazy]
//   05_mesh_allgather --exchange redis --store HOST[:PORT] --world N [--service NAME] ...
//     (start N of them; the password, if any, comes from $GPUVERBS_REDIS_PASSWORD)
//
// Each write carries the writer's rank as immediate data: RC delivers in
// order, so when a peer's immediate has arrived its slice has landed.
#include "command_line.hpp"

#include <gpuverbs/gpuverbs.hpp>
#if GPUVERBS_EXAMPLE_HAVE_MPI
#include <gpuverbs/many_peers/rendezvous/mpi.hpp>
#endif

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Args {
    std::string exchange = "pmix";
    std::string devices;
    std::size_t slice = 64 << 10;
    std::string store;
    std::string service = "gpuverbs-allgather";
    std::uint32_t world = 0;
    bool lazy = false;
};

// The byte at offset i of rank r's slice.
std::byte pattern(std::uint32_t r, std::size_t i) {
    return std::byte((std::size_t{r} * 131 + i) % 251);
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

template <gpuverbs::Rendezvous R>
int allgather(R& rendezvous, const Args& a) {
    auto start = Clock::now(); // the rendezvous is ready: time the mesh's set-up
    const std::uint32_t me = rendezvous.rank();
    const std::uint32_t n = rendezvous.world_size();

    // 1. This rank's device (ranks take turns over --devices), a protection
    //    domain, one completion queue for every peer, and the buffer: N
    //    slices, written by the peers, so registered for remote writes.
    std::vector<std::string> names;
    std::stringstream list(a.devices);
    for (std::string name; std::getline(list, name, ',');) names.push_back(name);
    gpuverbs::Device device =
        names.empty() ? gpuverbs::Device::open_first() : gpuverbs::Device::open(names[me % names.size()]);
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, static_cast<int>(2 * n + 16));
    std::vector<std::byte> buffer(n * a.slice);
    using gpuverbs::Access;
    gpuverbs::MemoryRegion mr(pd, buffer, Access::local_write | Access::remote_write);
    for (std::size_t i = 0; i < a.slice; ++i) buffer[me * a.slice + i] = pattern(me, i);

    // 2. The mesh: one queue pair per peer, agreed through the rendezvous.
    gpuverbs::Mesh mesh(rendezvous, pd, cq, {mr});
    if (a.lazy) { // pair by pair, as a large job would connect only the peers it talks to
        std::vector<std::uint32_t> everyone;
        for (std::uint32_t q = 0; q < n; ++q) {
            if (q != me) everyone.push_back(q);
        }
        mesh.connect(everyone);
    } else {
        mesh.connect_all();
    }
    double setup_ms = ms_since(start);

    // 3. A receive per peer for its immediate, then our slice into every peer's buffer.
    auto exchange_start = Clock::now();
    auto ours = mr.slice(me * a.slice, a.slice);
    for (std::uint32_t q : mesh.peers()) {
        gpuverbs::MeshPeer& peer = mesh.peer(q);
        gpuverbs::throw_if(peer.qp.post_receive(mr.slice(0, 0)), "post_receive");
    }
    for (std::uint32_t q : mesh.peers()) {
        gpuverbs::MeshPeer& peer = mesh.peer(q);
        gpuverbs::throw_if(peer.qp.post_write_with_imm(ours, peer.regions.at(0), me * a.slice, me),
                           "post_write_with_imm");
    }

    // 4. N-1 writes of ours done and N-1 immediates from the peers arrived.
    std::uint32_t sent = 0, arrived = 0;
    while (sent + arrived < 2 * (n - 1)) {
        gpuverbs::Completion c;
        if (cq.poll({&c, 1}) == 0) continue;
        if (!c.ok()) {
            const gpuverbs::MeshPeer* peer = mesh.find_by_qp(c.qp_num);
            throw gpuverbs::Error(c.status, to_string(c.opcode).data(),
                                  "with rank " + std::to_string(peer ? peer->rank : ~0u) + ": " + c.status.message());
        }
        (c.opcode == gpuverbs::Opcode::receive_with_imm ? arrived : sent) += 1;
    }

    // 5. Every slice, every byte.
    std::size_t bad = 0;
    for (std::uint32_t r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < a.slice; ++i) bad += buffer[r * a.slice + i] != pattern(r, i) ? 1 : 0;
    }
    std::printf(
        "rank %u of %u on %s: all-gather of %u x %zu bytes %s (mesh set-up %.1f ms, exchange %.2f ms, via %s)\n", me, n,
        device.name().c_str(), n, a.slice, bad == 0 ? "verified" : "MISMATCH", setup_ms, ms_since(exchange_start),
        rendezvous.name().c_str());
    return bad == 0 ? 0 : 1;
}

int run(const Args& a, int argc, char** argv) {
    if (a.exchange == "pmix") {
        gpuverbs::PmixRendezvous job; // rank and size from mpirun / srun
        return allgather(job, a);
    }
    if (a.exchange == "redis") {
        gpuverbs::RedisOptions options;
        options.host = a.store.substr(0, a.store.find(':'));
        if (a.store.find(':') != std::string::npos) {
            options.port = static_cast<std::uint16_t>(std::stoul(a.store.substr(a.store.find(':') + 1)));
        }
        options.password = gpuverbs::RedisOptions::secret_from_environment("GPUVERBS_REDIS_PASSWORD");
        options.service = a.service;
        options.world_size = a.world; // each process takes the lowest free rank
        gpuverbs::RedisRendezvous service(options);
        return allgather(service, a);
    }
#if GPUVERBS_EXAMPLE_HAVE_MPI
    MPI_Init(&argc, &argv);
    int status = 0;
    {
        gpuverbs::MpiRendezvous mpi(MPI_COMM_WORLD);
        status = allgather(mpi, a);
    }
    MPI_Finalize();
    return status;
#else
    (void)argc;
    (void)argv;
    std::fprintf(stderr, "05_mesh_allgather was built without MPI: use --exchange pmix\n");
    return 1;
#endif
}

} // namespace

int main(int argc, char** argv) {
    return tools::run_main("05_mesh_allgather", 1, [&] {
        Args a;
        tools::CommandLine cli("05_mesh_allgather", "N processes all-gather a buffer with RDMA writes.", 2);
        cli.usage({{"[options]", "under mpirun / srun (PMIx or MPI)"},
                   {"--exchange redis --store HOST[:PORT] --world N [options]", "N services meeting through Redis"}});
        cli.app.add_option("--exchange", a.exchange, "how ranks meet")->check(CLI::IsMember({"pmix", "mpi", "redis"}));
        cli.app.add_option("--devices", a.devices, "RDMA devices, taken in turn by rank (default: the first)")
            ->type_name("D1,D2");
        cli.app.add_option("--slice", a.slice, "bytes each rank contributes")
            ->type_name("BYTES")
            ->check(CLI::Range(std::size_t(1), std::size_t(1) << 26));
        cli.app.add_flag("--lazy", a.lazy, "connect pair by pair (Mesh::connect) instead of connect_all");
        cli.app.add_option("--store", a.store, "redis: the store's address")->type_name("HOST[:PORT]");
        cli.app.add_option("--service", a.service, "redis: the service name (key namespace)");
        cli.app.add_option("--world", a.world, "redis: how many processes take part")->type_name("N");
        if (auto status = cli.parse(argc, argv)) return *status;
        if (a.exchange == "redis" && (a.store.empty() || a.world < 1)) {
            std::fprintf(stderr, "05_mesh_allgather: --exchange redis needs --store HOST[:PORT] and --world N\n");
            return 2;
        }
        try {
            return run(a, argc, argv);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "05_mesh_allgather: %s\n", e.what());
            return 1;
        }
    });
}
