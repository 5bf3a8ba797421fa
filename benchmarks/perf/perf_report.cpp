// gpuverbs-perf's arguments and its outputs: a perftest-like table, JSON, CSV, SVG.
#include "perf_options.hpp"

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

const char* usage =
    "usage: gpuverbs-perf MODE server [options]\n"
    "       gpuverbs-perf MODE client HOST [options]\n"
    "       gpuverbs-perf MODE loopback --device D0 --device2 D1 [options]\n"
    "MODE: write_bw read_bw send_bw write_lat send_lat\n"
    "  --device D        RDMA device (default: the first)      --device2 D   the second (loopback)\n"
    "  --port P          TCP port of the bootstrap (18600)     --ib-port N   RDMA port (1)\n"
    "  --size N          one message size (65536)              --sweep       2 B .. 8 MiB, powers of two\n"
    "  --min-size N --max-size N   sweep bounds\n"
    "  --iters N         messages per size (bw 5000, lat 1000) --tx-depth N  requests in flight (128)\n"
    "  --duration S      about S seconds per size instead of --iters (a short probe run sets the count)\n"
    "  --duration S      about S seconds per size instead of --iters (a short probe run sets the count)\n"
    "  --rx-depth N      receives posted ahead (512)           --inline N    sizes up to N go inline\n"
    "  --batch N         requests per doorbell (1)             --signal-every N  selective signaling (1)\n"
    "  --mtu N           256|512|1024|2048|4096                --gpu N       GPU memory on CUDA device N\n"
    "  --registration auto|dmabuf|peermem                      --json | --csv   machine-readable output\n"
    "  --svg FILE        plot bandwidth or latency against size --no-progress\n"
    "Both sides must be started with the same MODE; the client chooses sizes and iterations\n"
    "(the server's buffer must hold the largest size: give it the same --size or --max-size).\n";

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

} // namespace

std::optional<Options> parse(int argc, char** argv) {
    Options o;
    auto fail = [](const std::string& why) -> std::optional<Options> {
        std::fprintf(stderr, "gpuverbs-perf: %s\n%s", why.c_str(), usage);
        return std::nullopt;
    };
    if (argc < 3) return fail("a mode and a role are needed");
    std::string mode = argv[1];
    if (mode == "write_bw")
        o.mode = Mode::write_bw;
    else if (mode == "read_bw")
        o.mode = Mode::read_bw;
    else if (mode == "send_bw")
        o.mode = Mode::send_bw;
    else if (mode == "write_lat")
        o.mode = Mode::write_lat;
    else if (mode == "send_lat")
        o.mode = Mode::send_lat;
    else
        return fail("unknown mode '" + mode + "'");
    std::string role = argv[2];
    int i = 3;
    if (role == "server")
        o.role = Role::server;
    else if (role == "loopback")
        o.role = Role::loopback;
    else if (role == "client" && argc > 3) {
        o.role = Role::client;
        o.host = argv[i++];
    } else
        return fail("the role is server, client HOST or loopback");
    bool sweep = false;
    std::size_t min_size = 2, max_size = 8 << 20;
    for (; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        auto num = [&](auto& out) {
            const char* v = value();
            auto n = v ? number(v) : std::nullopt;
            if (!n) return false;
            out = static_cast<std::remove_reference_t<decltype(out)>>(*n);
            return true;
        };
        bool ok = true;
        if (a == "--device") {
            const char* v = value();
            ok = v;
            if (v) o.device = v;
        } else if (a == "--device2") {
            const char* v = value();
            ok = v;
            if (v) o.device2 = v;
        } else if (a == "--port")
            ok = num(o.tcp_port);
        else if (a == "--ib-port")
            ok = num(o.ib_port);
        else if (a == "--size") {
            std::size_t s = 0;
            ok = num(s);
            o.sizes = {s};
        } else if (a == "--sweep")
            sweep = true;
        else if (a == "--min-size") {
            ok = num(min_size);
            sweep = true;
        } else if (a == "--max-size") {
            ok = num(max_size);
            sweep = true;
        } else if (a == "--iters")
            ok = num(o.iterations);
        else if (a == "--duration") {
            const char* v = value();
            ok = v != nullptr && std::atof(v) > 0;
            if (ok) o.duration = std::atof(v);
        } else if (a == "--tx-depth")
            ok = num(o.tx_depth);
        else if (a == "--rx-depth")
            ok = num(o.rx_depth);
        else if (a == "--inline")
            ok = num(o.inline_size);
        else if (a == "--batch")
            ok = num(o.batch);
        else if (a == "--signal-every")
            ok = num(o.signal_every);
        else if (a == "--mtu") {
            int m = 0;
            ok = num(m);
            o.mtu = m;
        } else if (a == "--gpu") {
            int g = 0;
            ok = num(g);
            o.gpu = g;
        } else if (a == "--registration") {
            const char* v = value();
            ok = v;
            if (v) o.registration = v;
        } else if (a == "--json")
            o.output = Options::Output::json;
        else if (a == "--csv")
            o.output = Options::Output::csv;
        else if (a == "--svg") {
            const char* v = value();
            ok = v;
            if (v) o.svg = v;
        } else if (a == "--no-progress")
            o.progress = false;
        else
            return fail("unknown option '" + a + "'");
        if (!ok) return fail("option " + a + " needs a valid value");
    }
    if (sweep) {
        o.sizes.clear();
        for (std::size_t s = 1; s <= max_size; s *= 2) {
            if (s >= min_size) o.sizes.push_back(s);
        }
    }
    if (o.sizes.empty() || o.sizes.front() == 0) return fail("message sizes must be at least 1 byte");
    if (o.tx_depth == 0 || o.batch == 0 || o.signal_every == 0 || o.rx_depth == 0) {
        return fail("depths, --batch and --signal-every must be at least 1");
    }
    if (o.signal_every > o.tx_depth) return fail("--signal-every must not exceed --tx-depth (the queue would fill)");
    if (o.batch > 32) return fail("--batch is at most 32 (SendBatch::max_requests)");
    if (o.mtu && (*o.mtu < 256 || *o.mtu > 4096 || (*o.mtu & (*o.mtu - 1)) != 0)) {
        return fail("--mtu is 256, 512, 1024, 2048 or 4096");
    }
    if (o.role == Role::loopback && o.device2.empty()) return fail("loopback needs --device and --device2");
    if (o.iterations == 0) o.iterations = is_latency(o.mode) ? 1000 : 5000;
    return o;
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
