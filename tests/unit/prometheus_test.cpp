// The Prometheus text: checked by the Prometheus client's own parser, label
// values escaped, hardware counters read from a sysfs-like directory. The
// counters of real queue pairs and rails are checked against the work done
// on Soft-RoCE (integration/observability_test.cpp).
#include "gpuverbs/observability/prometheus.hpp"
#include "gpuverbs/transfers/rail_group.hpp"
#include "gpuverbs/verbs/device.hpp"
#include "gpuverbs/verbs/queue_pair.hpp"

#include "prometheus_parse.hpp"
#include "scratch_dir.hpp"
#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

using namespace gpuverbs;

TEST_SUITE("prometheus text") {
    TEST_CASE(
        "hardware counters from a directory, an awkward device name, an empty queue pair: the reference "
        "parser reads every sample back") {
        const std::filesystem::path dir =
            std::filesystem::temp_directory_path() / ("gpuverbs-hw-" + std::to_string(::getpid()));
        std::filesystem::create_directories(dir);
        std::ofstream(dir / "retry_exceeded_err") << "3\n";
        std::ofstream(dir / "rcvd_pkts") << "123456789012\n";
        std::ofstream(dir / "garbage") << "not a number\n"; // skipped
        PrometheusText metrics;
        metrics.add_port_from("rx\"e\\0\n", 1, dir.string());
        metrics.add_port_from("rxe9", 2, (dir / "missing").string()); // no directory: no samples, no error
        metrics.add("empty", QueuePair());
        const std::string text = metrics.text();
        std::filesystem::remove_all(dir);
        CHECK(text.find("# TYPE gpuverbs_port_hw_counter untyped\n") != std::string::npos);
        CHECK(text.find("device=\"rx\\\"e\\\\0\\n\"") != std::string::npos); // escaped as the format says
        CHECK(text.find("garbage") == std::string::npos);
        const test::ParsedMetrics parsed = test::parse_prometheus(text);
        REQUIRE_MESSAGE(parsed.error.empty(), parsed.error);
        // (the parser unescapes; parse_prometheus.py escapes again)
        const std::string device = R"(device="rx\"e\\0\n")";
        CHECK(parsed.samples.at(R"(gpuverbs_port_hw_counter{counter="retry_exceeded_err",)" + device +
                                R"(,port="1"})") == 3);
        CHECK(parsed.samples.at(R"(gpuverbs_port_hw_counter{counter="rcvd_pkts",)" + device + R"(,port="1"})") ==
              123456789012.0);
        // The parser names a counter's sample NAME_total, as the text does.
        CHECK(parsed.samples.at("gpuverbs_qp_requests_posted_total{qp=\"empty\",queue=\"send\"}") == 0);
        CHECK(parsed.samples.at("gpuverbs_qp_outstanding_requests{qp=\"empty\",queue=\"receive\"}") == 0);
        CHECK(parsed.samples.size() == 8);
    }

    TEST_CASE("a name with invalid UTF-8 costs its bad bytes (U+FFFD), never the whole page") {
        PrometheusText metrics;
        // A stray continuation byte, a truncated sequence, an overlong '/', a
        // surrogate; then good two-, three- and four-byte characters.
        const std::string name = std::string("q\x80p\xc3") + "\xc0\xaf" + "\xed\xa0\x80" + "é€😀";
        metrics.add(name, QueuePair());
        const std::string text = metrics.text();
        const std::string replacement = "\xef\xbf\xbd";
        const std::string expected = "q" + replacement + "p" + replacement + replacement + replacement + replacement +
                                     replacement + replacement + "é€😀";
        CHECK_MESSAGE(text.find("qp=\"" + expected + "\"") != std::string::npos, text);
        const test::ParsedMetrics parsed = test::parse_prometheus(text);
        REQUIRE_MESSAGE(parsed.error.empty(), parsed.error);
        CHECK(parsed.samples.size() == 6);
    }

    TEST_CASE("the parser refuses what is not the format (the check can fail)") {
        const test::ParsedMetrics parsed = test::parse_prometheus("gpuverbs_x{a=\"b\" 1\n");
        CHECK_FALSE(parsed.error.empty());
    }

    TEST_CASE("status names") {
        CHECK(wc_status_name(IBV_WC_RETRY_EXC_ERR) == "RETRY_EXC_ERR");
        CHECK(wc_status_name(IBV_WC_REM_ACCESS_ERR) == "REM_ACCESS_ERR");
        CHECK(wc_status_name(IBV_WC_GENERAL_ERR) == "GENERAL_ERR");
        CHECK(wc_status_name(99) == "OTHER");
    }

    TEST_CASE(
        "a port whose counters cannot be read fails alike in the three forms of add_port_from; nothing is added") {
        const test::ScratchDir scratch("hw");
        const std::string file = (scratch.path / "not-a-directory").string();
        std::ofstream(file) << "3\n";
        PrometheusText metrics;
        const std::string what = test::check_fails_alike(
            std::errc::not_a_directory, [&] { return (metrics.add_port_from("rxe0", 1, file), 0); },
            [&](std::error_code& ec) { return (metrics.add_port_from("rxe0", 1, file, ec), 0); },
            [&](std::error_code& ec, Diagnostics& d) { return (metrics.add_port_from("rxe0", 1, file, ec, d), 0); });
        CHECK(what == "PrometheusText::add_port: cannot read the hardware counters in " + file +
                          ": Not a directory (errno 20)");
        CHECK(metrics.text().empty());
    }

    TEST_CASE("add_port of an empty Device fails alike in the three forms; nothing is added") {
        PrometheusText metrics;
        const Device none;
        const std::string what = test::check_fails_alike(
            errc::invalid_argument, [&] { return (metrics.add_port(none), 0); },
            [&](std::error_code& ec) { return (metrics.add_port(none, 1, ec), 0); },
            [&](std::error_code& ec, Diagnostics& d) { return (metrics.add_port(none, 1, ec, d), 0); });
        CHECK(what == "ibv_query_port: the Device is empty (default-constructed or moved from)");
        CHECK(metrics.text().empty());
    }

    TEST_CASE("counters that are read, or a driver that exports none, clear the error_code and the Diagnostics") {
        const test::ScratchDir scratch("hw");
        std::ofstream(scratch.path / "rnr_nak_retry_err") << "4\n";
        PrometheusText metrics;
        test::check_succeeds_clean(
            [&](std::error_code& ec) { metrics.add_port_from("rxe0", 1, scratch.path.string(), ec); },
            [&](std::error_code& ec, Diagnostics& d) {
                metrics.add_port_from("rxe0", 2, (scratch.path / "missing").string(), ec, d); // exports none
            });
        CHECK(metrics.text().find(R"({device="rxe0",port="1",counter="rnr_nak_retry_err"} 4)") != std::string::npos);
        CHECK(metrics.text().find("port=\"2\"") == std::string::npos);
    }
}
