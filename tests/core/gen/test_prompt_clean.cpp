// Wan's prompt cleaning against diffusers' WanPipeline prompt_clean run with ftfy installed, as the Wan pipelines
// are: ftfy.fix_text, html.unescape twice, whitespace (tests/fixtures/gen_prompt_clean_fixtures.py).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gen/prompt_clean.h"
#include "io/json.h"
#include "latent/io/weights.h"

namespace fs = std::filesystem;
using namespace latent;

namespace {

// The fixture's document, or the reason there is none.
struct Fixture {
  json::Value doc;
  std::string missing;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    const char* d = std::getenv("LATENT_PROMPT_CLEAN_FIXTURES");
    if (!d || !fs::exists(fs::path(d) / "stamp")) {
      out.missing = "no prompt cleaning fixtures (LATENT_PROMPT_CLEAN_FIXTURES unset: build without the .venv)";
      return out;
    }
    std::ifstream in(fs::path(d) / "cases.json", std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    out.doc = json::parse(ss.str());
    if (!out.doc.find("ftfy")->is_string()) out.missing = out.doc.find("reason")->as_string();
    return out;
  }();
  return f;
}

#define REQUIRE_FIXTURE()                                              \
  do {                                                                 \
    if (!fixture().missing.empty()) GTEST_SKIP() << fixture().missing; \
  } while (0)

const json::Array& cases() { return fixture().doc.find("cases")->as_array(); }

}  // namespace

TEST(PromptClean, FixTextMatchesFtfy) {
  REQUIRE_FIXTURE();
  for (const auto& c : cases()) {
    const std::string& text = c.find("text")->as_string();
    EXPECT_EQ(ftfy_fix_text(text), c.find("fix_text")->as_string()) << "input: " << text;
  }
}

TEST(PromptClean, MatchesDiffusersPromptClean) {
  REQUIRE_FIXTURE();
  for (const auto& c : cases()) {
    const std::string& text = c.find("text")->as_string();
    EXPECT_EQ(wan_prompt_clean(text), c.find("clean")->as_string()) << "input: " << text;
  }
  EXPECT_THROW(wan_prompt_clean("bad \xff utf-8"), ModelError);
}
