// A gst-check main whose suites skip visibly: a suite that leaves tests out for a missing fixture or reference
// (skip_missing) ends as a skip (exit 77, meson's SKIP) that says why once the rest have passed, never as a pass
// with less run than it shows.
#pragma once

#include <gst/check/gstcheck.h>

#include <string>
#include <vector>

namespace latent_test {

inline std::vector<std::string>& missing_reasons() {
  static std::vector<std::string> reasons;
  return reasons;
}

// Called where the suite is built, never inside a test (check runs tests in child processes).
inline void skip_missing(const std::string& why) {
  g_print("SKIP: %s\n", why.c_str());
  missing_reasons().push_back(why);
}

}  // namespace latent_test

#define LATENT_CHECK_MAIN(name)                                                                          \
  int main(int argc, char** argv) {                                                                      \
    gst_check_init(&argc, &argv);                                                                        \
    const int failed = gst_check_run_suite(name##_suite(), #name, __FILE__);                             \
    if (failed != 0 || latent_test::missing_reasons().empty()) return failed;                            \
    for (const std::string& why : latent_test::missing_reasons()) g_print("skipped: %s\n", why.c_str()); \
    return 77;                                                                                           \
  }
