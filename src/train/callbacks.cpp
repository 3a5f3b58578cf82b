// Early stopping and checkpoint keeping (callbacks.h).
#include "fasttrain/callbacks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "fasttrain/error.h"

namespace ft::train {

namespace {

const char* mode_name(MonitorMode mode) { return mode == MonitorMode::Min ? "min" : "max"; }

// Whether `value` beats `best` by more than `min_delta` (NaN never does: every comparison with
// NaN is false).
bool improves(MonitorMode mode, double value, double best, double min_delta) {
  return mode == MonitorMode::Min ? value < best - min_delta : value > best + min_delta;
}

// JSON has no inf or NaN, yet an untouched best is ±inf and an unmeasured metric is NaN: they are
// stored as the strings "inf", "-inf" and "nan".
nlohmann::json number_to_json(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

template <class... Args>
[[noreturn]] void bad_state(const char* who, const Args&... args) {
  FT_FAIL(who, " state: ", args...);
}

nlohmann::json parse_state(const char* who, const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    bad_state(who, "not valid JSON (", e.what(), ")");
  }
}

const nlohmann::json& field(const char* who, const nlohmann::json& state, const char* name) {
  if (!state.is_object()) bad_state(who, "expected a JSON object, found ", state.type_name());
  auto it = state.find(name);
  if (it == state.end()) bad_state(who, "missing field '", name, "'");
  return *it;
}

double number_from_json(const char* who, const nlohmann::json& j, const char* name) {
  if (j.is_number()) return j.get<double>();
  if (j == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (j == "inf") return std::numeric_limits<double>::infinity();
  if (j == "-inf") return -std::numeric_limits<double>::infinity();
  bad_state(who, "field '", name, "' must be a number, \"inf\", \"-inf\" or \"nan\", found ", j.dump());
}

int64_t count_from_json(const char* who, const nlohmann::json& j, const char* name) {
  if (!j.is_number_integer() || j.get<int64_t>() < 0)
    bad_state(who, "field '", name, "' must be an integer >= 0, found ", j.dump());
  return j.get<int64_t>();
}

// The saved mode must be the run's: a best value recorded for "min" means nothing for "max".
void check_mode(const char* who, const nlohmann::json& state, MonitorMode mode) {
  const nlohmann::json& m = field(who, state, "mode");
  if (!m.is_string() || (m != "min" && m != "max"))
    bad_state(who, "field 'mode' must be \"min\" or \"max\", found ", m.dump());
  if (m != mode_name(mode))
    bad_state(who, "saved for mode '", m.get<std::string>(), "', this run monitors '", mode_name(mode), "'");
}

}  // namespace

MonitorMode monitor_mode_from_name(const std::string& name) {
  if (name == "min") return MonitorMode::Min;
  if (name == "max") return MonitorMode::Max;
  FT_FAIL("monitor mode: expected 'min' or 'max', found '", name, "'");
}

// --- EarlyStopping -----------------------------------------------------------------------------

EarlyStopping::EarlyStopping(MonitorMode mode, int64_t patience, double min_delta)
    : mode_(mode),
      patience_(patience),
      min_delta_(min_delta),
      best_(mode == MonitorMode::Min ? std::numeric_limits<double>::infinity()
                                     : -std::numeric_limits<double>::infinity()) {
  FT_CHECK(patience >= 0, "early stopping: expected patience >= 0, found ", patience);
  FT_CHECK(std::isfinite(min_delta) && min_delta >= 0, "early stopping: expected a finite min_delta >= 0, found ",
           min_delta);
}

bool EarlyStopping::update(double value) {
  if (improves(mode_, value, best_, min_delta_)) {
    best_ = value;
    wait_ = 0;
  } else if (++wait_ >= patience_) {
    stop_ = true;  // stays set: the decision is not revoked by a later improvement
  }
  return stop_;
}

std::string EarlyStopping::state() const {
  const nlohmann::json state = {
      {"mode", mode_name(mode_)}, {"best", number_to_json(best_)}, {"wait", wait_}, {"stop", stop_}};
  return state.dump();
}

void EarlyStopping::load_state(const std::string& json_text) {
  const char* who = "early stopping";
  const nlohmann::json state = parse_state(who, json_text);
  check_mode(who, state, mode_);
  const double best = number_from_json(who, field(who, state, "best"), "best");
  const int64_t wait = count_from_json(who, field(who, state, "wait"), "wait");
  const nlohmann::json& stop = field(who, state, "stop");
  if (!stop.is_boolean()) bad_state(who, "field 'stop' must be true or false, found ", stop.dump());
  // Patience and min_delta stay as configured for this run: a resumed run may change them.
  best_ = best;
  wait_ = wait;
  stop_ = stop.get<bool>();
}

// --- CheckpointKeeper --------------------------------------------------------------------------

CheckpointKeeper::CheckpointKeeper(int64_t keep_last, int64_t keep_best, MonitorMode mode)
    : keep_last_(keep_last), keep_best_(keep_best), mode_(mode) {
  FT_CHECK(keep_last >= 0 && keep_best >= 0, "checkpoint keeping: expected keep_last >= 0 and keep_best >= 0, found ",
           keep_last, " and ", keep_best);
  FT_CHECK(keep_last + keep_best > 0,
           "checkpoint keeping: keep_last and keep_best are both 0, which would delete every checkpoint");
}

namespace {

// Orders checkpoints from best to worst: by metric, ties (and NaN metrics, which are last) by
// newer step.
template <class Entry>
bool better(MonitorMode mode, const Entry& a, const Entry& b) {
  const bool a_nan = std::isnan(a.metric), b_nan = std::isnan(b.metric);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.metric != b.metric) return mode == MonitorMode::Min ? a.metric < b.metric : a.metric > b.metric;
  return a.step > b.step;
}

}  // namespace

std::vector<std::string> CheckpointKeeper::add(const std::string& dir, int64_t step, double metric) {
  FT_CHECK(!dir.empty(), "checkpoint keeping: expected a checkpoint folder, found an empty string");
  FT_CHECK(step >= 0, "checkpoint keeping: ", dir, ": expected a step >= 0, found ", step);
  // The same folder written again (it was replaced on disk): the new entry replaces the old one.
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(), [&](const Entry& e) { return e.dir == dir; }), kept_.end());
  // kept_ stays ordered by step, a later add of the same step counting as newer.
  auto pos = std::upper_bound(kept_.begin(), kept_.end(), step, [](int64_t s, const Entry& e) { return s < e.step; });
  kept_.insert(pos, Entry{dir, step, metric});

  std::vector<bool> keep(kept_.size(), false);
  const size_t n = kept_.size();
  for (size_t i = n - std::min<size_t>(n, static_cast<size_t>(keep_last_)); i < n; ++i) keep[i] = true;
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (!std::isnan(kept_[i].metric)) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return better(mode_, kept_[a], kept_[b]); });
  for (size_t i = 0; i < std::min<size_t>(order.size(), static_cast<size_t>(keep_best_)); ++i) keep[order[i]] = true;

  std::vector<std::string> dropped;
  std::vector<Entry> still;
  for (size_t i = 0; i < n; ++i) {
    if (keep[i])
      still.push_back(std::move(kept_[i]));
    else
      dropped.push_back(std::move(kept_[i].dir));
  }
  kept_ = std::move(still);
  return dropped;
}

