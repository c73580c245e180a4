#include <gtest/gtest.h>

#include "io/json.h"

using latent::json::Error;
using latent::json::parse;

TEST(Json, ParsesNestedDocument) {
  auto v = parse(R"( {"a": [1, -2, 3.5e2, true, false, null], "b": {"c": "d\u00e9\n"}} )");
  const auto& a = v.find("a")->as_array();
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0].as_uint64(), 1u);
  EXPECT_EQ(a[1].as_int64(), -2);
  EXPECT_DOUBLE_EQ(a[2].as_double(), 350.0);
  EXPECT_TRUE(a[3].as_bool());
  EXPECT_TRUE(a[5].is_null());
  EXPECT_EQ(v.find("b")->find("c")->as_string(), "d\xC3\xA9\n");
  EXPECT_EQ(v.find("missing"), nullptr);
}

TEST(Json, IntegersConvertExactlyOrFail) {
  EXPECT_EQ(parse("18446744073709551615").as_uint64(), UINT64_MAX);
  EXPECT_THROW(parse("18446744073709551616").as_uint64(), Error);
  EXPECT_THROW(parse("-1").as_uint64(), Error);
  EXPECT_THROW(parse("1.0").as_uint64(), Error);
  EXPECT_THROW(parse("1e3").as_int64(), Error);
  EXPECT_THROW(parse("1e999").as_double(), Error);
}

TEST(Json, RefusesMalformedInput) {
  for (const char* bad : {"", "{", "{\"a\":}", "[1,]", "{\"a\":1,}", "01", "1.", "-", "tru", "\"abc", "\"\\x\"",
                          "\"\\ud800\"", "\"\\udc00x\"", "{} {}", "{\"a\" 1}", "\"tab\there\"", "nul"}) {
    EXPECT_THROW(parse(bad), Error) << bad;
  }
}

TEST(Json, RefusesDuplicateKeysNamingThem) {
  try {
    parse(R"({"w": 1, "w": 2})");
    FAIL() << "duplicate accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key \"w\""), std::string::npos) << e.what();
  }
}

TEST(Json, BoundsNestingDepth) {
  std::string deep(10000, '[');
  EXPECT_THROW(parse(deep), Error);
  std::string ok = std::string(60, '[') + std::string(60, ']');
  EXPECT_NO_THROW(parse(ok));
}

TEST(Json, RefusesInvalidUtf8) {
  for (std::string bad : {"\"\xC0\xAF\"", "\"\xED\xA0\x80\"", "\"\xF5\x80\x80\x80\"", "\"\xE2\x82\"", "\"\x80\""}) {
    EXPECT_THROW(parse(bad), Error);
  }
  EXPECT_EQ(parse("\"\xF0\x9F\x8E\xA5\"").as_string(), "\xF0\x9F\x8E\xA5");
  EXPECT_EQ(parse(R"("\ud83c\udfa5")").as_string(), "\xF0\x9F\x8E\xA5");
}

// The writer must never produce what the reader refuses: a Latin-1 byte in a caption once made latent files that
// latentfilesrc and the safetensors package could not open.
TEST(Json, DumpRefusesWhatParseRefuses) {
  using latent::json::dump;
  using latent::json::find_invalid_utf8;
  using latent::json::Object;
  using latent::json::Value;
  for (std::string bad :
       {"caf\xE9", "\xC0\xAF", "\xED\xA0\x80", "\xF5\x80\x80\x80", "\xE2\x82", "\x80", "ok\xF0\x9F\x8E"}) {
    EXPECT_THROW(dump(Value(bad)), Error) << bad;
    EXPECT_THROW(dump(Value(Object{{bad, Value(true)}})), Error) << "as a key: " << bad;
    EXPECT_NE(find_invalid_utf8(bad), std::string_view::npos);
  }
  try {
    dump(Value(Object{{"caption", "caf\xE9 au lait"}}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("0xE9 at offset 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(find_invalid_utf8("caf\xE9"), 3u);
  for (std::string good : {"", "plain", "caf\xC3\xA9", "\xF0\x9F\x8E\xA5 film", "\xEF\xBF\xBD"}) {
    EXPECT_EQ(find_invalid_utf8(good), std::string_view::npos) << good;
    EXPECT_EQ(parse(dump(Value(good))).as_string(), good);
  }
}

TEST(Json, DumpRoundTrips) {
  std::string text = R"({"k":["a\"b\\c\u0001",1,-2.5,true,null,{}],"z":{"y":[]}})";
  auto v = parse(text);
  auto again = parse(latent::json::dump(v));
  EXPECT_EQ(latent::json::dump(again), latent::json::dump(v));
  EXPECT_EQ(again.find("k")->as_array()[0].as_string(), "a\"b\\c\x01");
  EXPECT_EQ(latent::json::Value::real(0.25).as_double(), 0.25);
  EXPECT_THROW(latent::json::Value::real(1.0 / 0.0), Error);
}
