// The fasttrain program's train and sample commands, run as a user runs them: exit codes and
// messages for bad input (one clear line, exit 2, never a crash), --help, TOML config files with
// flag overrides, and sampling from a trained run.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fasttrain/models.h"
#include "fasttrain/train.h"
#include "support/run_cli.h"

namespace fs = std::filesystem;

namespace {

using ft::test::CliRun;
using ft::test::run_cli;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("fasttrain_test_cli_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p.string();
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Options of a char run that takes well under a second.
const char* kTinyToml = R"(progress = false
max_steps = 3
warmup_steps = 1
eval_batches = 1
batch_size = 4
context = 16
layers = 1
dim = 32
heads = 2
train_chars = 20000
val_chars = 4000
)";

void expect_error(const std::string& args, const std::string& fragment) {
  SCOPED_TRACE(args);
  CliRun r = run_cli(args);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("fasttrain: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fragment), std::string::npos) << r.output;
  // One message, not a cascade (and no progress line: errors happen before training starts).
  EXPECT_LE(std::count(r.output.begin(), r.output.end(), '\n'), 2) << r.output;
}

}  // namespace

TEST(Cli, TrainHelpDocumentsEveryOption) {
  CliRun r = run_cli("train --help");
  EXPECT_EQ(r.code, 0) << r.output;
  ft::train::TrainerConfig c;
  ft::train::visit_fields(
      c,
      [&](const ft::train::OptionInfo& o, auto&) {
        std::string flag = std::string("--") + o.name;
        std::replace(flag.begin(), flag.end(), '_', '-');
        EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
      },
      ft::train::ScheduleKinds::Every);
  for (const char* extra : {"--config", "--resume", "(default 600; images: 500)"})
    EXPECT_NE(r.output.find(extra), std::string::npos) << extra;
  CliRun s = run_cli("sample --help");
  EXPECT_EQ(s.code, 0);
  for (const char* opt :
       {"--checkpoint", "--prompt", "--tokens", "--temperature", "--top-k", "--top-p", "--ignore-eos", "--seed"})
    EXPECT_NE(s.output.find(opt), std::string::npos) << opt;
}

TEST(Cli, BadInputGivesOneMessageAndExitCode2) {
  expect_error("train --bogus 1", "--bogus");
  expect_error("train --batch-size -3", "option batch_size: expected at least 1 (or auto), found -3");
  expect_error("train --precision fp4", "precision: expected 32, tf32, bf16-mixed, fp16-mixed, bf16-true or fp8-mixed");
  expect_error("train --optimizer lion", "option optimizer: expected adamw, adam, sgd, lamb or lars, found 'lion'");
  expect_error("train --gradient-clip-algorithm max",
               "option gradient_clip_algorithm: expected norm or value, found 'max'");
  expect_error("lr-find --start-lr 1 --end-lr 0.1",
               "lr_find: max_lr must be finite and greater than min_lr = 1, found 0.1");
  expect_error("train --lr -0.5", "option lr: expected a positive learning rate, found -0.5");
  expect_error("train --max-steps ten", "option max_steps: expected an integer, found 'ten'");
  expect_error(
      "train --max-steps 0",
      "option max_steps: expected at least 1 (or 0 with max_epochs: as many steps as the epochs take), found 0");
  if (ft::cuda_device_count() == 0)
    expect_error(
        "train --device cuda",
        "option device: expected cpu or one of this machine's CUDA devices, found 'cuda' (0 CUDA devices found");
  expect_error("train --task images --context 32", "option --context applies to the char, lm tasks, not images");
  expect_error("train --task text", "option task: expected char, images, lm or classify, found 'text'");
  expect_error("train --config /nonexistent/run.toml", "cannot read the config file /nonexistent/run.toml");
  expect_error("train --resume /nonexistent/ckpt", "/nonexistent/ckpt: no such run or checkpoint folder");
  // Sampling options are checked before the run is read.
  expect_error("sample --checkpoint /nonexistent/run --top-p 1.5",
               "sample: expected --top-p in (0, 1] (1: no nucleus filtering), found 1.5");
  expect_error("sample --checkpoint /nonexistent/run --top-p 0",
               "sample: expected --top-p in (0, 1] (1: no nucleus filtering), found 0");
  expect_error("sample --checkpoint /nonexistent/run --top-p high", "--top-p");
  expect_error("sample", "--checkpoint is required");
  expect_error("sample --checkpoint /nonexistent/run", "/nonexistent/run: no such run or checkpoint folder");
  expect_error("sample --checkpoint . --tokens -1", "--tokens");

  const std::string dir = temp_dir("bad_toml");
  fs::create_directories(dir);
  write(dir + "/unknown.toml", "max_steps = 3\nlearning_rate = 0.1\n");
  expect_error("train --config " + dir + "/unknown.toml", "unknown key 'learning_rate'");
  write(dir + "/typed.toml", "batch_size = \"big\"\n");
  expect_error("train --config " + dir + "/typed.toml", "key 'batch_size': expected an integer");
  write(dir + "/optimizer.toml", "optimizer = \"lion\"\n");
  expect_error("train --config " + dir + "/optimizer.toml",
               "option optimizer: expected adamw, adam, sgd, lamb or lars, found 'lion'");
  fs::remove_all(dir);
}

// --resume takes a checkpoint folder, a run folder (its newest complete checkpoint) or "last";
// a checkpoint left unfinished by a killed write is never taken, is named in the error when it is
// all there is, and is removed by the next run of its folder.
TEST(Cli, ResumeFindsTheNewestCompleteCheckpoint) {
  const std::string dir = temp_dir("resume_find");
  fs::create_directories(dir);
  write(dir + "/run.toml", std::string(kTinyToml) + "checkpoint_every = 1\nkeep_last = 0\n");
  const std::string run = dir + "/run";
  ASSERT_EQ(run_cli("train --config " + dir + "/run.toml --max-steps 2 --run-dir " + run).code, 0);
  // A later checkpoint whose write was cut short: no trainer_state.json, and a .tmp name.
  fs::copy(run + "/checkpoints/step-00000002", run + "/checkpoints/step-00000003.tmp");
  fs::remove(run + "/checkpoints/step-00000003.tmp/trainer_state.json");
  // The run folder: its newest complete checkpoint, step 2 (the next run logs step 3 first).
  CliRun r = run_cli("train --resume " + run + " --max-steps 3 --run-dir " + dir + "/next");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(slurp(dir + "/next/metrics.csv").substr(0, slurp(dir + "/next/metrics.csv").find('\n') + 3),
            slurp(run + "/metrics.csv").substr(0, slurp(run + "/metrics.csv").find('\n') + 1) + "3,");
  // "last" of the run folder, resumed into it: the unfinished folder goes.
  r = run_cli("train --resume last --run-dir " + run + " --max-steps 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_FALSE(fs::exists(run + "/checkpoints/step-00000003.tmp")) << "the unfinished folder was not removed";
  EXPECT_TRUE(fs::exists(run + "/checkpoints/step-00000003/trainer_state.json"));
  fs::create_directories(run + "/checkpoints/step-00000009.tmp");
  expect_error("train --resume " + run + "/checkpoints/step-00000009.tmp", "is an unfinished checkpoint folder");
  // A run folder holding nothing but an unfinished checkpoint.
  const std::string broken = dir + "/broken";
  fs::create_directories(broken + "/checkpoints/step-00000001.tmp");
  expect_error("train --resume " + broken, "resume: " + broken + " holds no complete checkpoint");
  r = run_cli("train --resume " + broken);
  EXPECT_NE(r.output.find(broken + "/checkpoints/step-00000001.tmp is unfinished (its writing was interrupted)"),
            std::string::npos)
      << r.output;
  fs::remove_all(dir);
}

// A checkpoint written by an earlier commit (tests/data/checkpoint_8ca1ea0/README.md: flat
// config.toml and trainer_state.json, options off their defaults in every table) resumes with
// this program and continues the uninterrupted run it came from: its steps 5-8 and the final
// evaluation, the loss to 1e-6 (exact on the machine that wrote it; the slack is for a CPU whose
// kernels round differently), the learning rate and momentum exactly.
TEST(Cli, ACheckpointWrittenBeforeTheConfigWasNestedResumes) {
  const std::string fixture = std::string(FT_TESTS_DIR) + "/data/checkpoint_8ca1ea0";
  const std::string dir = temp_dir("resume_old");
  CliRun r = run_cli("train --resume " + fixture + "/checkpoints/step-00000004 --run-dir " + dir + " --threads 2");
  ASSERT_EQ(r.code, 0) << r.output;
  auto rows_from_step_5 = [](const std::string& csv) {
    std::vector<std::vector<std::string>> rows;
    std::istringstream in(csv);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string> cells;
      std::istringstream cs(line);
      for (std::string cell; std::getline(cs, cell, ',');) cells.push_back(cell);
      if (std::stoi(cells.at(0)) >= 5) rows.push_back(cells);
    }
    return rows;
  };
  const auto expected = rows_from_step_5(slurp(fixture + "/metrics.csv"));
  const auto got = rows_from_step_5(slurp(dir + "/metrics.csv"));
  ASSERT_EQ(expected.size(), 5u);
  ASSERT_EQ(got.size(), expected.size()) << slurp(dir + "/metrics.csv");
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    for (int col : {0, 1, 2, 5, 6}) EXPECT_EQ(got[i].at(col), expected[i].at(col)) << "column " << col;
    EXPECT_NEAR(std::stod(got[i].at(3)), std::stod(expected[i].at(3)), 1e-6 * std::stod(expected[i].at(3)));
  }
  // The options came through: the new run folder's config, read back, holds them.
  const ft::train::TrainerConfig c = ft::train::load_run_config(dir);
  EXPECT_EQ(c.optimizer.kind, ft::optim::OptimizerKind::LAMB);
  const auto& one_cycle = c.schedule.as<ft::train::OneCycleSchedule>();
  EXPECT_EQ(one_cycle.anneal_strategy, ft::optim::AnnealStrategy::Linear);
  EXPECT_TRUE(one_cycle.three_phase);
  EXPECT_EQ(c.optimizer.gradient_clip_algorithm, ft::train::ClipAlgorithm::Value);
  EXPECT_EQ(c.optimizer.grad_clip, 0.5);
  EXPECT_EQ(c.optimizer.beta1, 0.85);
  EXPECT_EQ(c.memory_limit.text, "2G");
  EXPECT_EQ(c.memory_limit.bytes, int64_t{2} << 30);
  EXPECT_EQ(c.checkpoint.keep_last, 3);
  EXPECT_EQ(c.checkpoint.early_stopping_patience, 5);
  EXPECT_EQ(c.dist.bucket_cap_mb, 8.0);
  EXPECT_EQ(c.dist.timeout, 60.0);
  EXPECT_EQ(c.model.dim, 16);
  fs::remove_all(dir);
}

