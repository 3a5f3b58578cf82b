// expect_error(fn, fragment): fn must throw ft::Error whose message contains `fragment`.
// error_of(fn): the message of the ft::Error fn throws, or "(no error)", for exact comparisons.
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

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace ft::test
