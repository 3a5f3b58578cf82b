// The host-staging communicator (host_staging.h).
#include "dist/host_staging.h"

#include <mutex>
#include <utility>
#include <vector>

#include "core/switches.h"
#include "fasttrain/error.h"

namespace ft::dist {

namespace {

// (device tensor, host tensor holding its result): copied back by wait().
using CopyBack = std::vector<std::pair<Tensor, Tensor>>;

class StagedWork : public Work {
 public:
  StagedWork(WorkPtr inner, CopyBack copy_back) : inner_(std::move(inner)), copy_back_(std::move(copy_back)) {}
  void wait() override {
    std::lock_guard<std::mutex> lock(m_);
    inner_->wait();  // rethrows the collective's error, every time it is asked
    // Once: a second wait() must not copy a host tensor over a result the caller changed since.
    for (auto& [device_tensor, host] : copy_back_) device_tensor.detach().copy_(host);
    copy_back_.clear();
  }
  bool done() const override { return inner_->done(); }

 private:
  WorkPtr inner_;
  std::mutex m_;
  CopyBack copy_back_;
};

class HostStagingCommunicator : public Communicator {
 public:
  explicit HostStagingCommunicator(std::shared_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  int local_rank() const override { return inner_->local_rank(); }
  int local_size() const override { return inner_->local_size(); }
  std::string backend() const override { return inner_->backend(); }
  std::string name() const override { return inner_->name(); }
  int world_rank(int r) const override { return inner_->world_rank(r); }
  Device buffer_device(Device device) const override { return inner_->buffer_device(device); }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return with_host_staging(inner_->split(color, key, name));
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    if (!staged(t, "broadcast")) return inner_->broadcast_async(t, root);
    // Only the root's values travel; the others' host tensor is only written.
    const Tensor host = rank() == root ? to_host(t) : host_like(t);
    return finish(inner_->broadcast_async(host, root), {{t, host}});
  }
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    if (!staged(t, "all_reduce")) return inner_->all_reduce_async(t, op);
    const Tensor host = to_host(t);
    return finish(inner_->all_reduce_async(host, op), {{t, host}});
  }
  WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) override {
    if (!staged(input, output, "reduce_scatter")) return inner_->reduce_scatter_async(input, output, op);
    const Tensor in = to_host(input), out = host_like(output);
    return finish(inner_->reduce_scatter_async(in, out, op), {{output, out}});
  }
  WorkPtr all_gather_async(const Tensor& input, const Tensor& output) override {
    if (!staged(input, output, "all_gather")) return inner_->all_gather_async(input, output);
    const Tensor in = to_host(input), out = host_like(output);
    return finish(inner_->all_gather_async(in, out), {{output, out}});
  }
  WorkPtr barrier_async() override { return inner_->barrier_async(); }
  WorkPtr send_async(const Tensor& t, int peer) override {
    if (!staged(t, "send")) return inner_->send_async(t, peer);
    return inner_->send_async(to_host(t), peer);  // the host copy lives as long as the send needs it
  }
  WorkPtr recv_async(const Tensor& t, int peer) override {
    if (!staged(t, "recv")) return inner_->recv_async(t, peer);
    const Tensor host = host_like(t);
    return finish(inner_->recv_async(host, peer), {{t, host}});
  }
  WorkPtr send_recv_async(const Tensor& send, int send_peer, const Tensor& recv, int recv_peer) override {
    if (!staged(send, recv, "send_recv")) return inner_->send_recv_async(send, send_peer, recv, recv_peer);
    const Tensor out = to_host(send), in = host_like(recv);
    return finish(inner_->send_recv_async(out, send_peer, in, recv_peer), {{recv, in}});
  }

  int64_t bytes_issued() const override { return inner_->bytes_issued(); }
  void set_timeout(double seconds) override { inner_->set_timeout(seconds); }
  void set_debug(bool on) override { inner_->set_debug(on); }

 private:
  // Whether `t` goes through a host copy: it lives on a device, or the switch stages everything.
  // Contiguity is checked here for device tensors (the inner communicator checks host ones).
  static bool staged(const Tensor& t, const char* who) {
    FT_CHECK(t.defined(), who, ": expected a tensor, found an undefined one");
    const bool on_device = !t.device().is_cpu();
    if (on_device)
      FT_CHECK(t.is_contiguous(), who, ": expected a contiguous tensor, found a strided view of shape ",
               t.shape().str(), " on ", t.device().str());
    return on_device || switches::dist_staging.get() == switches::DistStaging::Always;
  }
  // Both tensors of a two-tensor operation are staged, or neither: a host copy of one and the
  // other in place would not be a collective the inner communicator can check.
  static bool staged(const Tensor& a, const Tensor& b, const char* who) {
    const bool sa = staged(a, who), sb = staged(b, who);
    FT_CHECK(a.device() == b.device(), who, ": expected both tensors on one device, found ", a.device().str(), " and ",
             b.device().str());
    return sa || sb;
  }
  // The copy waits for the device (a blocking transfer), so it holds what the caller queued.
  static Tensor to_host(const Tensor& t) {
    return t.device().is_cpu() ? t.detach().clone() : t.detach().to(Device::cpu());
  }
  static Tensor host_like(const Tensor& t) { return empty(t.shape(), TensorOptions(t.dtype(), Device::cpu())); }
  static WorkPtr finish(WorkPtr inner, CopyBack copy_back) {
    return std::make_shared<StagedWork>(std::move(inner), std::move(copy_back));
  }

  std::shared_ptr<Communicator> inner_;
};

}  // namespace

std::shared_ptr<Communicator> with_host_staging(std::shared_ptr<Communicator> inner) {
  FT_CHECK(inner != nullptr, "with_host_staging: expected a communicator, found none");
  return std::make_shared<HostStagingCommunicator>(std::move(inner));
}

}  // namespace ft::dist
