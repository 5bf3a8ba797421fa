// gpuverbs-perf's command line and its results, shared by the runner and the
// report writers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace perf {

enum class Mode { write_bw, read_bw, send_bw, write_lat, send_lat };
const char* name_of(Mode m);
bool is_latency(Mode m);

enum class Role { server, client, loopback };

struct Options {
    Mode mode = Mode::write_bw;
    Role role = Role::client;
    std::string host;            // client: the server's address
    std::string device, device2; // RDMA device (and the second one for --loopback)
    std::uint16_t tcp_port = 18600;
    std::uint8_t ib_port = 1;
    std::vector<std::size_t> sizes{65536};
    std::uint32_t iterations = 0;   // 0: the mode's default
    double duration = 0;            // seconds per size instead of --iters (a short probe run sets the count)
    std::uint32_t tx_depth = 128;   // send-side requests in flight
    std::uint32_t rx_depth = 512;   // receives posted ahead (send_bw, latency)
    std::uint32_t inline_size = 0;  // sizes up to this go inline
    std::uint32_t batch = 1;        // requests per doorbell (SendBatch)
    std::uint32_t signal_every = 1; // one signaled request per N
    std::optional<int> mtu;         // 256..4096; default: the ports' active MTU
    std::optional<int> gpu;         // GPU memory on this CUDA device
    std::string registration = "auto";
    enum class Output { table, json, csv } output = Output::table;
    std::string svg; // write a plot here
    bool progress = true;
};

/// Parses argv into `o`. Nothing: go on. Otherwise the exit status: 0 after
/// --help, 64 for bad arguments (having said why).
std::optional<int> parse(int argc, char** argv, Options& o);

/// One size's measurement.
struct Result {
    std::size_t bytes = 0;
    std::uint32_t iterations = 0;
    double seconds = 0;
    double bw_mib_s = 0;      // bandwidth modes (MiB/s, as perftest's "MB/sec")
    double msg_rate_mpps = 0; // bandwidth modes
    // latency modes: one way, microseconds (half the round trip, as perftest)
    double lat_min = 0, lat_typical = 0, lat_avg = 0, lat_p99 = 0, lat_max = 0, lat_stdev = 0;
};

std::string table(const Options& o, const std::vector<Result>& r);
std::string json(const Options& o, const std::vector<Result>& r);
std::string csv(const Options& o, const std::vector<Result>& r);
std::string svg(const Options& o, const std::vector<Result>& r);

} // namespace perf
