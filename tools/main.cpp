// flashattn: the command-line tool of the library (run, bench, io). See docs/cli.md.
// Exit codes: 0 success, 1 an implementation failed or gave a wrong result, 2 bad flags.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.hpp"

int main(int argc, char** argv) {
  using namespace fa_cli;
  CLI::App app{"flashattn: exact attention (FlashAttention) on the CPU and NVIDIA GPUs"};
  app.name("flashattn");
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("flashattn: error: ") + e.what() + "\n(see --help)\n";
  });
  RunOptions run;
  BenchOptions bench;
  IoOptions io;
  add_run_command(app, run);
  add_bench_command(app, bench);
  add_io_command(app, io);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  try {
    if (app.got_subcommand("run")) return cmd_run(run);
    if (app.got_subcommand("bench")) return cmd_bench(bench);
    return cmd_io(io);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "flashattn: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashattn: failed: %s\n", e.what());
    return 1;
  }
}
