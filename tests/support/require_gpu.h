// REQUIRE_GPU(): skips a CUDA test, with a visible message, on a machine without a usable GPU.
#pragma once
#include <gtest/gtest.h>

#include "fasttrain/device.h"

#define REQUIRE_GPU() \
  if (!::ft::cuda_available()) GTEST_SKIP() << "no CUDA device (driver or GPU missing): CUDA test skipped"
