// The run report: one self-contained HTML page per run folder (`fasttrain report RUN_DIR`) with
// the training curves, the step's time and memory when the run was profiled, the LR finder's
// curve when it has one, the run's configuration and the advisor's findings. The page needs no
// network and runs no script; its charts are SVG drawn by the project. Implemented in
// src/report/run_report.cpp.
#pragma once
#include <string>

namespace ft::report {

// Reads RUN_DIR (metrics.csv, summary.json, config.toml, task.json, lr_find.csv and profile/ when
// present) and writes the page atomically to `output` ("" : RUN_DIR/report.html). Returns the
// path written. A folder that is not a run folder, or a malformed file in it, is an ft::Error
// naming the file and what was expected.
std::string write_run_report(const std::string& run_dir, const std::string& output = "");

}  // namespace ft::report
