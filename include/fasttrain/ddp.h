// DDP: data parallelism with replicated weights (PyTorch's DistributedDataParallel). Each rank
// holds the whole model and runs its own micro-batches; the gradients are averaged over the
// ranks in buckets while backward is still running, so the optimizer sees the gradient of the
// whole (global) batch on every rank and the replicas stay identical.
//
// Buckets: the parameters in reverse registration order (roughly the order backward produces
// their gradients), cut into f32 buffers of at most `bucket_cap_bytes` (the first at most
// `first_bucket_bytes`, so communication starts early); a parameter larger than the cap has a
// bucket of its own. A parameter's post-accumulate-grad hook marks it ready; once a bucket and
// every bucket before it are ready they are copied into their buffers and all-reduced on the
// communicator's thread. Buckets are launched in the same order on every rank whatever order
// backward takes, which MPI's matching of collectives by order requires. At the end of backward
// the buckets not yet sent (parameters this pass did not reach) are sent; each bucket carries one
// more value per parameter, 1 where the rank had a gradient, so a parameter no rank used keeps no
// gradient (as in a single process) and one some ranks used gets the mean over all of them.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "fasttrain/dist.h"
#include "fasttrain/nn.h"
#include "fasttrain/train_step.h"

namespace ft::dist {

struct DdpOptions {
  int64_t bucket_cap_bytes = int64_t{25} << 20;   // PyTorch's bucket_cap_mb = 25; <= 0: one bucket
  int64_t first_bucket_bytes = int64_t{1} << 20;  // PyTorch's first bucket (capped by the cap)
};

// Every parameter and buffer of `model` becomes rank `root`'s (DDP's start; replicas may have
// been initialised from different seeds).
void broadcast_module(nn::Module& model, Communicator& comm, int root = 0);

class DataParallel : public train::GradSync {
 public:
  // Registers the gradient hooks on `model`'s parameters that require grad.
  DataParallel(nn::Module& model, std::shared_ptr<Communicator> comm, DdpOptions options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override;
  void agree_fp8_amax(const std::vector<Tensor>& amaxes) override;

  // The buckets' sizes in elements (gradients only, in launch order), for tests and reports.
  std::vector<int64_t> bucket_sizes() const;
  // Gradient bytes one step all-reduces (f32 values of every parameter, plus the used flags).
  int64_t bytes_per_step() const;

 private:
  struct Slot {
    Tensor param;
    int64_t offset = 0;  // in the bucket's buffer, elements
    bool ready = false;
  };
  struct Bucket {
    std::vector<Slot> slots;
    int64_t elements = 0;  // gradient values; the used flags follow them in `buffer`
    Tensor buffer;         // f32, elements + slots.size()
    int64_t ready = 0;
    WorkPtr work;  // in flight or done this step
  };
  void on_ready(size_t bucket, size_t slot);
  void launch_ready();
  void launch(Bucket& b);
  void wait_all();

  std::shared_ptr<Communicator> comm_;
  DdpOptions options_;
  std::vector<Bucket> buckets_;
  size_t next_ = 0;       // the first bucket not launched this step
  bool syncing_ = false;  // inside the backward of a step's last micro-batch
  // Hooks outlive nothing: they hold this flag, cleared by the destructor, and do nothing once
  // it is false (a module may outlive its DataParallel).
  std::shared_ptr<bool> alive_;
};

}  // namespace ft::dist
