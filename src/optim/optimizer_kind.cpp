// The optimizer kinds' names and families (optim.h). One row per kind: the config's validation,
// the Trainer's choice of optimizer, set_momentum and saved states all read this table, so a
// name, a kind and its family cannot disagree between them.
#include <iterator>

#include "core/name_table.h"
#include "fasttrain/optim.h"

namespace ft::optim {
namespace {

// In enum order; the order error messages list the names in.
constexpr NamedValue<OptimizerKind> kKinds[] = {{OptimizerKind::AdamW, "adamw"},
                                                {OptimizerKind::Adam, "adam"},
                                                {OptimizerKind::SGD, "sgd"},
                                                {OptimizerKind::LAMB, "lamb"},
                                                {OptimizerKind::LARS, "lars"}};
static_assert(std::size(kKinds) == kOptimizerKindCount &&
                  ft::detail::rows_start_in_enum_order(kKinds, kOptimizerKindCount),
              "one row per OptimizerKind, in enum order");
constexpr OptimizerFamily kFamilies[] = {OptimizerFamily::Adam, OptimizerFamily::Adam, OptimizerFamily::Momentum,
                                         OptimizerFamily::Adam, OptimizerFamily::Momentum};
static_assert(std::size(kFamilies) == kOptimizerKindCount, "one family per OptimizerKind, in enum order");

}  // namespace

std::span<const NamedValue<OptimizerKind>> option_names(OptimizerKind) { return kKinds; }

const char* optimizer_name(OptimizerKind kind) { return name_of(kind); }

OptimizerFamily optimizer_family(OptimizerKind kind) { return kFamilies[static_cast<size_t>(kind)]; }

OptimizerKind optimizer_kind_from_name(const std::string& name) { return parse_name<OptimizerKind>("optimizer", name); }

}  // namespace ft::optim
