// Many peers on real devices, real launchers and a real store: full meshes
// under mpirun (PMIx and MPI), services meeting through a redis-server this
// test starts (with a password), members joining, crashing and leaving, and
// every kind of bad input a rendezvous can hand a mesh.
#include "child_process.hpp"
#include "rig.hpp"
#include "rig_rails.hpp"
#include "three_forms.hpp"

#include <gpuverbs/gpuverbs.hpp>

#include <doctest/doctest.h>
#include "build_has.hpp"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

using namespace gpuverbs;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

test::RigDevices rig() {
    return *test::rig_devices();
}

/// A fresh name per use, so that runs never see each other's keys.
std::string fresh(const std::string& what) {
    static std::atomic<int> counter{0};
    return what + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

int count_of(const std::string& text, const std::string& needle) {
    int n = 0;
    for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
}

/// redis-server on the rig's first address with a password from a 0600
/// config file (never on a command line), or none; killed at the end.
class RedisServer {
public:
    explicit RedisServer(bool with_password = true)
        : port_(static_cast<std::uint16_t>(20000 + (::getpid() * 7 + instances_++ * 13) % 20000)) {
        std::random_device device;
        if (with_password) password_ = "pw-" + std::to_string(device()) + std::to_string(device());
        config_ = "/tmp/" + fresh("gpuverbs-redis") + ".conf";
        {
            std::ofstream conf(config_);
            // The default user's password, and an ACL user with its own (Redis 6+).
            conf << "bind " << rig().ip0 << "\nport " << port_;
            if (with_password)
                conf << "\nrequirepass " << password_ << "\nuser mesh-acl on >acl-" << password_ << " ~* +@all";
            conf << "\nsave \"\"\nappendonly no\ndir /tmp\nlogfile \"\"\nprotected-mode no\n";
        }
        ::chmod(config_.c_str(), 0600);
        start();
    }
    RedisServer(const RedisServer&) = delete;
    RedisServer& operator=(const RedisServer&) = delete;
    ~RedisServer() {
        stop();
        std::remove(config_.c_str());
    }

    void start() {
        server_ = std::make_unique<test::ChildProcess>(std::vector<std::string>{"redis-server", config_},
                                                       test::ChildProcess::Output{config_ + ".log"});
        // Ours (it takes our password) within a few seconds, or the log says why not.
        for (int i = 0; i < 300; ++i) {
            try {
                RedisRendezvous probe(options("probe"));
                return;
            } catch (const Error&) {
                std::this_thread::sleep_for(10ms);
            }
        }
        FAIL("redis-server did not start: " << read_file(config_ + ".log"));
    }
    void stop() { server_.reset(); }

    [[nodiscard]] RedisOptions options(const std::string& service) const {
        RedisOptions o;
        o.host = rig().ip0;
        o.port = port_;
        o.password = password_;
        o.service = service;
        o.ttl = 1500ms;
        o.command_timeout = 1000ms;
        return o;
    }
    [[nodiscard]] std::string address() const { return rig().ip0 + ":" + std::to_string(port_); }
    [[nodiscard]] const std::string& password() const { return password_; }

private:
    static inline int instances_ = 0;
    std::uint16_t port_;
    std::string password_;
    std::string config_;
    std::unique_ptr<test::ChildProcess> server_;
};

/// What one in-process mesh member needs: a device, PD, CQ and a registered buffer.
struct Member {
    Device device;
    ProtectionDomain pd{device};
    CompletionQueue cq{device, 256};
    std::vector<std::byte> buffer = std::vector<std::byte>(1 << 16);
    MemoryRegion mr{pd, buffer, Access::local_write | Access::remote_write};
    explicit Member(const std::string& name) : device(Device::open(name)) {}
};

Completion wait_completion(CompletionQueue& cq, std::chrono::seconds limit = 10s) {
    Completion c;
    auto deadline = Clock::now() + limit;
    while (cq.poll({&c, 1}) == 0) {
        REQUIRE_MESSAGE(Clock::now() < deadline, "no completion within the deadline");
    }
    return c;
}

/// mpirun as the rig runs it: root, more ranks than the VM's CPUs, MPI's own
/// traffic over shared memory and TCP (never over the rxe devices under test,
/// nor over their wires: a test may cut those).
std::vector<std::string> mpirun_command(int ranks, const std::vector<std::string>& program) {
    std::vector<std::string> args{"mpirun",
                                  "--allow-run-as-root",
                                  "--oversubscribe",
                                  "-np",
                                  std::to_string(ranks),
                                  "--mca",
                                  "btl",
                                  "self,vader,tcp",
                                  "--mca",
                                  "pml",
                                  "ob1",
                                  "--mca",
                                  "osc",
                                  "^ucx",
                                  "--mca",
                                  "btl_vader_single_copy_mechanism",
                                  "none",
                                  "--mca",
                                  "oob_tcp_if_include",
                                  "lo",
                                  "--mca",
                                  "btl_tcp_if_include",
                                  "lo"};
    args.insert(args.end(), program.begin(), program.end());
    return args;
}

int mpirun(int ranks, const std::vector<std::string>& program, const std::string& output) {
    test::ChildProcess launcher(mpirun_command(ranks, program), test::ChildProcess::Output{output});
    return launcher.wait(120s);
}

void all_gather_under_mpirun(const std::vector<std::string>& extra, const std::string& via) {
    auto r = rig();
    std::vector<std::string> program{test::example_binary("05_mesh_allgather"), "--devices", r.dev0 + "," + r.dev1,
                                     "--slice", "65536"};
    program.insert(program.end(), extra.begin(), extra.end());
    std::string out = "/tmp/" + fresh("mesh-allgather") + ".log";
    int status = mpirun(6, program, out);
    std::string text = read_file(out);
    INFO(text);
    CHECK(status == 0);
    CHECK(count_of(text, "all-gather of 6 x 65536 bytes verified") == 6);
    CHECK(count_of(text, "via " + via) == 6);
    // Ranks alternate between the two devices.
    CHECK(count_of(text, "on " + r.dev0 + ":") == 3);
    CHECK(count_of(text, "on " + r.dev1 + ":") == 3);
    for (int rank = 0; rank < 6; ++rank) CHECK(count_of(text, "rank " + std::to_string(rank) + " of 6 ") == 1);
    std::remove(out.c_str());
}

/// examples/08_gpu_all_to_all under mpirun: 4 ranks over both devices, dispatch and combine, every byte checked.
void all_to_all_under_mpirun(const std::vector<std::string>& extra, const std::string& mode) {
    auto r = rig();
    std::vector<std::string> program{test::example_binary("08_gpu_all_to_all"),
                                     "--devices",
                                     r.dev0 + "," + r.dev1,
                                     "--tokens",
                                     "256",
                                     "--row",
                                     "1024",
                                     "--rounds",
                                     "3"};
    program.insert(program.end(), extra.begin(), extra.end());
    std::string out = "/tmp/" + fresh("all-to-all") + ".log";
    int status = mpirun(4, program, out);
    std::string text = read_file(out);
    INFO(text);
    CHECK(status == 0);
    CHECK(count_of(text, "(" + mode +
                             "): 3 rounds of dispatch and combine, 256 tokens of 1024 bytes, every byte "
                             "verified; 0 waits not done") == 4);
    for (int rank = 0; rank < 4; ++rank) CHECK(count_of(text, "rank " + std::to_string(rank) + " of 4 ") == 1);
    std::remove(out.c_str());
}

/// Waits until `path` holds `text` (a line a job prints as it goes); false by `limit`.
bool wait_for_text(const std::string& path, const std::string& text, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (read_file(path).find(text) == std::string::npos) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(50ms);
    }
    return true;
}

} // namespace

