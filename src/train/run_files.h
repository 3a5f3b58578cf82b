// Files of a run folder: reads with clear errors, run folder naming, and atomic checkpoint
// folders (written under a temporary name, then renamed into place with replace_folder). Single
// files are written with write_file_atomically (both in fasttrain/atomic_file.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fasttrain/train.h"

namespace ft::train {

// default_run_dir, make_dirs and read_text are declared in fasttrain/train.h (the CLI uses them too).
// A folder or file name ending in ".tmp" (checkpoint folders being written or deleted) or
// ".tmp.<pid>" (AtomicFileWriter): never complete, whatever it holds.
bool is_temporary_name(const std::string& name);
// Removes what a killed process left half-written in a run folder: checkpoints/*.tmp folders and
// *.tmp.<pid> files of processes no longer running. Returns how many it removed.
int remove_stale_temporaries(const std::string& run_dir);

// The complete checkpoints of a run folder (checkpoints/step-N holding trainer_state.json, which
// is written last), oldest first, with the monitored metric each was saved with (NaN if none).
struct SavedCheckpoint {
  std::string dir;
  int64_t step;
  double metric;
};
std::vector<SavedCheckpoint> complete_checkpoints(const std::string& run_dir);

// Cuts metrics.csv back to the rows of steps <= `step` (a run resumed into its own folder logs the
// later steps again); false when there is no such file.
bool truncate_metrics_after(const std::string& csv_path, int64_t step);

}  // namespace ft::train
