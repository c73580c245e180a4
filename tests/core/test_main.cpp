// The core tests' main. A test skipped for a missing fixture, reference or tool makes the whole run a skip (exit 77,
// which meson reports as SKIP) once nothing has failed, so a build without the .venv never passes with half its
// tests silently not run. Skips that are no defect of the machine say so by their reason's first words:
//   "no GPU"       the CUDA variants, run where a GPU is
//   "[elsewhere]"  a test run by another test program of the suite (a child process, another environment)
//   "[opt-in]"     published weights a user points the test at
//   "[hardware]"   a CPU feature the test guards against
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

bool expected_skip(const std::string& reason) {
  for (const char* prefix : {"no GPU", "[elsewhere]", "[opt-in]", "[hardware]"})
    if (reason.rfind(prefix, 0) == 0) return true;
  return false;
}

// "Suite.Name: reason" of every test skipped for something missing.
std::vector<std::string> missing_skips(const testing::UnitTest& unit) {
  std::vector<std::string> out;
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& info = *suite.GetTestInfo(t);
      const testing::TestResult& result = *info.result();
      if (!info.should_run() || !result.Skipped()) continue;
      std::string reason;
      for (int p = 0; p < result.total_part_count(); ++p)
        if (result.GetTestPartResult(p).skipped()) reason = result.GetTestPartResult(p).message();
      if (!expected_skip(reason)) out.push_back(std::string(suite.name()) + "." + info.name() + ": " + reason);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (rc != 0) return rc;
  const std::vector<std::string> missing = missing_skips(*testing::UnitTest::GetInstance());
  if (missing.empty()) return 0;
  std::printf("\n%zu test(s) skipped for something missing; the run counts as skipped (exit 77):\n", missing.size());
  for (const std::string& m : missing) std::printf("  %s\n", m.c_str());
  return 77;
}
