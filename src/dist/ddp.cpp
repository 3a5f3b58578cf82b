// DDP (ddp.h): gradient buckets filled by the post-accumulate-grad hooks and all-reduced on the
// communicator's thread while backward goes on.
#include "fasttrain/ddp.h"

#include <algorithm>
#include <unordered_set>

#include "fasttrain/autograd.h"
#include "fasttrain/error.h"

namespace ft::dist {

namespace {

// Each tensor once (tied weights are one parameter), in registration order.
std::vector<Tensor> unique_tensors(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::unordered_set<const TensorImpl*> seen;
  std::vector<Tensor> out;
  for (const auto& [name, t] : named)
    if (seen.insert(t.impl()).second) out.push_back(t);
  return out;
}

}  // namespace

void broadcast_module(nn::Module& model, Communicator& comm, int root) {
  if (comm.world_size() == 1) return;
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> tensors = unique_tensors(model.named_parameters());
  for (const Tensor& b : unique_tensors(model.named_buffers())) tensors.push_back(b);
  std::vector<WorkPtr> works;
  std::vector<std::pair<Tensor, Tensor>> copy_back;  // (tensor, its contiguous stand-in)
  for (const Tensor& t : tensors) {
    Tensor data = t.detach();
    if (!data.is_contiguous()) {
      copy_back.emplace_back(data, data.contiguous());
      data = copy_back.back().second;
    }
    works.push_back(comm.broadcast_async(data, root));
  }
  for (const WorkPtr& w : works) w->wait();
  for (auto& [t, c] : copy_back) t.copy_(c);
  for (const Tensor& t : tensors) t.bump_version();
}

DataParallel::DataParallel(nn::Module& model, std::shared_ptr<Communicator> comm, DdpOptions options)
    : comm_(std::move(comm)), options_(options), alive_(std::make_shared<bool>(true)) {
  FT_CHECK(comm_ != nullptr, "DataParallel: expected a communicator, found none");
  std::vector<Tensor> params;
  for (const Tensor& p : unique_tensors(model.named_parameters()))
    if (p.requires_grad()) params.push_back(p);
  std::reverse(params.begin(), params.end());  // backward reaches the last layers first
  const int64_t unbounded = INT64_MAX / 8;
  const int64_t cap = options_.bucket_cap_bytes > 0 ? options_.bucket_cap_bytes : unbounded;
  const int64_t first_cap = std::min(cap, options_.first_bucket_bytes > 0 ? options_.first_bucket_bytes : cap);
  for (const Tensor& p : params) {
    const int64_t bytes = p.numel() * static_cast<int64_t>(sizeof(float));
    const int64_t current_limit = buckets_.size() == 1 ? first_cap : cap;
    // A new bucket when this parameter would take the current one past its cap (a parameter
    // larger than the cap gets a bucket of its own).
    if (buckets_.empty() || (!buckets_.back().slots.empty() &&
                             (buckets_.back().elements * static_cast<int64_t>(sizeof(float)) + bytes > current_limit)))
      buckets_.emplace_back();
    Bucket& b = buckets_.back();
    b.slots.push_back({p, b.elements, false});
    b.elements += p.numel();
  }
  // Buckets live where the communicator reduces: on the GPU for NCCL, in host memory for MPI (a
  // device gradient is staged into the host bucket by the copy that fills it).
  const Device bucket_device = comm_->buffer_device(params.empty() ? Device::cpu() : params.front().device());
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    Bucket& b = buckets_[bi];
    b.buffer = zeros({b.elements + static_cast<int64_t>(b.slots.size())}, TensorOptions(DType::F32, bucket_device));
    for (size_t si = 0; si < b.slots.size(); ++si) {
      std::weak_ptr<bool> alive = alive_;
      b.slots[si].param.register_post_accumulate_grad_hook([this, alive, bi, si](Tensor&) {
        const std::shared_ptr<bool> a = alive.lock();
        if (a && *a) on_ready(bi, si);
      });
    }
  }
}

