// The fasttrain program: dispatches to the subcommands registered in apps/fasttrain/*_command.cpp.
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "fasttrain/fasttrain.h"

namespace ft::cli {
std::map<std::string, Command>& commands() {
  static std::map<std::string, Command> registry;
  return registry;
}
}  // namespace ft::cli

namespace {

const char* kDefaultCommand = "train";
// From project(VERSION) in CMakeLists.txt (a compile definition of this program), so a release
// bumps the version in one place.
const char* kVersion = FASTTRAIN_VERSION;

void print_usage() {
  std::printf("fasttrain %s - a deep-learning training engine\n\nusage: fasttrain [command] [options]\n\ncommands:\n",
              kVersion);
  for (const auto& [name, cmd] : ft::cli::commands())
    std::printf("  %-10s %s%s\n", name.c_str(), cmd.summary.c_str(), name == kDefaultCommand ? " (default)" : "");
  std::printf("  %-10s %s\n", "info", "print the build configuration, threads and CUDA devices");
  std::printf("\n'fasttrain COMMAND --help' documents each command's options.\n");
}

int run_info() {
  std::printf("fasttrain %s\n", kVersion);
#ifdef FASTTRAIN_WITH_CUDA
  std::printf("CUDA backend: compiled in; %d device(s) visible\n", ft::cuda_device_count());
#else
  std::printf("CUDA backend: not compiled in\n");
#endif
  std::printf("CPU threads: %d\n", ft::get_num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file-size limit (ulimit -f) the kernel would kill us with SIGXFSZ and no word of which
  // file; ignored, the write fails with EFBIG and the error names the file.
  std::signal(SIGXFSZ, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
      print_usage();
      return 0;
    }
    if (!args.empty() && args[0] == "--version") {
      std::printf("fasttrain %s\n", kVersion);
      return 0;
    }
    std::string name = kDefaultCommand;
    if (!args.empty() && args[0].rfind("-", 0) != 0) {
      name = args[0];
      args.erase(args.begin());
    }
    if (name == "info") {
      FT_CHECK(args.empty(), "info takes no options, found '", args[0], "'");
      return run_info();
    }
    auto it = ft::cli::commands().find(name);
    if (it == ft::cli::commands().end()) {
      std::string known;
      for (const auto& [n, c] : ft::cli::commands()) known += (known.empty() ? "" : ", ") + n;
      FT_FAIL("unknown command '", name, "' (expected one of: ", known, ", info; see fasttrain --help)");
    }
    return it->second.run(args);
  } catch (const ft::Error& e) {
    // In a job of several ranks the others would wait for this one: print with the rank and end
    // the whole job (dist.h).
    if (ft::dist::launched()) ft::dist::abort_job(e.what(), 2);
    std::fprintf(stderr, "fasttrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    if (ft::dist::launched()) ft::dist::abort_job(std::string("internal error: ") + e.what(), 3);
    std::fprintf(stderr, "fasttrain: internal error: %s\n", e.what());
    return 3;
  }
}
