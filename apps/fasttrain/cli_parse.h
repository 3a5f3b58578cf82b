// Shared CLI11 parsing for the subcommands: --help prints the command's help, any parse error
// becomes one ft::Error naming the command (main prints it and exits 2).
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "fasttrain/error.h"

namespace ft::cli {

// Returns false when help was printed (the command should exit 0).
inline bool parse_command_line(CLI::App& app, const std::vector<std::string>& args, const char* command) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 consumes from the back
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::ParseError& e) {
    FT_FAIL(command, ": ", e.what(), " (see fasttrain ", command, " --help)");
  }
  return true;
}

}  // namespace ft::cli
