// Decisions the Trainer takes from monitored metrics, as in Lightning's EarlyStopping and
// ModelCheckpoint callbacks. Plain state machines (no I/O except CheckpointKeeper's deletes), so
// they are easy to test and their state is saved in checkpoints. Implemented in src/train/callbacks.cpp.
//
// State travels as JSON text rather than a JSON library's value type, so that this header (and a
// program using it) needs nothing beyond the standard library; the Trainer embeds the text in
// trainer_state.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ft::train {

enum class MonitorMode { Min, Max };
MonitorMode monitor_mode_from_name(const std::string& name);  // "min" / "max", else ft::Error

// Stops when the monitored value has not improved by more than min_delta for `patience`
// consecutive checks (Lightning's semantics; a NaN value counts as no improvement).
class EarlyStopping {
 public:
  EarlyStopping(MonitorMode mode, int64_t patience, double min_delta = 0.0);
  // Records a value; returns true when training should stop.
  bool update(double value);
  bool should_stop() const { return stop_; }
  double best() const { return best_; }
  int64_t wait_count() const { return wait_; }
  std::string state() const;                      // a JSON object, as text
  void load_state(const std::string& json_text);  // validates fields, names the bad one

 private:
  MonitorMode mode_;
  int64_t patience_;
  double min_delta_;
  double best_;
  int64_t wait_ = 0;
  bool stop_ = false;
};

// Which checkpoint folders to keep: the newest keep_last and the best keep_best by the monitored
// metric (either may be 0). add() registers a written checkpoint and returns the folders that
// are no longer kept, which the caller deletes (delete_unkept does it).
class CheckpointKeeper {
 public:
  CheckpointKeeper(int64_t keep_last, int64_t keep_best, MonitorMode mode);
  // metric: the monitored value at this checkpoint (NaN when not measured: never "best").
  std::vector<std::string> add(const std::string& dir, int64_t step, double metric);
  // The best kept checkpoint so far ("" if none has a metric).
  std::string best_dir() const;
  std::string state() const;  // a JSON object, as text
  void load_state(const std::string& json_text);

 private:
  struct Entry {
    std::string dir;
    int64_t step;
    double metric;
  };
  int64_t keep_last_, keep_best_;
  MonitorMode mode_;
  std::vector<Entry> kept_;
};
// Removes each folder (recursively); a folder that is already gone is not an error.
void delete_unkept(const std::vector<std::string>& dirs);

}  // namespace ft::train
