// Runs the built fasttrain program (FT_CLI_PATH, set for the suites that use it in
// tests/CMakeLists.txt) as a user does, capturing its exit code and everything it printed.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace ft::test {

struct CliRun {
  int code;
  std::string output;  // stdout and stderr together
};

inline CliRun run_cli(const std::string& args) {
  const std::string cmd = std::string(FT_CLI_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

}  // namespace ft::test
