// Run folder I/O (run_files.h).
#include "train/run_files.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fasttrain/error.h"

namespace ft::train {

namespace fs = std::filesystem;

namespace {

void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  FT_CHECK(fd >= 0, path, ": cannot open for fsync: ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  FT_CHECK(ok, path, ": fsync failed: ", std::strerror(errno));
}

std::string parent_of(const std::string& path) {
  std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  FT_CHECK(f.good(), path, ": cannot read ", what, " (", std::strerror(errno), ")");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string default_run_dir(const std::string& task) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::string base = "runs/" + task + "-" + stamp, dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  FT_CHECK(!ec && fs::is_directory(dir), dir, ": cannot create the folder: ", ec ? ec.message() : "not a folder");
}

void commit_dir(const std::string& tmp_dir, const std::string& final_dir) {
  std::error_code ec;
  if (fs::exists(final_dir)) {
    // Removing the old folder first would leave a moment with neither; swap the two names instead,
    // then delete the old folder under its temporary name.
    if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_path(parent_of(final_dir), O_RDONLY | O_DIRECTORY);
      fs::remove_all(tmp_dir, ec);
      FT_CHECK(!ec, tmp_dir, ": cannot delete the replaced folder: ", ec.message());
      return;
    }
    fs::remove_all(final_dir, ec);  // a file system without RENAME_EXCHANGE
  }
  FT_CHECK(!ec, final_dir, ": cannot replace the old folder: ", ec.message());
  FT_CHECK(std::rename(tmp_dir.c_str(), final_dir.c_str()) == 0, final_dir, ": rename of ", tmp_dir, " failed: ",
           std::strerror(errno));
  fsync_path(parent_of(final_dir), O_RDONLY | O_DIRECTORY);
}

bool is_temporary_name(const std::string& name) {
  if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) return true;
  const size_t at = name.rfind(".tmp.");
  return at != std::string::npos && at + 5 < name.size() &&
         name.find_first_not_of("0123456789", at + 5) == std::string::npos;
}

}  // namespace ft::train
