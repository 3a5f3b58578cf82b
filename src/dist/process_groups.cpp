// The tensor-, data- and pipeline-parallel groups of process_groups.h: three MPI_Comm_splits of
// the world, with colours and keys from the rank layout w = tp_rank + t (dp_rank + d pp_rank).
#include "fasttrain/process_groups.h"

#include <map>
#include <mutex>
#include <utility>

#include "fasttrain/error.h"

namespace ft::dist {

std::string ProcessGroups::describe() const {
  return detail::concat("tp ", tp, " x dp ", dp, " x pp ", pp, " (world ", tp * dp * pp, ")");
}

ProcessGroups make_process_groups(const std::shared_ptr<Communicator>& world, int tp, int pp) {
  FT_CHECK(world != nullptr, "process groups: expected a world communicator, found none");
  const int w = world->world_size();
  // Checked from numbers every rank has, before the first split: every rank refuses alike, and
  // none is left waiting in a collective for the others.
  FT_CHECK(tp >= 1 && pp >= 1, "process groups: expected tp >= 1 and pp >= 1, found tp = ", tp, ", pp = ", pp);
  FT_CHECK(w % (tp * pp) == 0, "process groups: the world size ", w, " is not divisible by tp x pp = ", tp, " x ", pp,
           " = ", tp * pp, " (data parallel = world / (tp x pp) must be a whole number)");
  ProcessGroups g;
  g.tp = tp, g.pp = pp, g.dp = w / (tp * pp);
  g.world = world;
  const int r = world->rank();
  g.tp_rank = r % tp;
  g.dp_rank = (r / tp) % g.dp;
  g.pp_rank = r / (tp * g.dp);
  // Colour: the coordinates the group shares, numbered; key: the rank's coordinate inside it.
  g.tensor = world->split(g.dp_rank + g.dp * g.pp_rank, g.tp_rank, "tensor");
  g.data = world->split(g.tp_rank + tp * g.pp_rank, g.dp_rank, "data");
  g.pipeline = world->split(g.tp_rank + tp * g.dp_rank, g.pp_rank, "pipeline");
  FT_CHECK(g.tensor->world_size() == tp && g.data->world_size() == g.dp && g.pipeline->world_size() == pp,
           "process groups: split into groups of ", g.tensor->world_size(), ", ", g.data->world_size(), " and ",
           g.pipeline->world_size(), " ranks, expected ", tp, ", ", g.dp, " and ", pp);
  return g;
}

const ProcessGroups& process_groups(int tp, int pp) {
  static std::mutex m;
  static std::map<std::pair<int, int>, ProcessGroups> made;
  std::lock_guard<std::mutex> lock(m);
  const auto key = std::make_pair(tp, pp);
  auto it = made.find(key);
  if (it == made.end()) it = made.emplace(key, make_process_groups(world(), tp, pp)).first;
  return it->second;
}

}  // namespace ft::dist
