// `fasttrain switches`: the process switches (fasttrain/switches.h), each with the value in effect.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "fasttrain/error.h"
#include "fasttrain/switches.h"

namespace {

const char* kSwitchesUsage = R"(usage: fasttrain switches

Lists the environment variables that choose between implementations of the same computation
(the benchmarks' A/B switches) or lower the CPU kernel table's instruction set: each with the
value in effect ("default" when unset), the names it accepts and what it chooses. A malformed
value is an error naming the variable.
)";

int run_switches(const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    std::fputs(kSwitchesUsage, stdout);
    return 0;
  }
  FT_CHECK(args.empty(), "switches: expected no arguments, found '", args[0], "'");
  for (const ft::SwitchInfo& s : ft::process_switches())
    std::printf("%-28s %-10s %s\n%-28s %-10s accepts: %s\n", s.variable.c_str(),
                s.value.empty() ? "default" : s.value.c_str(), s.help.c_str(), "", "", s.accepted.c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(switches, "list the process switches (FT_* variables) and their values", run_switches);
