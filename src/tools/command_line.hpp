// One command line for gpuverbs' programs (gpuverbs-doctor, gpuverbs-perf and
// the examples): CLI11, set up the same way everywhere.
//
//  - --help reads like perftest's: the usage lines first, each with what it
//    does, then the options by group, each with its default;
//  - a bad argument prints "NAME: why (try --help)" and the usage lines on
//    stderr, and the program exits with its own status for bad arguments
//    (CLI11's own exit codes are never used);
//  - checks CLI11 cannot express are made after parse() and reported by fail(),
//    or thrown as CLI::ValidationError from a CLI::App::callback.
//
//   tools::CommandLine cli("gpuverbs-doctor", "Checks this machine for GPUDirect RDMA.", 64);
//   cli.usage({{"[options]", "a report for people; --json for programs"}});
//   cli.app.add_flag("--json", json, "the report as JSON");
//   if (auto status = cli.parse(argc, argv)) return *status;
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tools {

/// One way to run a program: its arguments after the name, and what it does.
struct UsageForm {
    std::string arguments;
    std::string what;
};

/// perftest-like help: "Usage:" and one line per form, the description, then
/// every group of options; an option's default follows its description.
class HelpFormatter : public CLI::Formatter {
public:
    std::vector<UsageForm> forms;
    static constexpr std::size_t usage_column_limit = 52;

    HelpFormatter() {
        column_width(26);
        label("Positionals", "Arguments");
    }

    std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
        std::string out = make_usage(app, std::move(name));
        if (!app->get_description().empty()) out += "\n" + app->get_description() + "\n";
        out += make_positionals(app);
        std::string groups = make_groups(app, mode); // "\nGroup:\n" each, with a blank line between them too
        for (std::size_t at; (at = groups.find("\n\n\n")) != std::string::npos;) groups.erase(at, 1);
        out += groups;
        std::string footer = make_footer(app);
        if (!footer.empty()) out += "\n" + footer;
        return out;
    }

    std::string make_usage(const CLI::App* app, std::string name) const override {
        if (name.empty()) name = app->get_name();
        // What each form does, in one column after the forms (a longer form puts it on the next line).
        std::size_t column = 0;
        for (const auto& f : forms) {
            std::size_t width = form(name, f).size() + 3;
            if (width <= usage_column_limit) column = std::max(column, width);
        }
        std::string out = "Usage:\n";
        for (const auto& f : forms) {
            std::string line = form(name, f);
            out += line;
            if (!f.what.empty()) {
                out +=
                    line.size() + 3 > column ? "\n" + std::string(column, ' ') : std::string(column - line.size(), ' ');
                out += f.what;
            }
            out += "\n";
        }
        return out;
    }

    static std::string form(const std::string& name, const UsageForm& f) {
        return "  " + name + (f.arguments.empty() ? "" : " ") + f.arguments;
    }

    // "--port P": the option's name and its value's name, nothing else.
    std::string make_option_opts(const CLI::Option* opt) const override {
        if (opt->get_positional() || opt->get_type_size() == 0) return {};
        std::string type = opt->get_type_name(); // "P", or "P:validator"
        return " " + type.substr(0, type.find(':'));
    }

    std::string make_option_desc(const CLI::Option* opt) const override {
        std::string desc = opt->get_description();
        if (opt->get_type_size() != 0 && !opt->get_default_str().empty())
            desc += " (default " + opt->get_default_str() + ")";
        return desc;
    }
};

/// A program's command line: its CLI::App (add options to `app`), its usage
/// forms and its exit status for bad arguments.
class CommandLine {
public:
    CLI::App app;

    CommandLine(std::string name, std::string description, int bad_arguments_status)
        : app(std::move(description), std::move(name)),
          formatter_(std::make_shared<HelpFormatter>()),
          bad_arguments_(bad_arguments_status) {
        app.formatter(formatter_);
        app.set_help_flag(); // added by parse(), after the program's own options
        app.allow_extras();  // collected, then reported in our words by parse()
        app.option_defaults()->always_capture_default();
    }

    /// The usage lines: arguments after the program's name, and what each form does.
    void usage(std::vector<UsageForm> forms) { formatter_->forms = std::move(forms); }

    /// Parses argv. Nothing: go on. Otherwise the exit status: 0 after
    /// --help (printed), the bad-arguments status after saying what is wrong.
    std::optional<int> parse(int argc, const char* const* argv) {
        // --help ends the last group of options (perftest lists it last too).
        auto options = app.get_options([](const CLI::Option* o) { return o->nonpositional(); });
        CLI::Option* help = app.set_help_flag("-h,--help", "print this help and exit");
        if (!options.empty()) help->group(options.back()->get_group());
        try {
            app.parse(argc, argv);
        } catch (const CLI::CallForHelp&) {
            std::fputs(app.help().c_str(), stdout);
            return 0;
        } catch (const CLI::ParseError& e) {
            return fail(e.what());
        }
        if (auto extra = app.remaining(true); !extra.empty()) return fail("unknown argument '" + extra.front() + "'");
        return std::nullopt;
    }

    /// Reports a bad argument found after parse(): why, then the usage lines.
    /// Returns the program's status for bad arguments.
    int fail(const std::string& why) const {
        std::fprintf(stderr, "%s: %s (try --help)\n", app.get_name().c_str(), why.c_str());
        const char* lead = "usage:";
        for (const auto& f : formatter_->forms) {
            std::fprintf(stderr, "%s%s\n", lead, HelpFormatter::form(app.get_name(), f).c_str() + 1);
            lead = "      ";
        }
        return bad_arguments_;
    }

private:
    std::shared_ptr<HelpFormatter> formatter_;
    int bad_arguments_;
};

/// Runs a program's main body: an exception that escapes it (memory running
/// out, a bug) ends the program with "NAME: what" and `failure_status` (a
/// status of its own where the program's statuses mean something, as the
/// doctor's do), never with std::terminate's abort.
template <class Body>
int run_main(const char* name, int failure_status, Body&& body) noexcept {
    try {
        return body();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
    } catch (...) {
        std::fprintf(stderr, "%s: an unknown exception\n", name);
    }
    return failure_status;
}

} // namespace tools
