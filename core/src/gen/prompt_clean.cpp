#include "gen/prompt_clean.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "latent/io/weights.h"

namespace latent {
namespace {

struct HtmlEntity {
  const char* name;
  const char* value;
};
struct InvalidCharref {
  uint32_t num;
  const char* value;
};
#include "gen/html_entities.inc"

std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  auto bad = [] { throw ModelError("prompt is not valid UTF-8"); };
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    int extra = 0;
    if (c < 0x80) {
      cp = c;
      extra = 0;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F;
      extra = 1;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F;
      extra = 2;
    } else if ((c & 0xF8) == 0xF0) {
      cp = c & 0x07;
      extra = 3;
    } else {
      bad();
    }
    if (i + extra >= s.size()) bad();
    for (int k = 1; k <= extra; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) bad();
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8 (Python refuses them too).
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) bad();
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_python_space(uint32_t cp) { return std::binary_search(std::begin(kPythonSpaces), std::end(kPythonSpaces), cp); }

const char* find_entity(const std::string& name) {
  auto it =
      std::lower_bound(std::begin(kHtmlEntities), std::end(kHtmlEntities), name,
                       [](const HtmlEntity& e, const std::string& n) { return std::strcmp(e.name, n.c_str()) < 0; });
  if (it != std::end(kHtmlEntities) && name == it->name) return it->value;
  return nullptr;
}

bool is_ascii_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_ascii_hex(char32_t c) { return is_ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Python's _replace_charref for a numeric reference: `digits` without '#', 'x' or ';'.
std::string numeric_charref(std::u32string_view digits, int base) {
  // Python's ints do not overflow; anything past U+10FFFF gives U+FFFD whatever its size.
  uint64_t num = 0;
  for (char32_t c : digits) {
    uint32_t d = is_ascii_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
    num = num * base + d;
    if (num > 0x10FFFF) num = 0x110000;
  }
  for (const auto& r : kInvalidCharrefs)
    if (r.num == num) return r.value;
  std::string out;
  if ((num >= 0xD800 && num <= 0xDFFF) || num > 0x10FFFF) {
    append_utf8(out, 0xFFFD);
    return out;
  }
  if (std::binary_search(std::begin(kInvalidCodepoints), std::end(kInvalidCodepoints), static_cast<uint32_t>(num)))
    return out;
  append_utf8(out, static_cast<uint32_t>(num));
  return out;
}

bool named_char(char32_t c) {
  return c != '\t' && c != '\n' && c != '\f' && c != ' ' && c != '<' && c != '&' && c != '#' && c != ';';
}

}  // namespace

// Python's html.unescape: re.sub(r'&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)', _replace_charref, s).
std::string python_html_unescape(const std::string& text) {
  if (text.find('&') == std::string::npos) return text;
  std::u32string s = decode_utf8(text);
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    if (s[i] != '&') {
      append_utf8(out, s[i++]);
      continue;
    }
    size_t j = i + 1;
    if (j < n && s[j] == '#') {
      size_t k = j + 1;
      int base = 10;
      if (k < n && (s[k] == 'x' || s[k] == 'X') && k + 1 < n && is_ascii_hex(s[k + 1])) {
        base = 16;
        ++k;
      }
      size_t start = k;
      while (k < n && (base == 16 ? is_ascii_hex(s[k]) : is_ascii_digit(s[k]))) ++k;
      if (k == start) {  // neither numeric form; '#' cannot start a name
        append_utf8(out, s[i++]);
        continue;
      }
      out += numeric_charref(std::u32string_view(s).substr(start, k - start), base);
      if (k < n && s[k] == ';') ++k;
      i = k;
      continue;
    }
    size_t k = j;
    while (k < n && k - j < 32 && named_char(s[k])) ++k;
    if (k == j) {
      append_utf8(out, s[i++]);
      continue;
    }
    if (k < n && s[k] == ';') ++k;
    std::string name = encode_utf8(std::u32string_view(s).substr(j, k - j));
    if (const char* v = find_entity(name)) {
      out += v;
    } else {
      // The longest known prefix of at least two characters, as the HTML5 standard reads legacy references.
      bool found = false;
      std::u32string_view sv = std::u32string_view(s).substr(j, k - j);
      for (size_t x = sv.size() - 1; x > 1; --x) {
        if (const char* p = find_entity(encode_utf8(sv.substr(0, x)))) {
          out += p;
          out += encode_utf8(sv.substr(x));
          found = true;
          break;
        }
      }
      if (!found) {
        out += '&';
        out += name;
      }
    }
    i = k;
  }
  return out;
}

std::string wan_prompt_clean(const std::string& text) {
  std::u32string s = decode_utf8(python_html_unescape(python_html_unescape(text)));
  // strip(), then re.sub(r"\s+", " ", ...) and strip() again: the same as collapsing inner runs and trimming.
  std::u32string out;
  out.reserve(s.size());
  bool pending_space = false;
  for (char32_t c : s) {
    if (is_python_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out.push_back(U' ');
    pending_space = false;
    out.push_back(c);
  }
  return encode_utf8(out);
}

}  // namespace latent
