// Closed sets of names as enums: a run's options (optimizer, schedule, precision, strategy, ...)
// are enums in code and names only at the edges (command line, TOML, JSON, checkpoints). Each
// such enum has one table of rows {value, name}: one row per value in enum order (the name that
// is written), then any aliases that are also read ("bf16" for "bf16-mixed"). The table is found
// by argument-dependent lookup of `option_names(E)` in the enum's namespace:
//
//   std::span<const NamedValue<OptimizerKind>> option_names(OptimizerKind);
//
// which makes E a NamedEnum: name_of, parse_name and the "expected ..." list of errors work on it,
// and so do the config's readers and writers (train.h's visit_fields).
#pragma once
#include <concepts>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fasttrain/error.h"

namespace ft {

template <class E>
struct NamedValue {
  E value;
  const char* name;
};

template <class E>
concept NamedEnum = std::is_enum_v<E> && requires(E e) {
  { option_names(e) } -> std::convertible_to<std::span<const NamedValue<E>>>;
};

// The table of E.
template <NamedEnum E>
std::span<const NamedValue<E>> names_of() {
  return option_names(E{});
}

// The name written for v (its row in enum order).
template <NamedEnum E>
const char* name_of(E v) {
  const auto rows = names_of<E>();
  const auto i = static_cast<size_t>(v);
  return i < rows.size() && rows[i].value == v ? rows[i].name : "?";
}

// "a, b or c", then " (or x, y)" for the aliases: the list an error message gives.
template <NamedEnum E>
std::string names_list() {
  const auto rows = names_of<E>();
  size_t values = 0;  // the rows before the first alias
  while (values < rows.size() && static_cast<size_t>(rows[values].value) == values) ++values;
  std::string s;
  for (size_t i = 0; i < values; ++i) s += std::string(i == 0 ? "" : i + 1 == values ? " or " : ", ") + rows[i].name;
  for (size_t i = values; i < rows.size(); ++i) s += std::string(i == values ? " (or " : ", ") + rows[i].name;
  if (values < rows.size()) s += ")";
  return s;
}

template <NamedEnum E>
std::optional<E> find_name(std::string_view text) {
  for (const NamedValue<E>& r : names_of<E>())
    if (text == r.name) return r.value;
  return std::nullopt;
}

// The value `text` names; otherwise an ft::Error "<what>: expected a, b or c, found '<text>'".
template <NamedEnum E>
E parse_name(std::string_view what, std::string_view text) {
  if (const std::optional<E> v = find_name<E>(text)) return *v;
  FT_FAIL(what, ": expected ", names_list<E>(), ", found '", text, "'");
}

}  // namespace ft
