// A service worker for the many-peers tests (mesh_test.cpp): joins a Redis
// service, connects to every member it sees join (Mesh::offer, completed as
// records appear, so no order of arrivals blocks anyone), forgets those that
// leave, and runs exchange rounds when told. The test drives it line by line.
//
//   gpuverbs_mesh_worker --store HOST:PORT --service NAME --device D [--ttl-ms T]   (password:
//   $GPUVERBS_REDIS_PASSWORD)
//
// stdin:  "round K"  write our slot (pattern of rank and K) into every peer,
//                    then wait for K from every peer and check their slots
//         "status"   say what it is waiting for
//         "quit"     withdraw and exit 0
// stdout: "joined R", "connected R", "left R", "round K ok peers=a,b,c", "error: ..."
#include <gpuverbs/gpuverbs.hpp>

#include <boost/asio/io_context.hpp>

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr std::size_t slot = 4096;
constexpr std::uint32_t slots = 64;

std::byte pattern(std::uint32_t rank, std::uint32_t round, std::size_t i) {
    return std::byte((rank * 131 + round * 17 + i) % 251);
}

void say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

struct Worker {
    gpuverbs::RedisRendezvous& store;
    gpuverbs::Mesh& mesh;
    gpuverbs::CompletionQueue& cq;
    gpuverbs::MemoryRegion& mr;
    std::vector<std::byte>& buffer;
    std::map<std::uint32_t, std::set<std::uint32_t>> arrived; // round -> peers whose immediate came
    std::uint32_t round = 0;                                  // the round in progress (0: none)
    std::uint32_t writes_left = 0;

    void connected(std::uint32_t q) {
        // Receives for the peer's immediates: one per round in flight is enough.
        for (int i = 0; i < 4; ++i) gpuverbs::throw_if(mesh.peer(q).qp.post_receive(mr.slice(0, 0)), "post_receive");
        say("connected " + std::to_string(q));
    }

    void start_round(std::uint32_t k) {
        std::uint32_t me = store.rank();
        round = k;
        for (std::size_t i = 0; i < slot; ++i) buffer[me * slot + i] = pattern(me, k, i);
        writes_left = 0;
        for (std::uint32_t q : mesh.peers()) {
            gpuverbs::MeshPeer& peer = mesh.peer(q);
            gpuverbs::throw_if(peer.qp.post_write_with_imm(mr.slice(me * slot, slot), peer.regions.at(0), me * slot, k),
                               "post_write_with_imm");
            ++writes_left;
        }
    }

    void drain_completions() {
        gpuverbs::Completion c;
        while (cq.poll({&c, 1}) == 1) {
            gpuverbs::MeshPeer* peer = mesh.find_by_qp(c.qp_num);
            if (!c.ok()) {
                // A peer that died mid-round: its leave is reported by the watch.
                say("completion error with rank " + std::to_string(peer ? peer->rank : ~0u) + ": " +
                    c.status.message());
                if (c.opcode != gpuverbs::Opcode::receive_with_imm && writes_left > 0) --writes_left;
                continue;
            }
            if (c.opcode == gpuverbs::Opcode::receive_with_imm) {
                if (peer == nullptr) continue;
                arrived[*c.immediate].insert(peer->rank);
                gpuverbs::throw_if(peer->qp.post_receive(mr.slice(0, 0)), "post_receive");
            } else if (writes_left > 0) {
                --writes_left;
            }
        }
    }

    void status() {
        std::string text =
            "status: round " + std::to_string(round) + ", writes left " + std::to_string(writes_left) + ", peers";
        for (std::uint32_t q : mesh.peers()) text += " " + std::to_string(q);
        text += ", offered";
        for (std::uint32_t q : mesh.offered()) text += " " + std::to_string(q);
        for (const auto& [k, from] : arrived) {
            text += ", round " + std::to_string(k) + " from";
            for (std::uint32_t q : from) text += " " + std::to_string(q);
        }
        say(text);
    }

