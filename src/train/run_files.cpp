// Run folder I/O (run_files.h).
#include "train/run_files.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fasttrain/atomic_file.h"
#include "fasttrain/error.h"

namespace ft::train {

namespace fs = std::filesystem;

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  FT_CHECK(f.good(), path, ": cannot read ", what, " (", std::strerror(errno), ")");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::string default_run_dir(const std::string& task) {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::string base = "runs/" + task + "-" + stamp, dir = base;
  for (int i = 2; fs::exists(dir); ++i) dir = base + "-" + std::to_string(i);
  return dir;
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  FT_CHECK(!ec && fs::is_directory(dir), dir, ": cannot create the folder: ", ec ? ec.message() : "not a folder");
}

bool is_temporary_name(const std::string& name) {
  if (name.size() >= 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) return true;
  const size_t at = name.rfind(".tmp.");
  return at != std::string::npos && at + 5 < name.size() &&
         name.find_first_not_of("0123456789", at + 5) == std::string::npos;
}

int remove_stale_temporaries(const std::string& run_dir) {
  int removed = 0;
  for (const std::string& dir : {run_dir, run_dir + "/checkpoints", run_dir + "/tensorboard"}) {
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      const std::string name = entry.path().filename().string();
      if (!is_temporary_name(name)) continue;
      const size_t at = name.rfind(".tmp.");
      if (at != std::string::npos && name.size() > at + 5) {
        // AtomicFileWriter names its file after its process: one still running is not stale.
        const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
        if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      }
      std::error_code rm;
      fs::remove_all(entry.path(), rm);
      FT_CHECK(!rm, entry.path().string(), ": cannot delete what an interrupted run left half-written: ", rm.message());
      ++removed;
    }
  }
  return removed;
}

std::vector<SavedCheckpoint> complete_checkpoints(const std::string& run_dir) {
  std::vector<SavedCheckpoint> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) != 0 || name.size() == 5 || is_temporary_name(name) ||
        name.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    const std::string state_path = entry.path().string() + "/trainer_state.json";
    if (!fs::exists(state_path)) continue;
    double metric = std::nan("");
    try {
      const nlohmann::json st = nlohmann::json::parse(read_text(state_path, "the trainer state"));
      if (st.contains("monitored") && st["monitored"].is_number()) metric = st["monitored"].get<double>();
    } catch (const std::exception&) {
      // A state that does not parse is reported when someone resumes from it; here it has no metric.
    }
    found.push_back({entry.path().string(), std::stoll(name.substr(5)), metric});
  }
  std::sort(found.begin(), found.end(),
            [](const SavedCheckpoint& a, const SavedCheckpoint& b) { return a.step < b.step; });
  return found;
}

bool truncate_metrics_after(const std::string& csv_path, int64_t step) {
  if (!fs::exists(csv_path)) return false;
  const std::string text = read_text(csv_path, "the metrics");
  std::string kept;
  size_t begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
    // A line cut short by a kill has no newline and is dropped with everything after `step`.
    const std::string line = text.substr(begin, end + 1 - begin);
    char* stop = nullptr;
    const long long row_step = std::strtoll(line.c_str(), &stop, 10);
    const bool header = begin == 0;
    if (header || (stop != line.c_str() && *stop == ',' && row_step <= step)) kept += line;
  }
  write_file_atomically(csv_path, kept);
  return true;
}

}  // namespace ft::train

namespace ft::train {

namespace {

// Checkpoint folders of a run whose writing was interrupted (checkpoints/step-N.tmp), by name.
std::vector<std::string> unfinished_checkpoints(const std::string& run_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir + "/checkpoints", ec))
    if (entry.is_directory() && is_temporary_name(entry.path().filename().string()))
      found.push_back(entry.path().string());
  std::sort(found.begin(), found.end());
  return found;
}

std::string newest_checkpoint_of(const std::string& run_dir) {
  const std::vector<SavedCheckpoint> saved = complete_checkpoints(run_dir);
  if (!saved.empty()) return saved.back().dir;
  std::string why = "resume: " + run_dir + " holds no complete checkpoint (checkpoints/step-N with trainer_state.json)";
  for (const std::string& u : unfinished_checkpoints(run_dir))
    why += "; " + u + " is unfinished (its writing was interrupted) and is removed when this run folder is run again";
  FT_FAIL(why);
}

}  // namespace

std::string find_resume_checkpoint(const std::string& arg, const std::string& run_dir, const std::string& runs_root) {
  if (arg != "last") {
    // A checkpoint folder is taken as it is (resume() refuses an unfinished one by name).
    if (!fs::is_directory(arg) || fs::exists(arg + "/trainer_state.json") || !fs::is_directory(arg + "/checkpoints"))
      return arg;
    return newest_checkpoint_of(arg);
  }
  if (!run_dir.empty()) return newest_checkpoint_of(run_dir);
  // The run folder written last (by its metrics.csv or, failing that, the folder's own time) that
  // holds a complete checkpoint.
  std::vector<std::pair<fs::file_time_type, std::string>> runs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(runs_root, ec)) {
    if (!entry.is_directory() || complete_checkpoints(entry.path().string()).empty()) continue;
    const fs::path metrics = entry.path() / "metrics.csv";
    runs.emplace_back(fs::last_write_time(fs::exists(metrics) ? metrics : entry.path()), entry.path().string());
  }
  FT_CHECK(!runs.empty(), "resume last: no run folder under ", runs_root,
           "/ holds a complete checkpoint (train with --checkpoint-every N, or name a folder with --resume DIR)");
  return newest_checkpoint_of(std::max_element(runs.begin(), runs.end())->second);
}

}  // namespace ft::train
