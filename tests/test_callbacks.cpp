// Early stopping and checkpoint keeping (src/train/callbacks.cpp): each rule of Lightning's
// EarlyStopping / ModelCheckpoint(save_top_k) semantics, state round trips and errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "fasttrain/callbacks.h"
#include "support/expect_error.h"

using ft::test::expect_error;
using namespace ft::train;
namespace fs = std::filesystem;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
using Dirs = std::vector<std::string>;

TEST(MonitorMode, FromName) {
  EXPECT_EQ(monitor_mode_from_name("min"), MonitorMode::Min);
  EXPECT_EQ(monitor_mode_from_name("max"), MonitorMode::Max);
  expect_error([] { monitor_mode_from_name("avg"); }, "monitor mode: expected 'min' or 'max', found 'avg'");
}

// --- EarlyStopping -----------------------------------------------------------------------------

TEST(EarlyStopping, StopsAfterPatienceChecksWithoutImprovement) {
  EarlyStopping es(MonitorMode::Min, 2);
  EXPECT_TRUE(std::isinf(es.best()) && es.best() > 0);
  EXPECT_FALSE(es.update(1.0));
  EXPECT_FALSE(es.update(0.9));
  EXPECT_EQ(es.best(), 0.9);
  EXPECT_FALSE(es.update(0.95));
  EXPECT_EQ(es.wait_count(), 1);
  EXPECT_TRUE(es.update(0.9));  // equal is not an improvement
  EXPECT_TRUE(es.should_stop());
  EXPECT_EQ(es.wait_count(), 2);
  EXPECT_EQ(es.best(), 0.9);
}

TEST(EarlyStopping, ImprovementResetsTheWait) {
  EarlyStopping es(MonitorMode::Min, 3);
  for (double v : {5.0, 6.0, 7.0, 4.0, 6.0, 6.0}) EXPECT_FALSE(es.update(v)) << v;
  EXPECT_EQ(es.wait_count(), 2);
  EXPECT_EQ(es.best(), 4.0);
  EXPECT_TRUE(es.update(4.0));
}

TEST(EarlyStopping, MinDeltaMustBeExceeded) {
  EarlyStopping es(MonitorMode::Min, 5, 0.25);
  es.update(1.0);
  es.update(0.75);  // exactly best - min_delta: not an improvement
  EXPECT_EQ(es.best(), 1.0);
  EXPECT_EQ(es.wait_count(), 1);
  es.update(0.5);
  EXPECT_EQ(es.best(), 0.5);
  EXPECT_EQ(es.wait_count(), 0);

  EarlyStopping mx(MonitorMode::Max, 5, 0.25);
  mx.update(1.0);
  mx.update(1.25);
  EXPECT_EQ(mx.best(), 1.0);
  EXPECT_EQ(mx.wait_count(), 1);
  mx.update(1.5);
  EXPECT_EQ(mx.best(), 1.5);
  mx.update(0.0);
  EXPECT_EQ(mx.best(), 1.5);
  EXPECT_EQ(mx.wait_count(), 1);
}

TEST(EarlyStopping, NaNNeverImproves) {
  EarlyStopping es(MonitorMode::Max, 2);
  EXPECT_FALSE(es.update(kNaN));
  EXPECT_EQ(es.wait_count(), 1);
  EXPECT_TRUE(std::isinf(es.best()) && es.best() < 0);
  EXPECT_FALSE(es.update(0.5));
  EXPECT_FALSE(es.update(kNaN));
  EXPECT_TRUE(es.update(kNaN));
  EXPECT_EQ(es.best(), 0.5);
}

TEST(EarlyStopping, ZeroPatienceStopsAtTheFirstCheckWithoutImprovement) {
  EarlyStopping es(MonitorMode::Min, 0);
  EXPECT_FALSE(es.update(3.0));
  EXPECT_FALSE(es.update(2.0));
  EXPECT_TRUE(es.update(2.0));
}

TEST(EarlyStopping, StopIsFinal) {
  EarlyStopping es(MonitorMode::Min, 1);
  es.update(1.0);
  EXPECT_TRUE(es.update(2.0));
  EXPECT_TRUE(es.update(0.1));  // a later improvement does not revoke the decision
  EXPECT_EQ(es.best(), 0.1);
}