std::string CheckpointKeeper::best_dir() const {
  const Entry* best = nullptr;
  for (const Entry& e : kept_)
    if (!std::isnan(e.metric) && (!best || better(mode_, e, *best))) best = &e;
  return best ? best->dir : "";
}

std::string CheckpointKeeper::state() const {
  nlohmann::json kept = nlohmann::json::array();
  for (const Entry& e : kept_) kept.push_back({{"dir", e.dir}, {"step", e.step}, {"metric", number_to_json(e.metric)}});
  const nlohmann::json state = {{"mode", mode_name(mode_)}, {"kept", kept}};
  return state.dump();
}

void CheckpointKeeper::load_state(const std::string& json_text) {
  const char* who = "checkpoint keeping";
  const nlohmann::json state = parse_state(who, json_text);
  check_mode(who, state, mode_);
  const nlohmann::json& kept = field(who, state, "kept");
  if (!kept.is_array()) bad_state(who, "field 'kept' must be an array, found ", kept.type_name());
  std::vector<Entry> entries;
  for (const nlohmann::json& e : kept) {
    const nlohmann::json& dir = field(who, e, "dir");
    if (!dir.is_string() || dir.get<std::string>().empty())
      bad_state(who, "field 'dir' must be a non-empty string, found ", dir.dump());
    entries.push_back(Entry{dir.get<std::string>(), count_from_json(who, field(who, e, "step"), "step"),
                            number_from_json(who, field(who, e, "metric"), "metric")});
  }
  // add() relies on the order by step.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.step < b.step; });
  kept_ = std::move(entries);
}

void delete_unkept(const std::vector<std::string>& dirs) {
  for (const std::string& dir : dirs) {
    FT_CHECK(!dir.empty(), "delete checkpoints: expected a folder, found an empty string");
    std::error_code ec;
    // Renamed first: a deletion cut short by a crash must not leave a partial folder under a
    // complete checkpoint's name (run_files.h: names ending in .tmp are never complete).
    std::string doomed = dir;
    while (!doomed.empty() && doomed.back() == '/') doomed.pop_back();
    doomed += ".tmp";
    std::filesystem::remove_all(doomed, ec);
    if (std::rename(dir.c_str(), doomed.c_str()) != 0) doomed = dir;
    std::filesystem::remove_all(doomed, ec);  // a folder already gone removes nothing and is no error
    FT_CHECK(!ec, dir, ": cannot delete the checkpoint folder: ", ec.message());
  }
}

}  // namespace ft::train
