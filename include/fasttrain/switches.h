// The process switches: environment variables that choose between implementations of the same
// computation (the A/B switches of the benchmarks) or lower the CPU kernel table's instruction
// set. Declared in one place inside the library (src/core/switches.h); this is their list as a
// program sees it (`fasttrain switches` prints it).
#pragma once
#include <string>
#include <vector>

namespace ft {

struct SwitchInfo {
  std::string variable;  // FT_CONV_ALGO, ...
  std::string help;
  std::string accepted;  // the names the variable accepts: "direct, winograd or auto"
  std::string value;     // the name of the value in effect; "" when the default is in effect
};

// Every switch, in a fixed order. Reading it reads the variables: a malformed one throws ft::Error
// naming the variable, the accepted names and what was found.
std::vector<SwitchInfo> process_switches();

}  // namespace ft
