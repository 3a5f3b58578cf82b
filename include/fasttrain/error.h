// The one exception type of the engine. Messages say what was expected and what was found,
// prefixed by the op or component that detected the problem ("conv2d: input has 3 channels,
// weight expects 4").
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace ft {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Raised when an allocation fails; callers (batch-size finder) can catch it specifically and the
// engine stays usable.
class OutOfMemoryError : public Error {
 public:
  explicit OutOfMemoryError(const std::string& what) : Error(what) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ft

// FT_CHECK(cond, "op: expected ", a, ", found ", b) throws ft::Error with the concatenated message.
#define FT_CHECK(cond, ...)                                            \
  do {                                                                 \
    if (!(cond)) throw ::ft::Error(::ft::detail::concat(__VA_ARGS__)); \
  } while (0)
#define FT_FAIL(...) throw ::ft::Error(::ft::detail::concat(__VA_ARGS__))
