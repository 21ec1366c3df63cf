// Minimal test support for the ctest executables: CHECK records a failure and keeps going;
// main() returns test_exit_code(), nonzero if any CHECK failed.
#pragma once

#include <cstdio>

namespace trillium::test {
inline int& failures() {
  static int n = 0;
  return n;
}
inline int test_exit_code() {
  if (failures() == 0) std::printf("OK\n");
  return failures() == 0 ? 0 : 1;
}
}  // namespace trillium::test

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++::trillium::test::failures();                                        \
    }                                                                        \
  } while (0)

// For [[nodiscard]] statuses that a test expects to be ok.
#define CHECK_OK(expr)                                                                           \
  do {                                                                                           \
    const auto _st = (expr);                                                                     \
    if (!_st.ok()) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, _st.message().c_str()); \
      ++::trillium::test::failures();                                                            \
    }                                                                                            \
  } while (0)
