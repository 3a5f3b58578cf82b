// The data of the classify task (tasks.h): --data / --val-data in one of four forms turned into
// normalised, augmented training and validation datasets, with every check on the data and on
// whether the model can take it made when ClassifyData is built, before the Trainer writes
// anything. docs/ARCHITECTURE.md ("The classify task") describes the pipeline.
//   mnist:DIR    DIR/train-images-idx3-ubyte + train-labels-idx1-ubyte; as --val-data, the t10k-*
//                test files of DIR
//   cifar10:DIR  DIR/data_batch_1.bin .. data_batch_5.bin (those present; DIR may also be the
//                folder holding cifar-10-batches-bin/); as --val-data, DIR/test_batch.bin
//   folder:DIR   one sub-folder of JPEG/PNG images per class (data::ImageFolderDataset)
//   npy:X,Y      X: [n, d] feature vectors, or [n, C, H, W] / [n, H, W] images, any numeric dtype;
//                Y: [n] integer labels in [0, classes), classes = the largest label in Y + 1
// Without --val-data a deterministic val_fraction of the training data (a permutation seeded by
// the run's seed) is held out; the two splits are disjoint.
// Implemented in src/tasks/classify_data.cpp; the module is in classify_task.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fasttrain/train.h"
#include "fasttrain/train_module.h"

namespace ft::train {

// What the module, the summary and task.json need to know about the data.
struct ClassifyInfo {
  std::string kind;  // mnist, cifar10, folder or npy
  std::vector<std::string> classes;
  bool images = true;      // samples are images [channels, image_size, image_size]; else vectors [features]
  int64_t channels = 0;    // images
  int64_t image_size = 0;  // images: the side the model sees
  int64_t features = 0;    // vectors
  // Per channel (images) or feature (vectors) over --data (all of it, a held-out split
  // included): what the model sees is (x - mean) / std, x in [0, 1] for 8-bit images
  // (pixel / 255) and as stored for npy data.
  std::vector<double> mean, std;
  int64_t stats_samples = 0;  // samples of --data the statistics were computed over
  int64_t train_samples = 0, val_samples = 0;
  bool held_out = false;        // the validation split was held out of --data (val_fraction)
  int64_t crop_padding = 0;     // training augmentation: random crop after this much zero padding
  bool flip = false;            // and a random horizontal flip
  bool decoded_lazily = false;  // folder: too large to hold decoded, decoded by the loader

  Shape sample_shape() const;  // [channels, size, size] or [features]
};

class ClassifyData : public DataModule {
 public:
  // Reads and checks everything; throws ft::Error naming the option or file and what was expected.
  explicit ClassifyData(const TrainerConfig& c);
  const ClassifyInfo& info() const { return info_; }
  TrainData train_data(int64_t) const override { return {train_, nullptr, nullptr}; }
  ValData val_data(int64_t) const override { return {val_, nullptr}; }
  // With a held-out split: the indices of --data's samples in each split (ascending).
  const std::vector<int64_t>& train_indices() const { return train_indices_; }
  const std::vector<int64_t>& val_indices() const { return val_indices_; }

 private:
  ClassifyInfo info_;
  data::DatasetPtr train_, val_;
  std::vector<int64_t> train_indices_, val_indices_;
};

// Throws unless `model` (mlp, cnn-mini, resnet18/20/50) can take the samples `info` describes
// (its kind, channels, image size or features); `data` names the data in the message.
void check_classify_model(const std::string& model, const ClassifyInfo& info, const std::string& data);

}  // namespace ft::train
