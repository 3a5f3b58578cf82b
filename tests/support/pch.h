// The headers most test sources include, parsed once per build into a precompiled header
// (tests/CMakeLists.txt) instead of once per test source: GoogleTest, nlohmann/json and the
// umbrella header cost several seconds of each test's compilation, three times over in CI (the
// release, ASan and TSan builds). A test still includes what it uses; this only makes it cheap.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"
