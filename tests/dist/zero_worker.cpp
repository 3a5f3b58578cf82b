// The program tests/test_zero.cpp starts under mpirun to measure ZeRO's memory and traffic
// (fasttrain/zero.h): a two-layer model of odd sizes (5 -> 7 -> 3: 56 weights in the decay group,
// 10 biases in the other, neither a multiple of 2 or 3; the first layer a block, stage 3's unit,
// the second the root) trained 4 steps with AdamW and norm clipping through StepRunner and
// dist::ZeroSharding. After the last step each rank writes <dir>/rank<R>.txt:
//   psi <parameters> padded <sum of P_g> shard <sum of s_g> params <tensors>
//   state <bytes of the optimizer's moment buffers> grad <bytes of gradients held>
//   param <bytes of parameter memory held> issued <bytes_issued during the last step>
//
//   zero_worker <dir> <stage> [inf]
//     inf: fp16-mixed with GradScaler, and in step 2 rank 0 adds w * inf for one element w of
//     b.weight that rank 2 owns (3 ranks; rank 0 under stage 3), so only that rank's shard sees
//     the overflow; stage 0
//     is DDP. Rank 0 writes <dir>/weights.txt (every parameter value, then the loss scale).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>

#include "fasttrain/fasttrain.h"
#include "fasttrain/zero.h"
#include "support/linear_block.h"

using namespace ft;

class Net : public nn::Module {
 public:
  explicit Net(Generator* gen) {
    a = register_module("a", std::make_shared<test::LinearBlock>(5, 7, gen));
    b = register_module("b", std::make_shared<nn::Linear>(7, 3, true, gen));
  }
  std::string type_name() const override { return "ZeroTestNet"; }
  std::shared_ptr<test::LinearBlock> a;
  std::shared_ptr<nn::Linear> b;
};

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: zero_worker DIR STAGE [inf]\n");
    return 64;
  }
  const std::string dir = argv[1];
  const int stage = std::atoi(argv[2]);
  const bool inf = argc == 4 && std::string(argv[3]) == "inf";
  try {
    const std::shared_ptr<dist::Communicator> comm = dist::world();
    Generator gen(11 + static_cast<uint64_t>(comm->rank()));
    Net net(&gen);
    dist::broadcast_module(net, *comm);
    optim::GroupOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    auto full = optim::make_adamw(optim::decay_groups(net.named_parameters(), o));
    std::unique_ptr<dist::ZeroSharding> zero;
    std::unique_ptr<dist::DataParallel> ddp;
    std::unique_ptr<optim::Optimizer> shard_optimizer;
    if (stage == 0) {
      ddp = std::make_unique<dist::DataParallel>(net, comm);
    } else {
      zero = std::make_unique<dist::ZeroSharding>(net, *full, comm, stage);
      shard_optimizer = zero->make_shard_optimizer();
    }
    train::StepOptions so;
    so.clip = 0.5;
    if (inf) so.precision = train::Precision::FP16Mixed;
    train::StepRunner runner(net, zero ? *shard_optimizer : *full, so);
    runner.set_grad_sync(zero ? static_cast<train::GradSync*>(zero.get()) : ddp.get());
    Generator data(100 + static_cast<uint64_t>(comm->rank()));
    int64_t issued = 0;
    for (int step = 0; step < 4; ++step) {
      const Tensor x = randn({4, 5}, {}, &data);
      const int64_t before = comm->bytes_issued();
      const double c = inf && step == 1 && comm->rank() == 0 ? std::numeric_limits<double>::infinity() : 0.0;
      runner.forward_backward([&] {
        Tensor loss = mean(square(net.b->forward(tanh(net.a->forward(x)))));
        // b.weight's element 5 is element 40 of the decay group: rank 2's at 3 ranks (38..56);
        // under stage 3 element 5 of the root's decay group (21 elements): rank 0's (0..7).
        if (c != 0) loss = add(loss, mul(sum(net.b->weight.reshape({-1}).narrow(0, 5, 1)), c));
        return loss;
      });
      runner.optimizer_step();
      issued = comm->bytes_issued() - before;
    }
    if (inf) {
      if (zero) zero->gather_all();  // stage 3: the whole model on every rank (a collective)
      if (comm->rank() == 0) {
        std::ofstream w(dir + "/weights.txt");
        w.precision(9);
        for (const Tensor& p : net.parameters())
          for (double v : p.to_vector()) w << v << "\n";
        w << "scale " << runner.scaler().get_scale() << "\n";
      }
      return 0;
    }
    int64_t state = 0;
    for (const auto& [name, t] : shard_optimizer->state_tensors())
      if (t.dim() > 0) state += static_cast<int64_t>(t.nbytes());  // the moments; not the 0-d step counts
    std::ofstream out(dir + "/rank" + std::to_string(comm->rank()) + ".txt");
    out << "psi " << zero->parameter_count() << " padded " << zero->padded_count() << " shard " << zero->shard_count()
        << " params " << zero->used_flag_count() << " state " << state << " grad " << zero->gradient_bytes(net)
        << " param " << zero->parameter_bytes(net) << " issued " << issued << "\n";
  } catch (const std::exception& e) {
    dist::abort_job(e.what(), 2);
  }
  return 0;
}