TEST(EarlyStopping, StateRoundTripContinuesIdentically) {
  for (int cut = 0; cut <= 4; ++cut) {  // cut 0 saves the untouched state (best = inf)
    const std::vector<double> values = {3.0, 2.0, kNaN, 2.5, 1.0, 1.5, 1.5, 1.2};
    EarlyStopping a(MonitorMode::Min, 3, 0.1);
    for (int i = 0; i < cut; ++i) a.update(values[i]);
    EarlyStopping b(MonitorMode::Min, 3, 0.1);
    b.load_state(a.state());  // through text, as in a checkpoint
    EXPECT_EQ(b.best(), a.best());
    EXPECT_EQ(b.wait_count(), a.wait_count());
    for (size_t i = cut; i < values.size(); ++i) {
      EXPECT_EQ(b.update(values[i]), a.update(values[i])) << "cut " << cut << " value " << i;
      EXPECT_EQ(b.wait_count(), a.wait_count());
    }
  }
}

TEST(EarlyStopping, RejectsBadConfigurationAndState) {
  expect_error([] { EarlyStopping(MonitorMode::Min, -1); }, "expected patience >= 0, found -1");
  expect_error([] { EarlyStopping(MonitorMode::Min, 1, -0.5); }, "expected a finite min_delta >= 0, found -0.5");
  expect_error([] { EarlyStopping(MonitorMode::Min, 1, kNaN); }, "finite min_delta");
  EarlyStopping es(MonitorMode::Min, 2);
  const nlohmann::json good = nlohmann::json::parse(es.state());
  expect_error([&] { es.load_state("[]"); }, "early stopping state: expected a JSON object, found array");
  expect_error([&] { es.load_state("{\"mode\": "); }, "early stopping state: not valid JSON");
  expect_error([&] { EarlyStopping(MonitorMode::Max, 2).load_state(good.dump()); },
               "early stopping state: saved for mode 'min', this run monitors 'max'");
  for (const char* f : {"mode", "best", "wait", "stop"}) {
    nlohmann::json s = good;
    s.erase(f);
    expect_error([&] { es.load_state(s.dump()); }, std::string("missing field '") + f + "'");
  }
  nlohmann::json s = good;
  s["wait"] = -1;
  expect_error([&] { es.load_state(s.dump()); }, "field 'wait' must be an integer >= 0, found -1");
  s = good;
  s["best"] = "low";
  expect_error([&] { es.load_state(s.dump()); }, "field 'best' must be a number");
  s = good;
  s["stop"] = 1;
  expect_error([&] { es.load_state(s.dump()); }, "field 'stop' must be true or false, found 1");
  s = good;
  s["mode"] = "avg";
  expect_error([&] { es.load_state(s.dump()); }, "field 'mode' must be \"min\" or \"max\", found \"avg\"");
}

// --- CheckpointKeeper --------------------------------------------------------------------------

TEST(CheckpointKeeper, KeepsTheNewest) {
  CheckpointKeeper k(2, 0, MonitorMode::Min);
  EXPECT_EQ(k.add("s1", 1, 0.1), Dirs{});
  EXPECT_EQ(k.add("s2", 2, 0.2), Dirs{});
  EXPECT_EQ(k.add("s3", 3, 0.3), Dirs{"s1"});
  EXPECT_EQ(k.add("s4", 4, 0.0), Dirs{"s2"});
  EXPECT_EQ(k.best_dir(), "s4");
  // A checkpoint with an older step (after resuming from an earlier one) is the oldest.
  EXPECT_EQ(k.add("s0", 0, 0.0), Dirs{"s0"});
}

TEST(CheckpointKeeper, KeepsTheBestAndTheNewest) {
  CheckpointKeeper k(1, 2, MonitorMode::Min);
  EXPECT_EQ(k.add("s1", 1, 0.5), Dirs{});
  EXPECT_EQ(k.add("s2", 2, 0.7), Dirs{});
  EXPECT_EQ(k.add("s3", 3, 0.9), Dirs{});  // s3 newest, s1 and s2 best
  EXPECT_EQ(k.add("s4", 4, 0.8), (Dirs{"s3"}));
  EXPECT_EQ(k.add("s5", 5, 0.1), (Dirs{"s2", "s4"}));  // oldest first
  EXPECT_EQ(k.best_dir(), "s5");
  EXPECT_EQ(k.add("s6", 6, 0.3), Dirs{"s1"});  // s6 newest and second best, s5 best: s1 third
  EXPECT_EQ(k.add("s7", 7, 0.2), Dirs{"s6"});
}

TEST(CheckpointKeeper, MaxModeAndTiesPreferTheNewerStep) {
  CheckpointKeeper k(0, 1, MonitorMode::Max);
  EXPECT_EQ(k.add("a", 10, 0.5), Dirs{});
  EXPECT_EQ(k.add("b", 20, 0.4), Dirs{"b"});
  EXPECT_EQ(k.add("c", 30, 0.5), Dirs{"a"});  // same metric: the newer step wins
  EXPECT_EQ(k.best_dir(), "c");
  EXPECT_EQ(k.add("d", 40, 0.9), Dirs{"c"});
}