TEST_SUITE("many peers: jobs" * doctest::skip(!test::rig_present())) {
    TEST_CASE(
        "mpirun -np 4, PMIx: the all-to-all on two rails, the first rail's wire cut mid-run: the proxy fails "
        "over and every byte arrives both ways" *
        doctest::skip(!test::build_has::pmix || !test::build_has::examples)) {
        const auto wire = test::second_wire(); // rxe2 beside rxe0, rxe3 beside rxe1
        if (!wire) return;
        auto r = rig();
        const std::vector<std::string> program{test::example_binary("08_gpu_all_to_all"),
                                               "--devices",
                                               r.dev0 + "," + r.dev1,
                                               "--second-rail",
                                               "rxe2,rxe3",
                                               "--tokens",
                                               "256",
                                               "--row",
                                               "1024",
                                               "--rounds",
                                               "40",
                                               "--progress"};
        const std::string out = "/tmp/" + fresh("all-to-all-cut") + ".log";
        test::ChildProcess launcher(mpirun_command(4, program), test::ChildProcess::Output{out});
        // Cut once rank 0 finished round 3: the meshes are up and rows are moving every way.
        REQUIRE_MESSAGE(wait_for_text(out, "rank 0: round 3 of 40 done at", 90s), read_file(out));
        // The cut: the first wire drops every packet from rxe0 (netem loss 100%), so every request across it
        // ends in retry exceeded or the proxy's 2 s bound; the ranks that share a device keep their rail 0.
        // (With the link administratively down instead, rxe's requester can spin in the kernel inside
        // ibv_post_send for tens of seconds: a post that does not return is not a bound user space keeps.)
        test::Heal heal("drop-off");
        REQUIRE(test::fault("drop-on") == 0);
        const auto cut = std::chrono::steady_clock::now();
        const int status = launcher.wait(180s);
        const auto after = std::chrono::steady_clock::now() - cut;
        REQUIRE(heal.now() == 0);
        const std::string text = read_file(out);
        INFO(text);
        CHECK(status == 0);
        CHECK(text.find("rank 0: round 4 of 40 done at") != std::string::npos); // cut mid-run, not after it
        CHECK(count_of(text,
                       "(device queue): 40 rounds of dispatch and combine, 256 tokens of 1024 bytes, every byte "
                       "verified; 0 waits not done") == 4);
        // Every rank's rail 0 to the ranks across the wire failed, and its requests went again on rail 1.
        for (int rank = 0; rank < 4; ++rank) {
            CAPTURE(rank);
            CHECK(count_of(text, "rank " + std::to_string(rank) + ": ") >= 2); // the rails' lines
            CHECK(text.find("rank " + std::to_string(rank) + ": peer ") != std::string::npos);
        }
        CHECK(count_of(text, "rails failed") == 4);
        CHECK(text.find("rail 0: ") != std::string::npos);
        CHECK(text.find("rail 1: ") == std::string::npos);  // the second rail carried the rest
        const std::size_t said = text.find("rails failed"); // one rank's failover, in its words
        const std::size_t line = said == std::string::npos ? 0 : text.rfind('\n', said) + 1;
        MESSAGE("the job ended " << std::chrono::duration_cast<std::chrono::milliseconds>(after).count()
                                 << " ms after the cut; " << text.substr(line, 400));
        std::remove(out.c_str());
    }

    TEST_CASE("mpirun -np 4, PMIx: a mixture-of-experts all-to-all through the device queue, every byte both ways" *
              doctest::skip(!test::build_has::pmix || !test::build_has::examples)) {
        all_to_all_under_mpirun({}, "device queue");
        all_to_all_under_mpirun({"--host-loop"}, "host loop"); // the benchmark's baseline checks the same bytes
    }
    TEST_CASE("mpirun -np 6, PMIx: a full mesh over rxe0 and rxe1, all-gather by RDMA write, twice in a row" *
              doctest::skip(!test::build_has::pmix || !test::build_has::examples)) {
        all_gather_under_mpirun({"--exchange", "pmix"}, "PMIx namespace");
        all_gather_under_mpirun({"--exchange", "pmix"}, "PMIx namespace"); // no leftovers from the first job
    }
    TEST_CASE("mpirun -np 6, MPI flavour: the exchange rides on MPI_Allgather" *
              doctest::skip(!test::build_has::mpi || !test::build_has::examples)) {
        all_gather_under_mpirun({"--exchange", "mpi"}, "an MPI communicator of 6 ranks");
    }
    TEST_CASE("mpirun -np 6, PMIx, lazy: each pair connects through its own records" *
              doctest::skip(!test::build_has::pmix || !test::build_has::examples)) {
        all_gather_under_mpirun({"--exchange", "pmix", "--lazy"}, "PMIx namespace");
    }
    TEST_CASE("outside a launcher, PmixRendezvous says it was not started by one" *
              doctest::skip(!test::build_has::pmix)) {
        // This process was not started by mpirun.
        try {
            PmixRendezvous job;
            FAIL("PMIx_Init succeeded outside a launcher");
        } catch (const Error& e) {
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK(std::string(e.what()).find("not started by a PMIx launcher") != std::string::npos);
        }
    }
}

