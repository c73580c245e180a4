#include "io/json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_set>

namespace latent::json {
namespace {

// The length of the well-formed UTF-8 sequence at s[pos] (a byte >= 0x80), 0 when it is not one: overlong forms,
// surrogates and code points past U+10FFFF are refused, as RFC 3629 requires.
size_t utf8_sequence_length(std::string_view s, size_t pos) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  size_t len;
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF)
    len = 2, cp = b0 & 0x1F;
  else if (b0 >= 0xE0 && b0 <= 0xEF)
    len = 3, cp = b0 & 0x0F;
  else if (b0 >= 0xF0 && b0 <= 0xF4)
    len = 4, cp = b0 & 0x07;
  else
    return 0;
  if (s.size() - pos < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(s[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  return len;
}

// A lead byte whose continuation bytes, all valid so far, run past the end of the text.
bool truncated_utf8(std::string_view tail) {
  const auto b0 = static_cast<unsigned char>(tail[0]);
  const size_t len = b0 >= 0xC2 && b0 <= 0xDF ? 2 : b0 >= 0xE0 && b0 <= 0xEF ? 3 : b0 >= 0xF0 && b0 <= 0xF4 ? 4 : 0;
  if (len == 0 || tail.size() >= len) return false;
  for (size_t i = 1; i < tail.size(); ++i)
    if ((static_cast<unsigned char>(tail[i]) & 0xC0) != 0x80) return false;
  return true;
}

class Parser {
 public:
  Parser(std::string_view text, const ParseLimits& limits) : s_(text), limits_(limits) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("JSON: " + what + " at byte " + std::to_string(pos_));
  }

  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }

  void expect(char c) {
    if (peek() != c || at_end()) fail(std::string("expected '") + c + "'");
    ++pos_;
  }

  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  Value value(size_t depth) {
    if (depth >= limits_.max_depth) fail("nesting deeper than " + std::to_string(limits_.max_depth));
    if (at_end()) fail("unexpected end of input");
    switch (s_[pos_]) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return Value(string());
      case 't': literal("true"); return Value(true);
      case 'f': literal("false"); return Value(false);
      case 'n': literal("null"); return Value(nullptr);
      default: return Value(number());
    }
  }

  Value object(size_t depth) {
    expect('{');
    Object members;
    std::unordered_set<std::string> seen;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Value(std::move(members));
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      size_t key_pos = pos_;
      std::string key = string();
      if (!seen.insert(key).second) {
        pos_ = key_pos;
        fail("duplicate key \"" + key + "\"");
      }
      skip_ws();
      expect(':');
      skip_ws();
      Value v = value(depth + 1);
      members.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',' && !at_end()) {
        ++pos_;
        continue;
      }
      expect('}');
      return Value(std::move(members));
    }
  }

  Value array(size_t depth) {
    expect('[');
    Array items;
    skip_ws();
    if (peek() == ']' && !at_end()) {
      ++pos_;
      return Value(std::move(items));
    }
    for (;;) {
      skip_ws();
      items.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',' && !at_end()) {
        ++pos_;
        continue;
      }
      expect(']');
      return Value(std::move(items));
    }
  }

  unsigned hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= unsigned(c - 'A' + 10);
      else
        fail("invalid hex digit in \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // Copies one UTF-8 sequence, refusing overlong forms, surrogates and code points past U+10FFFF.
  void utf8_sequence(std::string& out) {
    const size_t len = utf8_sequence_length(s_, pos_);
    if (len == 0) fail(truncated_utf8(s_.substr(pos_)) ? "truncated UTF-8 sequence" : "invalid UTF-8");
    out.append(s_.substr(pos_, len));
    pos_ += len;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c >= 0x80) {
        utf8_sequence(out);
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += char(c);
        continue;
      }
      if (at_end()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate");
            pos_ += 2;
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail("invalid escape");
      }
    }
  }

  Number number() {
    size_t start = pos_;
    auto digit = [&] { return !at_end() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (peek() == '-') ++pos_;
    if (!digit()) fail("invalid value");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (digit()) ++pos_;
    }
    if (peek() == '.' && !at_end()) {
      ++pos_;
      if (!digit()) fail("invalid number");
      while (digit()) ++pos_;
    }
    if (!at_end() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (!at_end() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digit()) fail("invalid number");
      while (digit()) ++pos_;
    }
    return Number{std::string(s_.substr(start, pos_ - start))};
  }

  std::string_view s_;
  ParseLimits limits_;
  size_t pos_ = 0;
};