// "last" without --run-dir: the run folder written last under the runs root that has a checkpoint.
TEST(Cli, ResumeLastPicksTheNewestRunFolder) {
  const std::string root = temp_dir("resume_last_root");
  for (const char* name : {"char-a", "char-b", "char-c"}) fs::create_directories(root + "/" + name + "/checkpoints");
  for (const char* name : {"char-a", "char-b"}) {
    fs::create_directories(root + "/" + name + "/checkpoints/step-00000005");
    write(root + "/" + name + "/checkpoints/step-00000005/trainer_state.json", "{}");
    write(root + "/" + name + "/metrics.csv", "step\n");
  }
  fs::last_write_time(root + "/char-a/metrics.csv", fs::file_time_type::clock::now() + std::chrono::hours(1));
  EXPECT_EQ(ft::train::find_resume_checkpoint("last", "", root), root + "/char-a/checkpoints/step-00000005");
  fs::last_write_time(root + "/char-b/metrics.csv", fs::file_time_type::clock::now() + std::chrono::hours(2));
  EXPECT_EQ(ft::train::find_resume_checkpoint("last", "", root), root + "/char-b/checkpoints/step-00000005");
  fs::remove_all(root);
  try {
    ft::train::find_resume_checkpoint("last", "", root);
    ADD_FAILURE() << "no run folder, yet a checkpoint was found";
  } catch (const ft::Error& e) {
    EXPECT_NE(std::string(e.what()).find("resume last: no run folder under " + root), std::string::npos) << e.what();
  }
}