TEST_SUITE("many peers: services" * doctest::skip(!test::rig_present() || !test::build_has::hiredis)) {
    TEST_CASE("a Redis store without a password on a network address is reported once, in words, as a warning") {
        std::vector<std::string> said;
        const WarningHandler previous = set_warning_handler(
            [&](const Warning& w) { said.push_back(std::string(w.source) + ": " + std::string(w.text)); });
        {
            RedisServer open_store(false); // bound to the rig's first address, no requirepass
            RedisRendezvous a(open_store.options(fresh("open")));
            RedisRendezvous b(open_store.options(fresh("open")));
            CHECK(a.members().size() == 1);
        }
        (void)set_warning_handler(previous);
        REQUIRE(said.size() == 1); // one store, one warning, however many members and connections
        MESSAGE(said[0]);
        CHECK(said[0].find("RedisRendezvous: Redis at " + rig().ip0) == 0);
        CHECK(said[0].find("answers without a password and is not on this host's loopback") != std::string::npos);
        CHECK(said[0].find("RedisOptions::password") != std::string::npos);
    }

    TEST_CASE(
        "attack: a member's record rewritten in the store (HSET with the store's password) is refused by a "
        "signed member" *
        doctest::skip(!GPUVERBS_HAVE_OPENSSL)) {
        RedisServer redis;
        const std::string service = fresh("signed");
        const std::string secret = "a secret every member of " + service + " shares";
        RedisRendezvous a_store(redis.options(service));
        RedisRendezvous b_store(redis.options(service));
        SignedRendezvous a(a_store, secret, service), b(b_store, secret, service);
        const std::string record = "b's endpoint and regions";
        const auto* p = reinterpret_cast<const std::byte*>(record.data());
        b.publish("mesh", std::span(p, record.size()));
        CHECK(a.lookup(b.rank(), "mesh", 2s) == std::vector<std::byte>(p, p + record.size()));
        // The forger: any local user who can reach the store (here even with its password).
        ::setenv("REDISCLI_AUTH", redis.password().c_str(),
                 1); // NOLINT(concurrency-mt-unsafe): never on a command line
        const std::string forge = "redis-cli -h " + rig().ip0 + " -p " +
                                  redis.address().substr(redis.address().find(':') + 1) + " HSET " + service +
                                  "/data/" + std::to_string(b.rank()) +
                                  " mesh 'the forger s endpoint, 32 bytes or more' >/dev/null";
        REQUIRE(std::system(forge.c_str()) == 0); // NOLINT(cert-env33-c): the test's own command line
        try {
            (void)a.lookup(b.rank(), "mesh", 2s);
            FAIL("the forged record was accepted");
        } catch (const Error& e) {
            MESSAGE(std::string(e.what()));
            CHECK(e.code() == errc::malformed_record);
            CHECK(std::string(e.what()).find("does not carry a signature of this service's secret") !=
                  std::string::npos);
        }
        // An unsigned member's own record is refused the same way.
        RedisRendezvous c_store(redis.options(service));
        c_store.publish("mesh", std::span(p, 4));
        try {
            (void)a.lookup(c_store.rank(), "mesh", 2s);
            FAIL("an unsigned record was accepted");
        } catch (const Error& e) {
            CHECK(e.code() == errc::malformed_record);
        }
    }

    TEST_CASE("two members connect lazily through Redis, without blocking each other, and write") {
        RedisServer redis;
        std::string service = fresh("pair");
        RedisRendezvous a_store(redis.options(service));
        RedisRendezvous b_store(redis.options(service));
        CHECK(a_store.rank() == 0);
        CHECK(b_store.rank() == 1);
        CHECK(a_store.world_size() == wire::max_world_size); // an open world
        CHECK(a_store.members() == std::vector<std::uint32_t>{0, 1});
        auto r = rig();
        Member a(r.dev0), b(r.dev1);
        Mesh a_mesh(a_store, a.pd, a.cq, {a.mr});
        Mesh b_mesh(b_store, b.pd, b.cq, {b.mr});
        a_mesh.offer(1);
        CHECK(a_mesh.complete_offers().connected.empty()); // b has not offered yet: nothing waits
        CHECK(a_mesh.offered() == std::vector<std::uint32_t>{1});
        b_mesh.offer(0);
        CHECK(b_mesh.complete_offers().connected == std::vector<std::uint32_t>{0});
        CHECK(a_mesh.complete_offers().connected == std::vector<std::uint32_t>{1});
        CHECK(a_mesh.offered().empty());
        // One QP pair: each side's QP is connected to the other's.
        CHECK(a_mesh.peer(1).qp.remote_endpoint().qp_num == b_mesh.peer(0).qp.qp_num());
        CHECK(b_mesh.peer(0).qp.remote_endpoint().qp_num == a_mesh.peer(1).qp.qp_num());
        // Each queue pair grants what the member's region allows, no more.
        CHECK(b_mesh.peer(0).qp.remote_access() == (b.mr.access() & detail::peer_facing_access));
        // Regions as RemoteMemory do not say what they allow: refused unless the grant is given.
        CHECK_THROWS_WITH_AS(Mesh(a_store, a.pd, a.cq, std::vector<RemoteMemory>{a.mr.remote()}),
                             doctest::Contains("set MeshOptions::connect.remote_access"), Error);
        for (std::size_t i = 0; i < 4096; ++i) a.buffer[i] = std::byte(i * 7);
        REQUIRE_FALSE(a_mesh.peer(1).qp.post_write(a.mr.slice(0, 4096), a_mesh.peer(1).regions.at(0), 8192));
        Completion c = wait_completion(a.cq);
        CHECK(c.ok());
        CHECK(std::equal(a.buffer.begin(), a.buffer.begin() + 4096, b.buffer.begin() + 8192));
        CHECK(a_mesh.find_by_qp(a_mesh.peer(1).qp.qp_num())->rank == 1);
        a_mesh.disconnect(1);
        CHECK(a_mesh.find(1) == nullptr);
    }

    TEST_CASE("PeerWatch reports joins and leaves once each, as an Asio operation, and cancels") {
        RedisServer redis;
        std::string service = fresh("watch");
        RedisRendezvous me(redis.options(service));
        boost::asio::io_context io;
        PeerWatch watch(me, io.get_executor());
        std::vector<PeerEvent> seen;
        boost::system::error_code last;
        auto record = [&](boost::system::error_code ec, PeerEvent e) {
            last = ec;
            if (!ec) seen.push_back(e);
        };
        auto other = std::make_unique<RedisRendezvous>(redis.options(service));
        watch.async_wait_peer(record);
        io.run_for(2s);
        REQUIRE(seen.size() == 1);
        CHECK(seen[0] == PeerEvent{PeerEvent::Kind::joined, 1});
        CHECK(seen[0].describe() == "rank 1 joined");
        other->withdraw(); // a clean leave: seen at the next poll
        io.restart();
        auto asked = Clock::now();
        watch.async_wait_peer(record);
        io.run_for(2s);
        REQUIRE(seen.size() == 2);
        CHECK(seen[1] == PeerEvent{PeerEvent::Kind::left, 1});
        CHECK(Clock::now() - asked < 1s);
        CHECK(watch.known().empty());
        // Nothing more happens: cancel() ends the wait once with operation_aborted.
        io.restart();
        int calls = 0;
        watch.async_wait_peer([&](boost::system::error_code ec, PeerEvent) {
            ++calls;
            last = ec;
        });
        // A second wait while one is pending is refused, never inside the initiating call.
        boost::system::error_code second;
        int second_calls = 0;
        watch.async_wait_peer([&](boost::system::error_code ec, PeerEvent) {
            ++second_calls;
            second = ec;
        });
        CHECK(second_calls == 0);
        io.run_for(200ms);
        CHECK(second_calls == 1);
        CHECK(second == boost::asio::error::in_progress);
        CHECK(calls == 0);
        watch.cancel();
        io.run_for(200ms);
        CHECK(calls == 1);
        CHECK(last == boost::asio::error::operation_aborted);
    }

    TEST_CASE(
        "4 worker processes mesh and exchange; one is killed, the others see it leave and go on; a new one "
        "joins") {
        RedisServer redis;
        std::string service = fresh("workers");
        auto r = rig();
        ::setenv("GPUVERBS_REDIS_PASSWORD", redis.password().c_str(), 1); // NOLINT(concurrency-mt-unsafe)
        std::string worker =
            (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "gpuverbs_mesh_worker").string();
        std::vector<std::unique_ptr<test::ChildProcess>> workers;
        // Under the thread sanitizer on the rig's two emulated CPUs, a worker's
        // refresher thread was once late past 1.5 s with five processes
        // running: its membership expired and the others saw it leave.
#if defined(__SANITIZE_THREAD__)
        constexpr auto ttl = 4000ms;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
        constexpr auto ttl = 4000ms;
#else
        constexpr auto ttl = 1500ms;
#endif
#else
        constexpr auto ttl = 1500ms;
#endif
        auto start = [&](int i) {
            workers.push_back(std::make_unique<test::ChildProcess>(
                std::vector<std::string>{worker, "--store", redis.address(), "--service", service, "--device",
                                         i % 2 == 0 ? r.dev0 : r.dev1, "--ttl-ms", std::to_string(ttl.count())},
                test::ChildProcess::Pipes{}));
        };
        std::vector<int> ranks;
        for (int i = 0; i < 4; ++i) {
            start(i);
            auto joined = workers.back()->read_until("joined ", Clock::now() + 10s);
            REQUIRE(joined);
            ranks.push_back(std::stoi(joined->substr(7)));
        }
        CHECK(ranks == std::vector<int>{0, 1, 2, 3});
        // Each connects to the three others, whatever the order of arrival.
        auto expect_connected = [&](std::size_t w, int how_many) {
            std::set<std::string> peers;
            std::string skipped;
            while (static_cast<int>(peers.size()) < how_many) {
                auto line = workers[w]->read_until("connected ", Clock::now() + 15s, &skipped);
                REQUIRE_MESSAGE(line,
                                "worker " << w << " connected to " << peers.size() << " peers; it said: " << skipped);
                peers.insert(*line);
            }
        };
        for (std::size_t w = 0; w < 4; ++w) expect_connected(w, 3);
        auto round = [&](const std::vector<std::size_t>& who, int k, const std::string& peers_of_first) {
            for (std::size_t w : who) workers[w]->write_line("round " + std::to_string(k));
            for (std::size_t w : who) {
                std::string skipped;
                auto ok = workers[w]->read_until("round " + std::to_string(k) + " ok", Clock::now() + 15s, &skipped);
                if (!ok) {
                    workers[w]->write_line("status");
                    if (auto s = workers[w]->read_until("status", Clock::now() + 2s)) skipped += *s;
                }
                REQUIRE_MESSAGE(ok, "worker " << w << " round " << k << ": " << skipped);
                if (w == who.front()) CHECK(*ok == "round " + std::to_string(k) + " ok peers=" + peers_of_first);
            }
        };
        round({0, 1, 2, 3}, 1, "1,2,3");

        // Rank 2 crashes: the others see it leave within ttl + poll interval.
        auto killed = Clock::now();
        workers[2]->kill();
        REQUIRE(workers[2]->wait(5s) == 128 + SIGKILL);
        for (std::size_t w : {0u, 1u, 3u}) {
            auto left = workers[w]->read_until("left 2", Clock::now() + 10s);
            REQUIRE_MESSAGE(left, "worker " << w << " never saw rank 2 leave");
            auto after = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed);
            MESSAGE("worker " << w << " saw rank 2 leave after " << after.count() << " ms (bound: ttl " << ttl.count()
                              << " + poll 50)");
            CHECK(after < ttl + 50ms + 3s); // the bound, with room for a loaded emulated machine
        }
        round({0, 1, 3}, 2, "1,3");

        // A new worker joins (rank 4) and everyone connects to it.
        start(4);
        auto joined = workers.back()->read_until("joined ", Clock::now() + 10s);
        REQUIRE(joined);
        CHECK(*joined == "joined 4");
        expect_connected(4, 3);
        for (std::size_t w : {0u, 1u, 3u}) REQUIRE(workers[w]->read_until("connected 4", Clock::now() + 15s));
        round({0, 1, 3, 4}, 3, "1,3,4");
        for (std::size_t w : {0u, 1u, 3u, 4u}) {
            workers[w]->write_line("quit");
            CHECK(workers[w]->wait(10s) == 0);
        }
        ::unsetenv("GPUVERBS_REDIS_PASSWORD"); // NOLINT(concurrency-mt-unsafe)
    }
}

