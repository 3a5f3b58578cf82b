// Process settings read from the environment: the A/B switches of the benchmarks and tests
// (FT_FUSED_ADD_NORM, FT_CUDA_GELU_EPILOGUE, ...). A switch is an enum with a table of the names it
// accepts (rows {value, name}, as name_table.h's tables); the variable's value maps to a row, unset
// or empty gives the caller's default, and anything else is an error naming the variable, the
// accepted names and what was found, so a mistyped switch cannot silently measure the default.
// Callers read a switch once per process (a function-local static), as the variables are meant
// to be set before the program starts.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/name_table.h"
#include "fasttrain/error.h"

namespace ft::detail {

template <class E>
struct EnvChoice {
  E value;
  const char* name;
};

// `rows` may hold several names for one value ("1" and "true").
template <class E, size_t N>
E env_setting(const char* variable, const EnvChoice<E> (&rows)[N], E unset) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return unset;
  for (const EnvChoice<E>& r : rows)
    if (std::strcmp(v, r.name) == 0) return r.value;
  FT_FAIL(variable, ": expected ", names_list(rows), ", found '", v, "'");
}

// Yes/no switches: a fusion or path on by default that FT_...=off turns off, or a forced path
// that FT_...=1 turns on.
inline constexpr EnvChoice<bool> kYesNo[] = {{true, "1"},  {true, "true"},   {true, "on"},
                                             {false, "0"}, {false, "false"}, {false, "off"}};

// Whether `variable` (a yes/no switch; unset is on) switches its feature off.
inline bool env_switched_off(const char* variable) { return !env_setting(variable, kYesNo, true); }

}  // namespace ft::detail
