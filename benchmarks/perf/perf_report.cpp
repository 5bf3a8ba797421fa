// gpuverbs-perf's arguments and its outputs: a perftest-like table, JSON, CSV, SVG.
#include "perf_options.hpp"

#include "command_line.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace perf {

const char* name_of(Mode m) {
    switch (m) {
        case Mode::write_bw: return "write_bw";
        case Mode::read_bw: return "read_bw";
        case Mode::send_bw: return "send_bw";
        case Mode::write_lat: return "write_lat";
        case Mode::send_lat: return "send_lat";
    }
    return "?";
}

bool is_latency(Mode m) {
    return m == Mode::write_lat || m == Mode::send_lat;
}

namespace {

std::optional<Mode> mode_of(const std::string& name) {
    for (Mode m : {Mode::write_bw, Mode::read_bw, Mode::send_bw, Mode::write_lat, Mode::send_lat}) {
        if (name == name_of(m)) return m;
    }
    return std::nullopt;
}

// perftest's numbers: decimal, with an optional K or M suffix (x 1024, x 1024^2).
std::optional<std::size_t> number(const char* s) {
    char* end = nullptr;
    unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s) return std::nullopt;
    switch (*end) {
        case 'K':
        case 'k':
            v <<= 10;
            ++end;
            break;
        case 'M':
        case 'm':
            v <<= 20;
            ++end;
            break;
        default: break;
    }
    if (*end != '\0') return std::nullopt;
    return static_cast<std::size_t>(v);
}

// Rewrites "64K" as "65536" before CLI11 converts it (and checks its range).
CLI::Validator suffixed() {
    return CLI::Validator(
        [](std::string& s) -> std::string {
            auto n = number(s.c_str());
            if (!n) return "'" + s + "' is not a number (decimal, K or M suffix allowed)";
            s = std::to_string(*n);
            return {};
        },
        "");
}

} // namespace

