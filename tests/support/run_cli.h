// Runs the built fasttrain program (FT_CLI_PATH, set for the suites that use it in
// tests/CMakeLists.txt) as a user does, or any command line, capturing its exit code and
// everything it printed.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ft::test {

struct CliRun {
  int code;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line.
inline CliRun run_command(const std::string& command) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

#ifdef FT_CLI_PATH
inline CliRun run_cli(const std::string& args) { return run_command(std::string(FT_CLI_PATH) + " " + args); }
#endif

}  // namespace ft::test