std::string invalid_utf8_detail(std::string_view s, size_t at) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "(byte 0x%02X at offset %zu)", static_cast<unsigned char>(s[at]), at);
  return buf;
}

// The reader refuses invalid UTF-8, so the writer does too: what dump() returns always parses back. Bytes that
// are not UTF-8 (a Latin-1 caption, a file name in a legacy encoding) are refused with their position rather than
// replaced, so no text changes silently.
void dump_string(std::string& out, const std::string& s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t len = utf8_sequence_length(s, i);
      if (len == 0) throw Error("JSON: cannot write a string that is not valid UTF-8 " + invalid_utf8_detail(s, i));
      out.append(s, i, len);
      i += len;
      continue;
    }
    ++i;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

void dump_value(std::string& out, const Value& v) {
  if (v.is_null()) {
    out += "null";
  } else if (v.is_bool()) {
    out += v.as_bool() ? "true" : "false";
  } else if (v.is_string()) {
    dump_string(out, v.as_string());
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& item : v.as_array()) {
      if (!first) out += ',';
      first = false;
      dump_value(out, item);
    }
    out += ']';
  } else if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, item] : v.as_object()) {
      if (!first) out += ',';
      first = false;
      dump_string(out, k);
      out += ':';
      dump_value(out, item);
    }
    out += '}';
  } else {
    out += v.number_text();
  }
}

}  // namespace

Value Value::real(double d) {
  if (!std::isfinite(d)) throw Error("JSON cannot hold a non-finite number");
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string text(buf, end);
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return Value(Number{text});
}

const char* Value::kind_name() const {
  static constexpr const char* names[] = {"null", "boolean", "number", "string", "array", "object"};
  return names[v_.index()];
}

namespace {
[[noreturn]] void wrong_kind(const char* want, const Value& v) {
  throw Error(std::string("JSON: expected ") + want + ", found " + v.kind_name());
}
}  // namespace

bool Value::as_bool() const {
  if (!is_bool()) wrong_kind("a boolean", *this);
  return std::get<bool>(v_);
}
const std::string& Value::as_string() const {
  if (!is_string()) wrong_kind("a string", *this);
  return std::get<std::string>(v_);
}
const Array& Value::as_array() const {
  if (!is_array()) wrong_kind("an array", *this);
  return std::get<Array>(v_);
}
const Object& Value::as_object() const {
  if (!is_object()) wrong_kind("an object", *this);
  return std::get<Object>(v_);
}
Object& Value::as_object() {
  if (!is_object()) wrong_kind("an object", *this);
  return std::get<Object>(v_);
}

uint64_t Value::as_uint64() const {
  if (!is_number()) wrong_kind("an integer", *this);
  const std::string& t = std::get<Number>(v_).text;
  uint64_t out = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  if (ec != std::errc() || end != t.data() + t.size()) throw Error("JSON: " + t + " is not an unsigned 64-bit integer");
  return out;
}

int64_t Value::as_int64() const {
  if (!is_number()) wrong_kind("an integer", *this);
  const std::string& t = std::get<Number>(v_).text;
  int64_t out = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  if (ec != std::errc() || end != t.data() + t.size()) throw Error("JSON: " + t + " is not a 64-bit integer");
  return out;
}

double Value::as_double() const {
  if (!is_number()) wrong_kind("a number", *this);
  const std::string& t = std::get<Number>(v_).text;
  double out = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
  if (ec == std::errc::result_out_of_range) throw Error("JSON: " + t + " is out of the range of a double");
  if (ec != std::errc() || end != t.data() + t.size()) throw Error("JSON: " + t + " is not a number");
  return out;
}

const std::string& Value::number_text() const {
  if (!is_number()) wrong_kind("a number", *this);
  return std::get<Number>(v_).text;
}

const Value* Value::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : std::get<Object>(v_))
    if (k == key) return &v;
  return nullptr;
}

size_t find_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_sequence_length(text, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

Value parse(std::string_view text, const ParseLimits& limits) { return Parser(text, limits).document(); }

std::string dump(const Value& value) {
  std::string out;
  dump_value(out, value);
  return out;
}

}  // namespace latent::json
