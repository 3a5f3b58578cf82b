// The built-in tasks of `fasttrain train --task`, as ordinary TrainModule / DataModule pairs
// (train_module.h) built from a TrainerConfig: nothing in the Trainer knows about them.
//  char    a small GPT learns next-character prediction on text drawn from the built-in trigram
//          Markov chain, whose entropy rate is the floor its validation loss is reported against
//  images  a small CNN classifies procedurally drawn shapes
// Implemented in src/train/char_task.cpp and src/train/image_task.cpp.
#pragma once
#include <memory>

#include "fasttrain/nn.h"
#include "fasttrain/random.h"
#include "fasttrain/train.h"
#include "fasttrain/train_module.h"

namespace ft::train {

struct BuiltinTask {
  std::unique_ptr<TrainModule> module;
  std::unique_ptr<DataModule> data;
};
// The task config.task names, with its data drawn and its model initialised from config.seed.
BuiltinTask make_builtin_task(const TrainerConfig& config);

// The char task's model, built from the config (also used by `fasttrain sample`).
std::shared_ptr<nn::GPT> make_char_model(const TrainerConfig& c, int64_t vocab_size, Generator* gen);

}  // namespace ft::train
