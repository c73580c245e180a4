// A small strict JSON reader and writer. Core reads safetensors headers and model configs, which may come from
// hostile files, so the parser bounds its nesting depth, validates UTF-8, refuses duplicate object keys and
// keeps numbers as text so integers of any width convert exactly (or fail loudly) on request.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace latent::json {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Value;
using Array = std::vector<Value>;
// Members keep their order of appearance so errors and rewrites follow the file.
using Object = std::vector<std::pair<std::string, Value>>;

struct Number {
  std::string text;  // the literal as written, validated against the JSON grammar
};

class Value {
 public:
  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : v_(b) {}
  Value(Number n) : v_(std::move(n)) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::move(a)) {}
  Value(Object o) : v_(std::move(o)) {}
  static Value integer(int64_t i) { return Value(Number{std::to_string(i)}); }
  static Value unsigned_integer(uint64_t i) { return Value(Number{std::to_string(i)}); }
  static Value real(double d);

  bool is_null() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_number() const { return std::holds_alternative<Number>(v_); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<Array>(v_); }
  bool is_object() const { return std::holds_alternative<Object>(v_); }

  // Accessors throw json::Error naming the expected and the actual kind.
  bool as_bool() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  Object& as_object();
  // Exact conversions: fractions, exponents, signs or magnitudes that do not fit are errors.
  uint64_t as_uint64() const;
  int64_t as_int64() const;
  double as_double() const;
  // The literal as it appeared (or was formatted), for lossless rewriting.
  const std::string& number_text() const;

  // Object lookup; nullptr when absent or when this is not an object.
  const Value* find(std::string_view key) const;

  const char* kind_name() const;

 private:
  std::variant<std::nullptr_t, bool, Number, std::string, Array, Object> v_;
};

struct ParseLimits {
  size_t max_depth = 64;
};

// Parses a whole document: leading/trailing whitespace allowed, anything else after the value is an error.
Value parse(std::string_view text, const ParseLimits& limits = {});

// Compact serialisation with keys in their stored order. Strings (keys included) must be valid UTF-8, as parse()
// requires: anything else throws Error naming the offending byte, so dump() never writes what parse() refuses.
std::string dump(const Value& value);

// The offset of the first byte of `text` that is not part of well-formed UTF-8 (RFC 3629: no overlong forms,
// surrogates or code points past U+10FFFF), or std::string_view::npos when all of it is.
size_t find_invalid_utf8(std::string_view text);

}  // namespace latent::json
