// The object that builds support/pch.h once for every test (tests/CMakeLists.txt).
