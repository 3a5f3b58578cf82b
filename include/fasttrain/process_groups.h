// The job's processes arranged for model parallelism: the world of W ranks split into tensor-,
// data- and pipeline-parallel groups (issue 43; Megatron-LM's layout), each its own Communicator.
//
// With tensor-parallel size t, pipeline size p and data-parallel size d = W / (t p), world rank
//
//     w = tp_rank + t * (dp_rank + d * pp_rank)
//
// so the t ranks of a tensor group are adjacent (their all-reduces, one per layer per step, are
// the most frequent and want the fastest links: the same machine), then the d replicas of a model
// part, then the p stages. The groups of a rank:
//   tensor:   the t ranks with its (dp_rank, pp_rank): w - tp_rank + [0, t)
//   data:     the d ranks with its (tp_rank, pp_rank): tp_rank + t * [0, d) + t d pp_rank
//   pipeline: the p ranks with its (tp_rank, dp_rank): tp_rank + t dp_rank + t d * [0, p)
// A group of one rank is a communicator of one too (its collectives return at once).
#pragma once
#include <memory>
#include <string>

#include "fasttrain/dist.h"

namespace ft::dist {

struct ProcessGroups {
  int tp = 1, dp = 1, pp = 1;                 // the group sizes; tp * dp * pp = world size
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;  // this process's coordinates
  std::shared_ptr<Communicator> world, tensor, data, pipeline;

  // The world rank of coordinates (tp_rank, dp_rank, pp_rank): the formula above.
  int world_rank_of(int tp_rank, int dp_rank, int pp_rank) const { return tp_rank + tp * (dp_rank + dp * pp_rank); }
  // "tp 2 x dp 2 x pp 1 (world 4)", for reports.
  std::string describe() const;
};

// Splits `world` into the groups of tensor size `tp` and pipeline size `pp`: a collective of
// `world` (three splits). Refused (the same ft::Error on every rank, before any communication)
// when tp or pp is below 1 or the world size is not a multiple of tp x pp.
ProcessGroups make_process_groups(const std::shared_ptr<Communicator>& world, int tp, int pp);

// The groups of world() for (tp, pp), made by the first call with those sizes and kept for the
// process (the model and the Trainer ask for them separately; every rank asks in the same order).
const ProcessGroups& process_groups(int tp, int pp);

}  // namespace ft::dist
