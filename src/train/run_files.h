// Files of a run folder: reads with clear errors, run folder naming, and atomic checkpoint
// folders (written under a temporary name, then renamed into place). Single files are written
// with write_file_atomically (fasttrain/atomic_file.h).
#pragma once
#include <string>

#include "fasttrain/train.h"

namespace ft::train {

// The whole file; a missing or unreadable file is an error naming it and `what` it should be.
std::string read_text(const std::string& path, const char* what);
// default_run_dir and make_dirs are declared in fasttrain/train.h (the CLI uses them too).
// Replaces folder `final_dir` by the fully written folder `tmp_dir` (rename; the parent folder is
// fsynced so the new entry survives a crash). An existing final_dir is swapped out atomically, so a
// crash at any moment leaves a complete folder under the final name.
void commit_dir(const std::string& tmp_dir, const std::string& final_dir);

// A folder or file name ending in ".tmp" (checkpoint folders being written or deleted) or
// ".tmp.<pid>" (AtomicFileWriter): never complete, whatever it holds.
bool is_temporary_name(const std::string& name);

}  // namespace ft::train
