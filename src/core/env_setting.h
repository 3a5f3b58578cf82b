// Reading a setting from the environment: a variable whose value is one of a table's names
// (rows {value, name}, as name_table.h's tables). Unset or empty is "not set"; anything else
// than a listed name is an error naming the variable, the accepted names and what was found.
// The process switches (core/switches.h) are built on this; read them there, not here.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "core/name_table.h"
#include "fasttrain/error.h"

namespace ft::detail {

template <class E>
struct EnvChoice {
  E value;
  const char* name;
};

// The value `variable` names, or nullopt when it is unset or empty. `rows` may hold several names
// for one value ("1" and "true").
template <class E>
std::optional<E> env_choice(const char* variable, const EnvChoice<E>* rows, size_t n) {
  const char* v = std::getenv(variable);
  if (v == nullptr || *v == '\0') return std::nullopt;
  for (size_t i = 0; i < n; ++i)
    if (std::strcmp(v, rows[i].name) == 0) return rows[i].value;
  FT_FAIL(variable, ": expected ", names_list(rows, n), ", found '", v, "'");
}

// The names of yes/no switches: a fusion or path on by default that FT_...=off turns off, or a
// forced path that FT_...=1 turns on.
inline constexpr EnvChoice<bool> kYesNo[] = {{true, "1"},  {true, "true"},   {true, "on"},
                                             {false, "0"}, {false, "false"}, {false, "off"}};

}  // namespace ft::detail
