// Tables of enum values and their names (the optimizer kinds, the clip algorithms, the precision
// modes). Files and flags hold the names, code holds the enums; one table of rows {value, name,
// ...} per enum, in enum order, gives both directions and the "expected ..." list of error
// messages, so no second list of names can fall out of step with it.
#pragma once
#include <cstddef>
#include <string>

namespace ft::detail {

// Whether rows 0 .. count-1 hold the enum values 0 .. count-1 in order, so a row can be found by
// indexing with its value (rows after those may hold aliases). For static_assert beside a table.
template <class Row, size_t N>
constexpr bool rows_start_in_enum_order(const Row (&rows)[N], size_t count) {
  if (N < count) return false;
  for (size_t i = 0; i < count; ++i)
    if (static_cast<size_t>(rows[i].value) != i) return false;
  return true;
}

// The names of the rows as an error message lists them: "a, b or c".
template <class Row>
std::string names_list(const Row* rows, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + rows[i].name;
  return s;
}
template <class Row, size_t N>
std::string names_list(const Row (&rows)[N]) {
  return names_list(rows, N);
}

}  // namespace ft::detail