TEST(Cli, TomlConfigWithFlagOverridesThenSample) {
  const std::string dir = temp_dir("toml_run");
  fs::create_directories(dir);
  write(dir + "/run.toml", std::string(kTinyToml) + "lr = 0.002\n");
  const std::string run = dir + "/run";
  CliRun r = run_cli("train --config " + dir + "/run.toml --max-steps 2 --run-dir " + run);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("entropy floor"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("run folder: " + run), std::string::npos) << r.output;
  ft::train::TrainerConfig c = ft::train::load_run_config(run);
  EXPECT_EQ(c.max_steps, 2);           // the flag won
  EXPECT_EQ(c.optimizer.lr, 0.002);    // from the file
  EXPECT_EQ(c.model.dim, 32);          // from the file
  EXPECT_EQ(c.optimizer.beta2, 0.99);  // the char default
  auto summary = nlohmann::json::parse(slurp(run + "/summary.json"));
  EXPECT_EQ(summary["steps"], 2);

  CliRun s = run_cli("sample --checkpoint " + run + " --prompt 'the ' --tokens 30 --seed 1");
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_EQ(s.output.substr(0, 4), "the ");
  EXPECT_EQ(s.output.size(), 35u);  // prompt + 30 characters + newline

  // A corrupt weights file and a run of the wrong task: one message each, never a crash.
  const std::string broken = dir + "/broken";
  fs::copy(run, broken, fs::copy_options::recursive);
  write(broken + "/model.safetensors", "not a safetensors file");
  expect_error("sample --checkpoint " + broken, "model.safetensors");
  write(broken + "/config.toml", "task = \"images\"\n");
  expect_error("sample --checkpoint " + broken, "holds a 'images' run; sample needs a GPT (task char or lm)");
  // Resuming with a different model is refused before anything is trained.
  CliRun k = run_cli("train --config " + dir + "/run.toml --checkpoint-every 1 --max-steps 1 --run-dir " + dir + "/ck");
  ASSERT_EQ(k.code, 0) << k.output;
  expect_error("train --resume " + dir + "/ck/checkpoints/step-00000001 --dim 64",
               "the checkpoint was trained with dim = 32, this run has dim = 64");
  fs::remove_all(dir);
}