    void check_round() {
        if (round == 0 || writes_left > 0) return;
        std::vector<std::uint32_t> peers = mesh.peers();
        for (std::uint32_t q : peers) {
            if (!arrived[round].contains(q)) return;
        }
        std::string list;
        for (std::uint32_t q : peers) {
            for (std::size_t i = 0; i < slot; ++i) {
                if (buffer[q * slot + i] != pattern(q, round, i)) {
                    say("error: round " + std::to_string(round) + ": rank " + std::to_string(q) +
                        "'s slot differs at " + std::to_string(i));
                    round = 0;
                    return;
                }
            }
            list += (list.empty() ? "" : ",") + std::to_string(q);
        }
        say("round " + std::to_string(round) + " ok peers=" + list);
        arrived.erase(round);
        round = 0;
    }
};

int run(int argc, char** argv) {
    std::string store_address, service, device_name;
    long ttl_ms = 1500;
    for (int i = 1; i + 1 < argc; i += 2) {
        std::string flag = argv[i];
        if (flag == "--store") store_address = argv[i + 1];
        if (flag == "--service") service = argv[i + 1];
        if (flag == "--device") device_name = argv[i + 1];
        if (flag == "--ttl-ms") ttl_ms = std::stol(argv[i + 1]);
    }
    gpuverbs::RedisOptions options;
    options.host = store_address.substr(0, store_address.find(':'));
    options.port = static_cast<std::uint16_t>(std::stoul(store_address.substr(store_address.find(':') + 1)));
    options.password = gpuverbs::RedisOptions::secret_from_environment("GPUVERBS_REDIS_PASSWORD");
    options.service = service;
    options.ttl = std::chrono::milliseconds(ttl_ms);
    gpuverbs::RedisRendezvous store(options);
    say("joined " + std::to_string(store.rank()));

    gpuverbs::Device device = gpuverbs::Device::open(device_name);
    gpuverbs::ProtectionDomain pd(device);
    gpuverbs::CompletionQueue cq(device, 1024);
    std::vector<std::byte> buffer(slots * slot);
    using gpuverbs::Access;
    gpuverbs::MemoryRegion mr(pd, buffer, Access::local_write | Access::remote_write);
    gpuverbs::Mesh mesh(store, pd, cq, {mr});
    Worker worker{store, mesh, cq, mr, buffer, {}, 0, 0};

    boost::asio::io_context io;
    gpuverbs::PeerWatch watch(store, io.get_executor());
    std::function<void(boost::system::error_code, gpuverbs::PeerEvent)> on_peer = [&](boost::system::error_code ec,
                                                                                      gpuverbs::PeerEvent e) {
        if (ec) {
            say("error: watch: " + watch.diagnostics().message());
            return;
        }
        if (e.kind == gpuverbs::PeerEvent::Kind::joined) {
            if (e.rank < slots) mesh.offer(e.rank);
        } else {
            mesh.disconnect(e.rank);
            say("left " + std::to_string(e.rank));
        }
        watch.async_wait_peer(on_peer);
    };
    watch.async_wait_peer(on_peer);

    std::string line;
    auto last_look = std::chrono::steady_clock::now();
    for (;;) {
        io.poll();
        if (std::chrono::steady_clock::now() - last_look > std::chrono::milliseconds(20)) {
            gpuverbs::Mesh::OfferProgress progress = mesh.complete_offers();
            for (std::uint32_t q : progress.connected) worker.connected(q);
            for (const auto& refusal : progress.refused)
                say("error: rank " + std::to_string(refusal.peer) + ": " + refusal.diagnostics.message());
            last_look = std::chrono::steady_clock::now();
        }
        worker.drain_completions();
        worker.check_round();
        pollfd in{STDIN_FILENO, POLLIN, 0};
        if (::poll(&in, 1, 1) == 1) {
            char c = 0;
            if (::read(STDIN_FILENO, &c, 1) != 1) return 0; // the test is gone
            if (c != '\n') {
                line += c;
                continue;
            }
            if (line == "quit") return 0;
            if (line == "status") worker.status();
            if (line.rfind("round ", 0) == 0)
                worker.start_round(static_cast<std::uint32_t>(std::stoul(line.substr(6))));
            line.clear();
        }
    }
}

} // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        say(std::string("error: ") + e.what());
        return 1;
    }
}