TEST(CheckpointKeeper, NaNIsNeverBest) {
  CheckpointKeeper k(1, 1, MonitorMode::Min);
  EXPECT_EQ(k.add("s1", 1, kNaN), Dirs{});
  EXPECT_EQ(k.best_dir(), "");
  EXPECT_EQ(k.add("s2", 2, kNaN), Dirs{"s1"});
  EXPECT_EQ(k.add("s3", 3, 5.0), Dirs{"s2"});
  EXPECT_EQ(k.add("s4", 4, kNaN), Dirs{});  // s4 newest, s3 best
  EXPECT_EQ(k.best_dir(), "s3");

  CheckpointKeeper best_only(0, 2, MonitorMode::Min);
  EXPECT_EQ(best_only.add("unmeasured", 1, kNaN), Dirs{"unmeasured"});
}

TEST(CheckpointKeeper, WritingTheSameFolderAgainReplacesItsEntry) {
  CheckpointKeeper k(2, 0, MonitorMode::Min);
  k.add("last", 1, 1.0);
  k.add("s2", 2, 1.0);
  EXPECT_EQ(k.add("last", 3, 0.5), Dirs{});  // still two entries: s2 and last
  EXPECT_EQ(k.add("s4", 4, 2.0), Dirs{"s2"});
}

TEST(CheckpointKeeper, StateRoundTripContinuesIdentically) {
  CheckpointKeeper a(1, 2, MonitorMode::Max);
  a.add("s1", 100, 0.5);
  a.add("s2", 200, kNaN);
  a.add("s3", 300, 0.25);
  CheckpointKeeper b(1, 2, MonitorMode::Max);
  b.load_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  EXPECT_EQ(b.best_dir(), a.best_dir());
  const std::vector<std::pair<int64_t, double>> next = {{400, 0.1}, {500, kNaN}, {600, 0.75}, {700, 0.3}};
  for (auto [step, metric] : next) {
    const std::string dir = "s" + std::to_string(step / 100);
    EXPECT_EQ(b.add(dir, step, metric), a.add(dir, step, metric)) << dir;
  }
}

TEST(CheckpointKeeper, RejectsBadConfigurationInputAndState) {
  expect_error([] { CheckpointKeeper(-1, 1, MonitorMode::Min); },
               "expected keep_last >= 0 and keep_best >= 0, found -1 and 1");
  expect_error([] { CheckpointKeeper(0, 0, MonitorMode::Min); }, "keep_last and keep_best are both 0");
  CheckpointKeeper k(1, 1, MonitorMode::Min);
  expect_error([&] { k.add("", 1, 0.0); }, "expected a checkpoint folder, found an empty string");
  expect_error([&] { k.add("s", -2, 0.0); }, "s: expected a step >= 0, found -2");

  k.add("s1", 1, 0.5);
  const nlohmann::json good = nlohmann::json::parse(k.state());
  expect_error([&] { CheckpointKeeper(1, 1, MonitorMode::Max).load_state(good.dump()); },
               "checkpoint keeping state: saved for mode 'min', this run monitors 'max'");
  nlohmann::json s = good;
  s["kept"] = 3;
  expect_error([&] { k.load_state(s.dump()); }, "field 'kept' must be an array, found number");
  s = good;
  s["kept"][0].erase("dir");
  expect_error([&] { k.load_state(s.dump()); }, "missing field 'dir'");
  s = good;
  s["kept"][0]["dir"] = "";
  expect_error([&] { k.load_state(s.dump()); }, "field 'dir' must be a non-empty string");
  s = good;
  s["kept"][0]["step"] = 1.5;
  expect_error([&] { k.load_state(s.dump()); }, "field 'step' must be an integer >= 0, found 1.5");
  s = good;
  s["kept"][0]["metric"] = nullptr;
  expect_error([&] { k.load_state(s.dump()); },
               "field 'metric' must be a number, \"inf\", \"-inf\" or \"nan\", found null");
  EXPECT_EQ(nlohmann::json::parse(k.state()), good);  // a rejected state leaves the keeper as it was
}

TEST(CheckpointKeeper, DeleteUnkeptRemovesFoldersRecursively) {
  const fs::path root = fs::temp_directory_path() / ("ft_callbacks_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "s1" / "nested");
  std::ofstream(root / "s1" / "nested" / "model.safetensors") << "x";
  fs::create_directories(root / "s2");
  delete_unkept({(root / "s1").string(), (root / "gone").string()});  // "gone" never existed
  EXPECT_FALSE(fs::exists(root / "s1"));
  EXPECT_TRUE(fs::exists(root / "s2"));
  expect_error([] { delete_unkept({""}); }, "expected a folder, found an empty string");
  fs::remove_all(root);
}

}  // namespace