namespace {

/// A rendezvous of the user's own with no throwing form at all (so Mesh can
/// only call its error_code forms): one table shared by the members of this
/// process, and a switch that makes an operation fail the way a store would.
class SharedTable {
public:
    enum class Failing { nothing, publish, lookup };
    SharedTable(std::map<std::pair<std::uint32_t, std::string>, std::vector<std::byte>>& table, std::mutex& mutex,
                std::uint32_t rank)
        : table_(&table), mutex_(&mutex), rank_(rank) {}
    Failing failing = Failing::nothing;
    [[nodiscard]] std::uint32_t rank() const { return rank_; }
    [[nodiscard]] std::uint32_t world_size() const { return 2; }
    [[nodiscard]] std::string name() const { return "the shared table"; }
    void publish(const std::string& key, std::span<const std::byte> value, std::error_code& ec, Diagnostics& d) {
        if (failing == Failing::publish) {
            ec = errc::rendezvous_unavailable;
            d.set(ec, "SharedTable::publish", "the table is read-only now");
            return;
        }
        std::lock_guard lock(*mutex_);
        (*table_)[{rank_, key}] = std::vector<std::byte>(value.begin(), value.end());
        ec.clear();
        d.clear();
    }
    void fence(std::chrono::milliseconds, std::error_code& ec, Diagnostics& d) {
        ec.clear();
        d.clear();
    }
    std::vector<std::byte> lookup(std::uint32_t peer, const std::string& key, std::chrono::milliseconds timeout,
                                  std::error_code& ec, Diagnostics& d) {
        for (auto until = Clock::now() + timeout;; std::this_thread::sleep_for(1ms)) {
            if (failing != Failing::lookup) {
                std::lock_guard lock(*mutex_);
                if (auto it = table_->find({peer, key}); it != table_->end()) {
                    ec.clear();
                    d.clear();
                    return it->second;
                }
            }
            if (Clock::now() >= until) break;
        }
        ec = errc::peer_missing;
        d.set(ec, "SharedTable::lookup", "rank " + std::to_string(peer) + " published no '" + key + "'");
        return {};
    }
    void withdraw(std::error_code& ec, Diagnostics& d) {
        ec.clear();
        d.clear();
    }

private:
    std::map<std::pair<std::uint32_t, std::string>, std::vector<std::byte>>* table_;
    std::mutex* mutex_;
    std::uint32_t rank_;
};
static_assert(Rendezvous<SharedTable>);

} // namespace

