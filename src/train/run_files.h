// Files of a run folder: reads with clear errors, run folder naming, and atomic checkpoint
// folders (written under a temporary name, then renamed into place). Single files are written
// with write_file_atomically (fasttrain/atomic_file.h).
#pragma once
#include <string>

namespace ft::train {

// The whole file; a missing or unreadable file is an error naming it and `what` it should be.
std::string read_text(const std::string& path, const char* what);
// "runs/<task>-YYYYMMDD-HHMMSS" (with a numeric suffix if that folder already exists).
std::string default_run_dir(const std::string& task);
// Makes `dir` and its parents; an error names the folder.
void make_dirs(const std::string& dir);
// Replaces folder `final_dir` by the fully written folder `tmp_dir` (rename; the parent folder is
// fsynced so the new entry survives a crash).
void commit_dir(const std::string& tmp_dir, const std::string& final_dir);

}  // namespace ft::train
