// expect_error(fn, fragment): fn must throw ft::Error whose message contains `fragment`.
#pragma once
#include <string>

#include <gtest/gtest.h>

#include "fasttrain/error.h"

namespace ft::test {

template <class F>
void expect_error(F&& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << "message: " << e.what();
  }
}

}  // namespace ft::test
