#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fasttrain/error.h"

namespace ft::data {

std::shared_ptr<const MappedFile> map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FT_CHECK(fd >= 0, path, ": cannot open file (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    FT_FAIL(path, ": cannot stat file (", std::strerror(err), ")");
  }
  auto file = std::make_shared<MappedFile>();
  file->path = path;
  file->size = static_cast<size_t>(st.st_size);
  if (file->size > 0) {
    void* p = ::mmap(nullptr, file->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    FT_CHECK(p != MAP_FAILED, path, ": cannot map ", file->size, " bytes (", std::strerror(err), ")");
    file->data = static_cast<char*>(p);
  } else {
    ::close(fd);
  }
  return file;
}

MappedFile::~MappedFile() {
  if (data) ::munmap(data, size);
}

}  // namespace ft::data
