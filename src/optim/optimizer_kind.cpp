// The optimizer kinds' names and families (optim.h). One row per kind: the config's validation,
// the Trainer's choice of optimizer, set_momentum and saved states all read this table, so a
// name, a kind and its family cannot disagree between them.
#include <iterator>

#include "core/name_table.h"
#include "fasttrain/optim.h"

namespace ft::optim {
namespace {

struct KindRow {
  OptimizerKind value;
  const char* name;
  OptimizerFamily family;
};
// In enum order; the order error messages list the names in.
constexpr KindRow kKinds[] = {
    {OptimizerKind::AdamW, "adamw", OptimizerFamily::Adam},   {OptimizerKind::Adam, "adam", OptimizerFamily::Adam},
    {OptimizerKind::SGD, "sgd", OptimizerFamily::Momentum},   {OptimizerKind::LAMB, "lamb", OptimizerFamily::Adam},
    {OptimizerKind::LARS, "lars", OptimizerFamily::Momentum},
};
static_assert(std::size(kKinds) == kOptimizerKindCount &&
                  ft::detail::rows_start_in_enum_order(kKinds, kOptimizerKindCount),
              "one row per OptimizerKind, in enum order");

const KindRow& row(OptimizerKind kind) { return kKinds[static_cast<size_t>(kind)]; }

}  // namespace

const char* optimizer_name(OptimizerKind kind) { return row(kind).name; }

OptimizerFamily optimizer_family(OptimizerKind kind) { return row(kind).family; }

OptimizerKind optimizer_kind_from_name(const std::string& name) {
  for (const KindRow& r : kKinds)
    if (name == r.name) return r.value;
  FT_FAIL("optimizer: expected ", ft::detail::names_list(kKinds), ", found '", name, "'");
}

}  // namespace ft::optim
