// The three forms of a fallible call checked against each other: the
// throwing form, the std::error_code& form and the one with a Diagnostics
// must fail with the same code and the same words for the same input, and
// the Diagnostics form must clear words left from an earlier failure when it
// succeeds.
#pragma once

#include "gpuverbs/error.hpp"

#include <doctest/doctest.h>

#include <string>
#include <system_error>
#include <utility>

namespace gpuverbs::test {

/// A Diagnostics holding the words of an earlier failure (a call that
/// succeeds must clear them).
inline Diagnostics stale_diagnostics() {
    Diagnostics diagnostics;
    detail::Status earlier;
    earlier.fail(errc::invalid_argument, "earlier_call", "words of an earlier failure");
    earlier.report(diagnostics);
    return diagnostics;
}

/// For one input that fails: `throwing()` throws gpuverbs::Error; `coded(ec)`
/// and `diagnosed(ec, diagnostics)` set its code, and the Diagnostics hold
/// exactly the exception's what(), verb and detail. Returns the code and
/// what() (for checks of the code and the words themselves).
template <class Throwing, class Coded, class Diagnosed>
std::pair<std::error_code, std::string> check_forms_agree(Throwing&& throwing, Coded&& coded, Diagnosed&& diagnosed) {
    std::string what;
    std::string verb;
    std::error_code thrown;
    try {
        (void)throwing();
        FAIL("the throwing form did not throw");
    } catch (const Error& e) {
        what = e.what();
        verb = e.verb();
        thrown = e.code();
    }
    CHECK_MESSAGE(thrown, "the throwing form threw no code");
    std::error_code ec;
    (void)coded(ec);
    CHECK_MESSAGE(ec == thrown, ec.message());
    std::error_code diagnosed_ec;
    Diagnostics diagnostics = stale_diagnostics();
    (void)diagnosed(diagnosed_ec, diagnostics);
    CHECK_MESSAGE(diagnosed_ec == thrown, diagnosed_ec.message());
    CHECK(diagnostics.message() == what);
    CHECK(diagnostics.verb() == verb);
    CHECK(diagnostics.message() == diagnostics.verb() + ": " + diagnostics.detail());
    return {thrown, what};
}

/// check_forms_agree, and the code is `expected` (an errc, std::errc or a
/// code). Returns what().
template <class Expected, class Throwing, class Coded, class Diagnosed>
std::string check_fails_alike(Expected expected, Throwing&& throwing, Coded&& coded, Diagnosed&& diagnosed) {
    auto [code, what] = check_forms_agree(std::forward<Throwing>(throwing), std::forward<Coded>(coded),
                                          std::forward<Diagnosed>(diagnosed));
    CHECK_MESSAGE(code == expected, code.message());
    return what;
}

/// For one input that succeeds: `coded(ec)` and `diagnosed(ec, diagnostics)`
/// clear an error_code that held an earlier failure, and the Diagnostics
/// form empties the words of that failure.
template <class Coded, class Diagnosed>
void check_succeeds_clean(Coded&& coded, Diagnosed&& diagnosed) {
    std::error_code ec = make_error_code(errc::invalid_argument);
    (void)coded(ec);
    CHECK_MESSAGE(!ec, ec.message());
    ec = make_error_code(errc::invalid_argument);
    Diagnostics diagnostics = stale_diagnostics();
    (void)diagnosed(ec, diagnostics);
    CHECK_MESSAGE(!ec, ec.message());
    CHECK(diagnostics.message().empty());
    CHECK(diagnostics.verb().empty());
    CHECK(diagnostics.detail().empty());
}

} // namespace gpuverbs::test