TEST_SUITE("many peers: a rendezvous of the user's own" * doctest::skip(!test::rig_present())) {
    TEST_CASE("Mesh over error_code forms only: its three forms fail alike with the store's words, then connect") {
        std::map<std::pair<std::uint32_t, std::string>, std::vector<std::byte>> table;
        std::mutex mutex;
        SharedTable store0(table, mutex, 0), store1(table, mutex, 1);
        auto r = rig();
        Member m0(r.dev0), m1(r.dev1);
        MeshOptions options;
        options.timeout = 300ms;
        Mesh mesh0(store0, m0.pd, m0.cq, {m0.mr}, options);
        Mesh mesh1(store1, m1.pd, m1.cq, {m1.mr}, options);

        // The store refuses our record: offer and connect fail, naming it.
        store0.failing = SharedTable::Failing::publish;
        const std::string refused = test::check_fails_alike(
            errc::rendezvous_unavailable,
            [&] {
                mesh0.connect(1);
                return 0;
            },
            [&](std::error_code& ec) {
                mesh0.connect(1, ec);
                return 0;
            },
            [&](std::error_code& ec, Diagnostics& d) {
                mesh0.connect(1, ec, d);
                return 0;
            });
        CHECK(refused ==
              "Mesh: rank 0 connecting to peer 1 through the shared table: SharedTable::publish: the "
              "table is read-only now");
        CHECK(mesh0.offered().empty());

        // The peer's record never comes: peer_missing at the deadline, in the store's words.
        store0.failing = SharedTable::Failing::lookup;
        const std::string missing = test::check_fails_alike(
            errc::peer_missing,
            [&] {
                mesh0.connect(1);
                return 0;
            },
            [&](std::error_code& ec) {
                mesh0.connect(1, ec);
                return 0;
            },
            [&](std::error_code& ec, Diagnostics& d) {
                mesh0.connect(1, ec, d);
                return 0;
            });
        CHECK(missing ==
              "Mesh: rank 0 connecting to peer 1 through the shared table: SharedTable::lookup: rank 1 "
              "published no 'gpuverbs.mesh.to.0'");
        CHECK(mesh0.find(1) == nullptr);

        // The store works again: both connect through the error_code forms, and a write lands.
        store0.failing = SharedTable::Failing::nothing;
        mesh0 = Mesh(store0, m0.pd, m0.cq, {m0.mr}, MeshOptions{});
        {
            std::lock_guard lock(mutex); // the old mesh's record named a queue pair that is gone
            table.clear();
        }
        auto theirs = std::async(std::launch::async, [&] {
            std::error_code ec;
            Diagnostics d;
            mesh1.connect(0, ec, d);
            return d.message();
        });
        std::error_code ec = make_error_code(errc::invalid_argument);
        Diagnostics d = test::stale_diagnostics();
        mesh0.connect(1, ec, d);
        CHECK_MESSAGE(!ec, d.message());
        CHECK(d.message().empty());
        CHECK(theirs.get().empty());
        MeshPeer* peer = mesh0.peer(1, ec, d);
        REQUIRE(peer != nullptr);
        std::memset(m0.buffer.data(), 0x7e, 64);
        REQUIRE_FALSE(peer->qp.post_write(m0.mr.slice(0, 64), peer->regions.at(0)));
        CHECK(wait_completion(m0.cq).ok());
        CHECK(m1.buffer[63] == std::byte{0x7e});
    }
}