std::optional<int> parse(int argc, char** argv, Options& o) {
    tools::CommandLine cli("gpuverbs-perf",
                           "perftest's measurements (ib_write_bw, ib_read_bw, ib_send_bw, ib_write_lat, ib_send_lat)\n"
                           "made with gpuverbs, on host or GPU memory.",
                           64);
    cli.usage({{"MODE server [options]", "wait for the client, which chooses sizes and iterations"},
               {"MODE client HOST [options]", "connect to the server at HOST, measure, report"},
               {"MODE loopback --device D0 --device2 D1 [options]", "both ends in this process, over 127.0.0.1"}});
    CLI::App& app = cli.app;
    std::string mode, role, host;
    app.add_option("MODE", mode, "write_bw, read_bw, send_bw, write_lat or send_lat")
        ->required()
        ->check([](const std::string& m) { return mode_of(m) ? std::string() : "unknown mode '" + m + "'"; });
    app.add_option("ROLE", role, "server, client or loopback")->required()->check([](const std::string& r) {
        return r == "server" || r == "client" || r == "loopback" ? std::string()
                                                                 : "the role is server, client HOST or loopback";
    });
    app.add_option("HOST", host, "client: the server's address");

    std::string group = "Connection";
    app.add_option("--device", o.device, "RDMA device (default: the first)")->type_name("D")->group(group);
    app.add_option("--device2", o.device2, "the second device (loopback)")->type_name("D")->group(group);
    app.add_option("--port", o.tcp_port, "TCP port of the bootstrap")
        ->type_name("P")
        ->transform(suffixed())
        ->group(group);
    app.add_option("--ib-port", o.ib_port, "RDMA port")
        ->type_name("N")
        ->transform(suffixed())
        ->default_str(std::to_string(o.ib_port)) // a std::uint8_t would show as a character
        ->group(group);
    int mtu = 0;
    app.add_option("--mtu", mtu, "path MTU: 256, 512, 1024, 2048 or 4096")
        ->type_name("N")
        ->transform(suffixed())
        ->default_str("the ports' active MTU")
        ->group(group);

    group = "Sizes and iterations";
    std::size_t size = o.sizes.front(), min_size = 2, max_size = 8 << 20;
    bool sweep = false;
    app.add_option("--size", size, "one message size (K, M suffixes)")
        ->type_name("N")
        ->transform(suffixed())
        ->group(group);
    app.add_flag("--sweep", sweep, "sizes 2 B .. 8 MiB, powers of two")->group(group);
    app.add_option("--min-size", min_size, "sweep from N")->type_name("N")->transform(suffixed())->group(group);
    app.add_option("--max-size", max_size, "sweep up to N")
        ->type_name("N")
        ->transform(suffixed())
        ->default_str("8M")
        ->group(group);
    app.add_option("--iters", o.iterations, "messages per size")
        ->type_name("N")
        ->transform(suffixed())
        ->default_str("5000 for bandwidth, 1000 for latency")
        ->group(group);
    app.add_option("--duration", o.duration,
                   "about S seconds per size instead of --iters (a short probe sets the count)")
        ->type_name("S")
        ->check(CLI::Validator(
            [](std::string& s) { return std::atof(s.c_str()) > 0 ? std::string() : "'" + s + "' is not positive"; },
            ""))
        ->default_str("")
        ->group(group);

    group = "Queues";
    app.add_option("--tx-depth", o.tx_depth, "requests in flight")->type_name("N")->transform(suffixed())->group(group);
    app.add_option("--rx-depth", o.rx_depth, "receives posted ahead (send_bw, latency)")
        ->type_name("N")
        ->transform(suffixed())
        ->group(group);
    app.add_option("--inline", o.inline_size, "sizes up to N go inline")
        ->type_name("N")
        ->transform(suffixed())
        ->group(group);
    app.add_option("--batch", o.batch, "requests per doorbell (SendBatch, at most 32)")
        ->type_name("N")
        ->transform(suffixed())
        ->group(group);
    app.add_option("--signal-every", o.signal_every, "selective signaling: one signaled request per N")
        ->type_name("N")
        ->transform(suffixed())
        ->group(group);

    group = "Memory";
    int gpu = 0;
    app.add_option("--gpu", gpu, "GPU memory on CUDA device N")
        ->type_name("N")
        ->transform(suffixed())
        ->default_str("host memory")
        ->group(group);
    app.add_option("--registration", o.registration, "how GPU memory is registered: auto, dmabuf or peermem")
        ->type_name("R")
        ->group(group);

    group = "Output";
    bool json = false, csv = false;
    auto* json_flag = app.add_flag("--json", json, "JSON instead of the table")->group(group);
    app.add_flag("--csv", csv, "CSV instead of the table")->group(group)->excludes(json_flag);
    app.add_option("--svg", o.svg, "also plot bandwidth or latency against size into FILE")
        ->type_name("FILE")
        ->group(group);
    app.add_flag_callback(
           "--no-progress", [&] { o.progress = false; }, "no progress line on a terminal")
        ->group(group);
    app.footer(
        "Both sides must be started with the same MODE; the client chooses sizes and iterations\n"
        "(the server's buffer must hold the largest size: give it the same --size or --max-size).\n"
        "Exit status: 0 done, 1 a failure while running, 2 GPU memory cannot be registered, 64 bad arguments.");

    if (auto status = cli.parse(argc, argv)) return status;

    o.mode = *mode_of(mode);
    o.role = role == "server" ? Role::server : role == "loopback" ? Role::loopback : Role::client;
    if (o.role == Role::client && host.empty()) return cli.fail("the role is server, client HOST or loopback");
    if (o.role != Role::client && !host.empty()) return cli.fail("unknown argument '" + host + "'");
    o.host = host;
    if (app.count("--size") != 0) o.sizes = {size};
    if (app.count("--mtu") != 0) o.mtu = mtu;
    if (app.count("--gpu") != 0) o.gpu = gpu;
    if (json) o.output = Options::Output::json;
    if (csv) o.output = Options::Output::csv;
    if (app.count("--min-size") != 0 || app.count("--max-size") != 0) sweep = true;
    if (sweep) {
        o.sizes.clear();
        for (std::size_t s = 1; s <= max_size; s *= 2) {
            if (s >= min_size) o.sizes.push_back(s);
        }
    }
    if (o.sizes.empty() || o.sizes.front() == 0) return cli.fail("message sizes must be at least 1 byte");
    if (o.tx_depth == 0 || o.batch == 0 || o.signal_every == 0 || o.rx_depth == 0) {
        return cli.fail("depths, --batch and --signal-every must be at least 1");
    }
    if (o.signal_every > o.tx_depth)
        return cli.fail("--signal-every must not exceed --tx-depth (the queue would fill)");
    if (o.batch > 32) return cli.fail("--batch is at most 32 (SendBatch::max_requests)");
    if (o.mtu && (*o.mtu < 256 || *o.mtu > 4096 || (*o.mtu & (*o.mtu - 1)) != 0)) {
        return cli.fail("--mtu is 256, 512, 1024, 2048 or 4096");
    }
    if (o.role == Role::loopback && o.device2.empty()) return cli.fail("loopback needs --device and --device2");
    if (o.iterations == 0) o.iterations = is_latency(o.mode) ? 1000 : 5000;
    return std::nullopt;
}

std::string table(const Options& o, const std::vector<Result>& rows) {
    std::string out;
    char line[256];
    std::snprintf(line, sizeof line, "# gpuverbs-perf %s, tx depth %u, batch %u, signal every %u, inline <= %u\n",
                  name_of(o.mode), o.tx_depth, o.batch, o.signal_every, o.inline_size);
    out += line;
    if (is_latency(o.mode)) {
        out +=
            " #bytes  #iterations  t_min[usec]  t_max[usec]  t_typical[usec]  t_avg[usec]  t_stdev[usec]  "
            "99% percentile[usec]\n";
        for (const auto& r : rows) {
            std::snprintf(line, sizeof line, " %-7zu %-12u %-12.2f %-12.2f %-16.2f %-12.2f %-14.2f %.2f\n", r.bytes,
                          r.iterations, r.lat_min, r.lat_max, r.lat_typical, r.lat_avg, r.lat_stdev, r.lat_p99);
            out += line;
        }
    } else {
        out += " #bytes  #iterations  BW average[MiB/sec]  MsgRate[Mpps]\n";
        for (const auto& r : rows) {
            std::snprintf(line, sizeof line, " %-7zu %-12u %-20.2f %.6f\n", r.bytes, r.iterations, r.bw_mib_s,
                          r.msg_rate_mpps);
            out += line;
        }
    }
    return out;
}

