// What a RailGroup refuses at construction, in its three forms; needs no
// device (a rail's queue pair may be missing until replace()).
#include "gpuverbs/transfers/rail_group.hpp"

#include "three_forms.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace gpuverbs;

TEST_SUITE("rail group construction") {
    TEST_CASE("a group the constructor refuses fails alike in the three forms, and has no rails") {
        struct Case {
            const char* name;
            std::size_t rails;
            double smoothing;
            std::string what;
        };
        const std::vector<Case> cases{
            {"no rails", 0, 0.3, "RailGroup: a group needs at least one rail"},
            {"smoothing 0", 2, 0.0, "RailGroup: smoothing must be above 0 and at most 1 (it is 0.000000)"},
            {"smoothing above 1", 2, 1.5, "RailGroup: smoothing must be above 0 and at most 1 (it is 1.500000)"},
            {"smoothing NaN", 1, std::numeric_limits<double>::quiet_NaN(),
             "RailGroup: smoothing must be above 0 and at most 1 (it is nan)"},
        };
        for (const Case& c : cases) {
            CAPTURE(c.name);
            const std::vector<TransferRail> rails(c.rails);
            RailGroupOptions options;
            options.smoothing = c.smoothing;
            const std::string what = test::check_fails_alike(
                errc::invalid_argument, [&] { return RailGroup(rails, options); },
                [&](std::error_code& ec) {
                    RailGroup group = RailGroup::create(rails, options, ec);
                    CHECK(group.size() == 0);
                    return 0;
                },
                [&](std::error_code& ec, Diagnostics& d) {
                    RailGroup group = RailGroup::create(rails, options, ec, d);
                    CHECK(group.size() == 0);
                    return 0;
                });
            CHECK(what == c.what);
        }
    }

    TEST_CASE("a group of rails whose queue pairs come later is made, clearing the error_code and the Diagnostics") {
        test::check_succeeds_clean(
            [](std::error_code& ec) {
                RailGroup group = RailGroup::create(std::vector<TransferRail>(2), {}, ec);
                CHECK(group.size() == 2);
            },
            [](std::error_code& ec, Diagnostics& d) {
                RailGroupOptions options;
                options.smoothing = 1.0; // the bound itself is allowed
                RailGroup group = RailGroup::create(std::vector<TransferRail>(1), options, ec, d);
                CHECK(group.size() == 1);
            });
    }
}