TEST_SUITE("many peers: bad input" * doctest::skip(!test::rig_present() || !test::build_has::hiredis)) {
    TEST_CASE(
        "a store entry with garbage bytes, or a wrong wire version: an error naming the peer; the mesh "
        "connects once the peer publishes a good record") {
        RedisServer redis;
        std::string service = fresh("garbage");
        RedisRendezvous me_store(redis.options(service));
        RedisRendezvous peer_store(redis.options(service));
        auto r = rig();
        Member me(r.dev0), peer(r.dev1);
        MeshOptions options;
        options.timeout = 2s;
        Mesh mesh(me_store, me.pd, me.cq, {me.mr}, options);

        std::vector<std::byte> garbage(57, std::byte{0x5a});
        peer_store.publish("gpuverbs.mesh.to.0", garbage);
        try {
            mesh.connect(1);
            FAIL("garbage was accepted");
        } catch (const Error& e) {
            std::string what = e.what();
            INFO(what);
            CHECK(e.code() == errc::malformed_record);
            CHECK(what.find("rank 0 connecting to peer 1 through Redis service '" + service) != std::string::npos);
            CHECK(what.find("its record 'gpuverbs.mesh.to.0' is unusable") != std::string::npos);
            CHECK(what.find(redis.password()) == std::string::npos);
        }

        // A well-formed record of a later version.
        Mesh peer_mesh(peer_store, peer.pd, peer.cq, {peer.mr}, options);
        MeshRecord record{1, wire::max_world_size, {{0, Endpoint{}}}, {}};
        PreparedQueuePair scratch(peer.pd, peer.cq, peer.cq);
        record.endpoints[0].second = scratch.endpoint();
        std::vector<std::byte> bytes = wire::serialize(record);
        bytes[5] = std::byte{99}; // the version's low byte
        peer_store.publish("gpuverbs.mesh.to.0", bytes);
        try {
            mesh.connect(1);
            FAIL("version 99 was accepted");
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == errc::unsupported_version);
            CHECK(std::string(e.what()).find("peer 1") != std::string::npos);
        }

        // A record claiming another rank: two members claim one rank, or a stale entry.
        record.rank = 2;
        peer_store.publish("gpuverbs.mesh.to.0", wire::serialize(record));
        try {
            mesh.connect(1);
            FAIL("rank 2's record was accepted as rank 1's");
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == errc::malformed_record);
            CHECK(std::string(e.what()).find("the record is rank 2's, not rank 1's") != std::string::npos);
        }

        // The mesh is still usable: the peer publishes its real record, both
        // connect (ours blocks until the peer's side says it is ready).
        peer_mesh.offer(0);
        auto ours = std::async(std::launch::async, [&] { mesh.connect(1); });
        std::vector<std::uint32_t> theirs;
        for (auto until = Clock::now() + 5s; theirs.empty() && Clock::now() < until;) {
            theirs = peer_mesh.complete_offers().connected;
        }
        CHECK(theirs == std::vector<std::uint32_t>{0});
        ours.get();
        CHECK(mesh.peer(1).qp.remote_endpoint().qp_num == peer_mesh.peer(0).qp.qp_num());
    }

    TEST_CASE(
        "a peer that never publishes: peer_missing at the deadline; one that publishes and never answers: "
        "the first write fails with retries exhausted") {
        RedisServer redis;
        std::string service = fresh("silent");
        RedisRendezvous me_store(redis.options(service));
        RedisRendezvous silent(redis.options(service));
        auto r = rig();
        Member me(r.dev0), peer(r.dev1);
        MeshOptions options;
        options.timeout = 500ms;
        options.connect.timeout = 12; // 16.8 ms ACK timeout
        options.connect.retry_count = 1;
        Mesh mesh(me_store, me.pd, me.cq, {me.mr}, options);
        auto asked = Clock::now();
        try {
            mesh.connect(1);
            FAIL("connected to a peer that published nothing");
        } catch (const Error& e) {
            std::string what = e.what();
            INFO(what);
            CHECK(e.code() == errc::peer_missing);
            CHECK(what.find("rank 1 is a live member of Redis service") != std::string::npos);
            CHECK(what.find("did not publish 'gpuverbs.mesh.to.0' within") != std::string::npos);
        }
        auto took = Clock::now() - asked;
        CHECK(took >= 500ms);
        CHECK(took < 5s);                                       // the deadline, not a hang
        CHECK(mesh.offered() == std::vector<std::uint32_t>{1}); // can be asked again

        // It publishes a record for us but never connects its own side: our
        // side connects, theirs never says it is ready.
        Mesh silent_mesh(silent, peer.pd, peer.cq, {peer.mr}, options);
        silent_mesh.offer(0);
        try {
            mesh.connect(1);
            FAIL("the peer never connected, yet connect() returned");
        } catch (const Error& e) {
            std::string what = e.what();
            INFO(what);
            CHECK(e.code() == errc::peer_missing);
            CHECK(what.find("our side is connected, the peer's did not say it was") != std::string::npos);
            CHECK(what.find("did not publish 'gpuverbs.mesh.ready.0'") != std::string::npos);
        }
        // Writing to it anyway: retries exhausted, the peer named by the error's words.
        REQUIRE(mesh.find(1) != nullptr);
        REQUIRE_FALSE(mesh.peer(1).qp.post_write(me.mr.slice(0, 64), mesh.peer(1).regions.at(0)));
        Completion c = wait_completion(me.cq);
        CHECK(c.status == make_wc_error(IBV_WC_RETRY_EXC_ERR));
    }

    TEST_CASE("a duplicated rank is refused, naming it; a full world too; fence names the missing ranks") {
        RedisServer redis;
        std::string service = fresh("dup");
        RedisOptions fixed = redis.options(service);
        fixed.rank = 1;
        RedisRendezvous first(fixed);
        try {
            RedisRendezvous second(fixed);
            FAIL("two members hold rank 1");
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == errc::rank_taken);
            CHECK(std::string(e.what()).find("rank 1 of Redis service '" + service) != std::string::npos);
        }
        // A fixed world of 2: the next member takes the lowest free rank, a third finds it full.
        RedisOptions world = redis.options(service);
        world.world_size = 2;
        RedisRendezvous zero(world);
        CHECK(zero.rank() == 0);
        try {
            RedisRendezvous third(world);
            FAIL("a third member joined a world of 2");
        } catch (const Error& e) {
            CHECK(e.code() == errc::rank_taken);
            CHECK(std::string(e.what()).find("all 2 ranks") != std::string::npos);
        }
        // A world of 3 with ranks 0 and 1 present: fence waits, then names rank 2.
        world.world_size = 3;
        world.rank = 0;
        zero.withdraw();
        RedisRendezvous member(world);
        try {
            member.fence(300ms);
            FAIL("fence passed with a rank missing");
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == errc::peer_missing);
            CHECK(std::string(e.what()).find("1 of 3 ranks did not join within 300 ms (missing: 2)") !=
                  std::string::npos);
        }
    }

    TEST_CASE("Redis down at start, wrong or missing password, an ACL user: clear errors, never the password") {
        RedisServer redis;
        RedisOptions options = redis.options(fresh("auth"));
        options.password = "not-" + redis.password();
        try {
            RedisRendezvous store(options);
            FAIL("a wrong password was accepted");
        } catch (const Error& e) {
            std::string what = e.what();
            INFO(what);
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK(what.find("refused the credentials") != std::string::npos);
            CHECK(what.find(options.password) == std::string::npos);
        }
        // An ACL user: its own password works, the default user's does not.
        options.user = "mesh-acl";
        options.password = "acl-" + redis.password();
        {
            RedisRendezvous store(options);
            CHECK(store.members() == std::vector<std::uint32_t>{store.rank()});
        }
        options.password = redis.password();
        try {
            RedisRendezvous store(options);
            FAIL("user mesh-acl was accepted with another's password");
        } catch (const Error& e) {
            std::string what = e.what();
            INFO(what);
            CHECK(what.find("refused the credentials of user 'mesh-acl'") != std::string::npos);
            CHECK(what.find(redis.password()) == std::string::npos);
        }
        options.user.clear();
        options.password.clear();
        try {
            RedisRendezvous store(options);
            FAIL("no password was accepted");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find("it needs a password") != std::string::npos);
        }
        redis.stop();
        options = redis.options(fresh("down"));
        auto asked = Clock::now();
        try {
            RedisRendezvous store(options);
            FAIL("joined a store that is down");
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK(std::string(e.what()).find("cannot reach Redis at " + redis.address()) != std::string::npos);
        }
        CHECK(Clock::now() - asked < 5s);
    }

    TEST_CASE("Redis going down mid-run: the watch and a connect fail with the store named; nothing hangs") {
        RedisServer redis;
        std::string service = fresh("midrun");
        auto store = std::make_unique<RedisRendezvous>(redis.options(service));
        auto r = rig();
        Member me(r.dev0);
        MeshOptions options;
        options.timeout = 3s;
        Mesh mesh(*store, me.pd, me.cq, {me.mr}, options);
        boost::asio::io_context io;
        PeerWatch watch(*store, io.get_executor());
        boost::system::error_code watch_error;
        int calls = 0;
        watch.async_wait_peer([&](boost::system::error_code ec, PeerEvent) {
            ++calls;
            watch_error = ec;
        });
        io.run_for(200ms);
        CHECK(calls == 0);
        redis.stop();
        auto stopped = Clock::now();
        io.run_for(5s);
        CHECK(calls == 1);
        CHECK(watch_error == detail::to_asio_error(errc::rendezvous_unavailable));
        CHECK(watch.diagnostics().message().find("Redis at " + redis.address()) != std::string::npos);
        CHECK(Clock::now() - stopped < 5s);
        try {
            mesh.connect(1);
            FAIL("connected with the store down");
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == errc::rendezvous_unavailable);
            CHECK(std::string(e.what()).find("peer 1") != std::string::npos);
        }
        auto leaving = Clock::now();
        store.reset(); // withdrawing fails quietly: the keys expire by themselves
        CHECK(Clock::now() - leaving < 5s);
    }
}