std::string json(const Options& o, const std::vector<Result>& rows) {
    std::string out = std::string("{\"tool\": \"gpuverbs-perf\", \"mode\": \"") + name_of(o.mode) +
                      "\", \"memory\": \"" + (o.gpu ? "gpu" : "host") + "\", \"results\": [";
    char item[512];
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        std::snprintf(item, sizeof item,
                      "%s\n  {\"bytes\": %zu, \"iterations\": %u, \"seconds\": %.6f, \"bw_mib_s\": %.3f, "
                      "\"msg_rate_mpps\": %.9f, \"lat_min_us\": %.3f, \"lat_typical_us\": %.3f, \"lat_avg_us\": %.3f, "
                      "\"lat_p99_us\": %.3f, \"lat_max_us\": %.3f, \"lat_stdev_us\": %.3f}",
                      i ? "," : "", r.bytes, r.iterations, r.seconds, r.bw_mib_s, r.msg_rate_mpps, r.lat_min,
                      r.lat_typical, r.lat_avg, r.lat_p99, r.lat_max, r.lat_stdev);
        out += item;
    }
    return out + "\n]}\n";
}

std::string csv(const Options& o, const std::vector<Result>& rows) {
    std::string out =
        "mode,bytes,iterations,seconds,bw_mib_s,msg_rate_mpps,lat_min_us,lat_typical_us,lat_avg_us,"
        "lat_p99_us,lat_max_us,lat_stdev_us\n";
    char line[256];
    for (const auto& r : rows) {
        std::snprintf(line, sizeof line, "%s,%zu,%u,%.6f,%.3f,%.9f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", name_of(o.mode),
                      r.bytes, r.iterations, r.seconds, r.bw_mib_s, r.msg_rate_mpps, r.lat_min, r.lat_typical,
                      r.lat_avg, r.lat_p99, r.lat_max, r.lat_stdev);
        out += line;
    }
    return out;
}

std::string svg(const Options& o, const std::vector<Result>& rows) {
    // x: log2(bytes); y: bandwidth (MiB/s) or typical latency (us), linear from 0.
    const double w = 640, h = 400, left = 70, bottom = 50, top = 30, right = 20;
    bool lat = is_latency(o.mode);
    double ymax = 0;
    for (const auto& r : rows) ymax = std::max(ymax, lat ? r.lat_typical : r.bw_mib_s);
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    double xmin = rows.empty() ? 0 : std::log2(double(rows.front().bytes));
    double xmax = rows.empty() ? 1 : std::log2(double(rows.back().bytes));
    if (xmax <= xmin) xmax = xmin + 1;
    auto X = [&](std::size_t b) { return left + (std::log2(double(b)) - xmin) / (xmax - xmin) * (w - left - right); };
    auto Y = [&](double v) { return h - bottom - v / ymax * (h - bottom - top); };
    char buf[256];
    std::string out;
    std::snprintf(buf, sizeof buf,
                  "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                  "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                  w, h);
    out += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"18\">gpuverbs-perf %s (%s memory)</text>\n", left,
                  name_of(o.mode), o.gpu ? "GPU" : "host");
    out += buf;
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n"
                  "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n",
                  left, h - bottom, w - right, h - bottom, left, top, left, h - bottom);
    out += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\">message size (bytes, log scale)</text>\n", w / 2 - 80,
                  h - 10);
    out += buf;
    std::snprintf(buf, sizeof buf, "<text x=\"12\" y=\"%.0f\" transform=\"rotate(-90 12 %.0f)\">%s</text>\n", h / 2,
                  h / 2, lat ? "typical latency (us)" : "bandwidth (MiB/s)");
    out += buf;
    for (int t = 0; t <= 4; ++t) {
        double v = ymax * t / 4;
        std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.0f</text>\n", left - 5,
                      Y(v) + 4, v);
        out += buf;
    }
    std::string points;
    for (const auto& r : rows) {
        std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(r.bytes), Y(lat ? r.lat_typical : r.bw_mib_s));
        points += buf;
        std::snprintf(buf, sizeof buf,
                      "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" font-size=\"9\">%zu</text>\n", X(r.bytes),
                      h - bottom + 14, r.bytes);
        out += buf;
    }
    out += "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"" + points + "\"/>\n</svg>\n";
    return out;
}

} // namespace perf
