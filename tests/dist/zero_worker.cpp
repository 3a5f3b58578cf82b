// The program tests/test_zero.cpp starts under mpirun to measure ZeRO's memory and traffic
// (src/dist/zero.h): a two-layer model of odd sizes (5 -> 7 -> 3: 56 weights in the decay group,
// 10 biases in the other, neither a multiple of 2 or 3) trained 3 steps with AdamW and norm
// clipping through StepRunner and dist::ZeroSharding. After the last step each rank writes
// <dir>/rank<R>.txt:
//   psi <parameters> padded <sum of P_g> shard <sum of s_g> params <tensors>
//   state <bytes of the optimizer's moment buffers> grad <bytes of gradients held>
//   issued <bytes_issued during the last step>
//
//   zero_worker <dir> <stage>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "dist/zero.h"
#include "fasttrain/fasttrain.h"

using namespace ft;

class Net : public nn::Module {
 public:
  explicit Net(Generator* gen) {
    a = register_module("a", std::make_shared<nn::Linear>(5, 7, true, gen));
    b = register_module("b", std::make_shared<nn::Linear>(7, 3, true, gen));
  }
  std::string type_name() const override { return "ZeroTestNet"; }
  std::shared_ptr<nn::Linear> a, b;
};

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: zero_worker DIR STAGE\n");
    return 64;
  }
  const std::string dir = argv[1];
  const int stage = std::atoi(argv[2]);
  try {
    const std::shared_ptr<dist::Communicator> comm = dist::world();
    Generator gen(11 + static_cast<uint64_t>(comm->rank()));
    Net net(&gen);
    dist::broadcast_module(net, *comm);
    optim::GroupOptions o;
    o.lr = 1e-2;
    o.weight_decay = 0.1;
    auto full = optim::make_adamw(optim::decay_groups(net.named_parameters(), o));
    dist::ZeroSharding zero(net, *full, comm, stage);
    auto shard_optimizer = zero.make_shard_optimizer();
    train::StepOptions so;
    so.clip = 0.5;
    train::StepRunner runner(net, *shard_optimizer, so);
    runner.set_grad_sync(&zero);
    Generator data(100 + static_cast<uint64_t>(comm->rank()));
    int64_t issued = 0;
    for (int step = 0; step < 3; ++step) {
      const Tensor x = randn({4, 5}, {}, &data);
      const int64_t before = comm->bytes_issued();
      runner.forward_backward([&] { return mean(square(net.b->forward(tanh(net.a->forward(x))))); });
      runner.optimizer_step();
      issued = comm->bytes_issued() - before;
    }
    int64_t state = 0;
    for (const auto& [name, t] : shard_optimizer->state_tensors())
      if (t.dim() > 0) state += static_cast<int64_t>(t.nbytes());  // the moments; not the 0-d step counts
    std::ofstream out(dir + "/rank" + std::to_string(comm->rank()) + ".txt");
    out << "psi " << zero.parameter_count() << " padded " << zero.padded_count() << " shard " << zero.shard_count()
        << " params " << zero.used_flag_count() << " state " << state << " grad " << zero.gradient_bytes(net)
        << " issued " << issued << "\n";
  } catch (const std::exception& e) {
    dist::abort_job(e.what(), 2);
  }
  return 0;
}