// --max-epochs alone sizes the run (and so its schedule) from the data; with --max-steps as well,
// whichever ends first stops it.
TEST(Cli, MaxEpochsAloneSizesTheRun) {
  const std::string dir = temp_dir("epochs_run");
  fs::create_directories(dir);
  std::string toml = kTinyToml;
  toml.replace(toml.find("max_steps = 3\n"), 14, "");
  toml.replace(toml.find("train_chars = 20000"), 19, "train_chars = 2000");
  write(dir + "/run.toml", toml + "eval_every = 0\n");
  auto steps = [&](const std::string& flags, const std::string& name) {
    const CliRun r = run_cli("train --config " + dir + "/run.toml " + flags + " --run-dir " + dir + "/" + name);
    EXPECT_EQ(r.code, 0) << r.output;
    const int64_t recorded = ft::train::load_run_config(dir + "/" + name).max_steps;
    EXPECT_EQ(nlohmann::json::parse(slurp(dir + "/" + name + "/summary.json"))["steps"].get<int64_t>(), recorded);
    EXPECT_NE(r.output.find("done: " + std::to_string(recorded) + " steps"), std::string::npos) << r.output;
    return recorded;
  };
  const int64_t one = steps("--max-epochs 1", "one");
  EXPECT_GT(one, 3);
  EXPECT_EQ(steps("--max-epochs 2", "two"), 2 * one);
  EXPECT_EQ(steps("--max-epochs 2 --max-steps 3", "bounded"), 3);
  fs::remove_all(dir);
}

// `fasttrain data` converts text into shards and prints each one it wrote.
TEST(Cli, DataWritesByteTokenShards) {
  const std::string dir = temp_dir("data");
  fs::create_directories(dir);
  write(dir + "/in.txt", "abcdefg");
  CliRun r = run_cli("data --input " + dir + "/in.txt --output " + dir + "/shards --shard-tokens 4");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + dir + "/shards/tokens_000000.bin: 4 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote " + dir + "/shards/tokens_000001.bin: 3 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 shards, 7 tokens"), std::string::npos) << r.output;
  EXPECT_EQ(fs::file_size(dir + "/shards/tokens_000001.bin"), 1024u + 2 * 3);
  r = run_cli("data --input " + dir + "/missing --output " + dir + "/shards");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("input '" + dir + "/missing' does not exist"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// `fasttrain data --vocab char` writes the shards and vocab.json and says so; bad UTF-8 is refused.
TEST(Cli, DataWritesCharTokenShards) {
  const std::string dir = temp_dir("data_char");
  fs::create_directories(dir);
  write(dir + "/in.txt", "abba\xC3\xA9");
  CliRun r = run_cli("data --vocab char --input " + dir + "/in.txt --output " + dir + "/shards --shard-tokens 3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + dir + "/shards/tokens_000001.bin: 2 tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("wrote " + dir + "/shards/vocab.json: 3 characters"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 shards, 5 tokens, char-level vocabulary of 3"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/shards/vocab.json"));
  write(dir + "/bad.txt", "ab\xFF");
  r = run_cli("data --vocab char --input " + dir + "/bad.txt --output " + dir + "/bad");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'" + dir + "/bad.txt' is not valid UTF-8 at byte offset 2"), std::string::npos) << r.output;
  r = run_cli("data --vocab word --input " + dir + "/in.txt --output " + dir + "/shards");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--vocab"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// `fasttrain lr-find` sweeps a small char model, prints a suggestion and writes the curve files.
TEST(Cli, LrFindWritesTheCurveAndSuggests) {
  const std::string dir = temp_dir("lrfind");
  CliRun r = run_cli("lr-find --num-steps 20 --start-lr 1e-4 --end-lr 1 --run-dir " + dir +
                     " --context 16 --layers 1 --dim 32 --heads 2 --batch-size 4 --train-chars 20000 --val-chars 4000"
                     " --progress false");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("suggested lr: "), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir + "/lr_find.csv"));
  EXPECT_TRUE(fs::exists(dir + "/lr_find.svg"));
  std::ifstream csv(dir + "/lr_find.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,lr,loss,smoothed_loss");
  fs::remove_all(dir);
}
