#include "fasttrain/atomic_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/fault_injection.h"
#include "fasttrain/error.h"

namespace ft {
namespace {

// strerror plus what the user can do about the errors a full disk or a limit produces.
std::string errno_text() {
  const int err = errno;
  std::string text = std::strerror(err);
  if (err == EFBIG) {
    struct rlimit limit {};
    if (::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
      text += " (the file-size limit, ulimit -f, is " + std::to_string(limit.rlim_cur) + " bytes)";
  } else if (err == ENOSPC || err == EDQUOT) {
    text += " (free some space or write elsewhere)";
  }
  return text;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// An fsync of a folder makes the names created or renamed in it durable.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  FT_CHECK(fd >= 0, dir, ": cannot open the folder for fsync: ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0;
  ::close(fd);
  FT_CHECK(ok, dir, ": fsync of the folder failed: ", std::strerror(errno));
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  FT_CHECK(!path_.empty(), "write file: expected a path, found an empty string");
  tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  FT_CHECK(fd_ >= 0, path_, ": cannot create temporary file ", tmp_path_, ": ", errno_text());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t nbytes) {
  FT_CHECK(fd_ >= 0 && !committed_, path_, ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0 && errno == EINTR) continue;
    FT_CHECK(n > 0, path_, ": cannot write the file: ", errno_text());
    p += n;
    nbytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  FT_CHECK(fd_ >= 0 && !committed_, path_, ": commit called twice");
  FT_CHECK(::fsync(fd_) == 0, path_, ": cannot write the file: fsync of ", tmp_path_, " failed: ", errno_text());
  int rc = ::close(fd_);
  fd_ = -1;
  FT_CHECK(rc == 0, path_, ": cannot write the file: close of ", tmp_path_, " failed: ", errno_text());
  fault::point("file-rename", path_);
  FT_CHECK(std::rename(tmp_path_.c_str(), path_.c_str()) == 0, path_, ": rename of ", tmp_path_,
           " failed: ", errno_text());
  committed_ = true;
  // Without this the rename may not survive a power loss even though the data did.
  int dir = ::open(parent_dir(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  AtomicFileWriter w(path);
  w.write(contents.data(), contents.size());
  w.commit();
}

void replace_folder(const std::string& tmp_dir, const std::string& final_dir) {
  namespace fs = std::filesystem;
  const std::string parent = parent_dir(final_dir);
  std::error_code ec;
  if (fs::exists(final_dir)) {
    // Removing the old folder first would leave a moment with neither; swap the two names instead,
    // then delete the old folder under its temporary name.
    if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_dir(parent);
      fs::remove_all(tmp_dir, ec);
      FT_CHECK(!ec, tmp_dir, ": cannot delete the replaced folder: ", ec.message());
      return;
    }
    fs::remove_all(final_dir, ec);  // a file system without RENAME_EXCHANGE
  }
  FT_CHECK(!ec, final_dir, ": cannot replace the old folder: ", ec.message());
  FT_CHECK(std::rename(tmp_dir.c_str(), final_dir.c_str()) == 0, final_dir, ": rename of ", tmp_dir,
           " failed: ", errno_text());
  fsync_dir(parent);
}

}  // namespace ft
