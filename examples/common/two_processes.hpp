// The command line the two-process examples share, made with CLI11 the way
// every gpuverbs program makes it (src/tools/command_line.hpp):
//
//   NAME server [options]        wait for the client on --port
//   NAME client HOST [options]   connect to the server at HOST
//
// with --device D and --port P; each example adds its own options. --help
// lists them all; bad arguments exit with status 2.
#pragma once

#include "command_line.hpp"

#include <string>

namespace example {

/// Adds server | client HOST, --device and --port to `cli`, filling
/// a.server, a.host, a.device and a.port (whose value is the default).
template <class Args>
void add_two_process_options(tools::CommandLine& cli, Args& a) {
    cli.usage(
        {{"server [options]", "wait for the client"}, {"client HOST [options]", "connect to the server at HOST"}});
    cli.app
        .add_option_function<std::string>(
            "ROLE", [&a](const std::string& role) { a.server = role == "server"; }, "server or client")
        ->required()
        ->check(CLI::IsMember({"server", "client"}));
    cli.app.add_option("HOST", a.host, "client: the server's address");
    cli.app.add_option("--device", a.device, "RDMA device (default: the first)")->type_name("D");
    cli.app.add_option("--port", a.port, "TCP port where the server waits")->type_name("P");
    cli.app.callback([&a] { // after parsing: HOST goes with client only
        if (!a.server && a.host.empty()) throw CLI::RequiredError("client HOST");
        if (a.server && !a.host.empty()) throw CLI::ValidationError("unknown argument '" + a.host + "'");
    });
}

} // namespace example
