// Files of a run folder: reads with clear errors, run folder naming, and atomic checkpoint
// folders (written under a temporary name, then renamed into place). Single files are written
// with write_file_atomically (fasttrain/atomic_file.h).
#pragma once
#include <string>

#include "fasttrain/train.h"

namespace ft::train {

// default_run_dir, make_dirs and read_text are declared in fasttrain/train.h (the CLI uses them too).
// Replaces folder `final_dir` by the fully written folder `tmp_dir` (rename; the parent folder is
// fsynced so the new entry survives a crash).
void commit_dir(const std::string& tmp_dir, const std::string& final_dir);

}  // namespace ft::train
