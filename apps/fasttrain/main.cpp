// fasttrain command-line program (placeholder until the demo lands).
#include <iostream>

#include "fasttrain/fasttrain.h"

int main(int argc, char** argv) {
  std::cout << "fasttrain 0.1.0\n";
  return 0;
}