DataParallel::~DataParallel() {
  *alive_ = false;
  // Collectives still queued write into our buffers: let them finish (errors are the caller's
  // concern by now, and the watchdog bounds the wait).
  for (Bucket& b : buckets_)
    if (b.work) try {
        b.work->wait();
      } catch (const std::exception&) {
      }
}

void DataParallel::before_backward(bool last) {
  syncing_ = last;
  if (!last) return;
  wait_all();  // a step that failed half-way may have left buckets in flight
  next_ = 0;
  for (Bucket& b : buckets_) {
    b.ready = 0;
    b.work.reset();
    for (Slot& s : b.slots) s.ready = false;
  }
}

void DataParallel::on_ready(size_t bucket, size_t slot) {
  if (!syncing_) return;
  Bucket& b = buckets_[bucket];
  Slot& s = b.slots[slot];
  if (s.ready) return;  // a second backward through the same leaf in one pass: already counted
  s.ready = true;
  if (++b.ready == static_cast<int64_t>(b.slots.size())) launch_ready();
}

void DataParallel::launch_ready() {
  while (next_ < buckets_.size() && buckets_[next_].ready == static_cast<int64_t>(buckets_[next_].slots.size()))
    launch(buckets_[next_++]);
}

void DataParallel::launch(Bucket& b) {
  autograd::NoGradGuard no_grad;
  std::vector<double> flags(b.slots.size());
  for (size_t i = 0; i < b.slots.size(); ++i) {
    const Slot& s = b.slots[i];
    Tensor slice = b.buffer.narrow(0, s.offset, s.param.numel()).view(s.param.shape());
    const Tensor g = s.param.grad();
    if (g.defined()) {
      slice.copy_(g);
      flags[i] = 1;
    } else {
      slice.fill_(0);
      flags[i] = 0;
    }
  }
  const int64_t n = static_cast<int64_t>(flags.size());
  b.buffer.narrow(0, b.elements, n).copy_(from_vector(flags, {n}, DType::F32));
  b.work = comm_->all_reduce_async(b.buffer, ReduceOp::Avg);
}

void DataParallel::after_backward(bool last) {
  if (!last) return;
  syncing_ = false;
  // Whatever backward did not reach goes now, in bucket order (the same on every rank).
  for (; next_ < buckets_.size(); ++next_) launch(buckets_[next_]);
}

void DataParallel::wait_all() {
  for (Bucket& b : buckets_)
    if (b.work) b.work->wait();
}

void DataParallel::agree_fp8_amax(const std::vector<Tensor>& amaxes) {
  all_reduce_together(*comm_, amaxes, ReduceOp::Max);
}

void DataParallel::finish() {
  wait_all();
  autograd::NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    if (!b.work) continue;  // not sent this step (finish() without a synchronised backward)
    b.work.reset();
    // Read on the host (from a device bucket: one small copy, which waits for the reduction).
    const Tensor flag_values = b.buffer.narrow(0, b.elements, static_cast<int64_t>(b.slots.size())).to(Device::cpu());
    const float* flags = flag_values.data<float>();
    for (size_t i = 0; i < b.slots.size(); ++i) {
      const Slot& s = b.slots[i];
      if (flags[i] == 0) continue;  // no rank had a gradient: the parameter keeps none
      const Tensor mean = b.buffer.narrow(0, s.offset, s.param.numel()).view(s.param.shape());
      Tensor g = s.param.grad();
      if (g.defined() && g.is_contiguous()) {  // written in place: no allocation per step
        g.copy_(mean);
      } else {
        s.param.set_grad(mean.to(s.param.device(), s.param.dtype()).clone());
      }
    }
  }
}

std::vector<int64_t> DataParallel::bucket_sizes() const {
  std::vector<int64_t> sizes;
  for (const Bucket& b : buckets_) sizes.push_back(b.elements);
  return sizes;
}

int64_t DataParallel::bytes_per_step() const {
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += static_cast<int64_t>(b.buffer.nbytes());
  return bytes;
}

}  // namespace ft::dist
