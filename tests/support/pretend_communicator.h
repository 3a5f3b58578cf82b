// A communicator of two pretend ranks for in-process tests of code that wraps or drives one
// (the host-staging wrapper, test_ddp.cpp and tests/cuda/test_cuda_dist.cpp): this process is
// rank 0 of 2 on one machine, and every collective is the test's to define; the rest answers as a
// communicator with nothing to configure would.
#pragma once
#include <memory>
#include <string>

#include "fasttrain/dist.h"

namespace ft::test {

class PretendTwoRanks : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 2; }
  std::string name() const override { return "world"; }
  int world_rank(int r) const override { return r; }
  std::shared_ptr<Communicator> split(int, int, const std::string&) override { return nullptr; }
  int64_t bytes_issued() const override { return 0; }
  void set_timeout(double) override {}
  void set_debug(bool) override {}
};

}  // namespace ft::test
