#include "gen/text/prompt_clean.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
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
#include "gen/text/html_entities.inc"

struct CombiningClass {
  char32_t cp;
  uint8_t ccc;
};
struct Decomposition {
  char32_t cp;
  uint16_t offset;
  uint8_t length;
};
struct Composition {
  char32_t first;
  char32_t second;
  char32_t composite;
};
struct CodeMap {
  char32_t cp;
  const char* value;
};
struct CodeRange {
  char32_t first;
  char32_t last;
};
struct BadElement {
  uint16_t first_range;
  uint16_t ranges;
  uint8_t flags;
};
struct BadAlternative {
  uint8_t first_element;
  uint8_t elements;
};
struct Charmap {
  const char* name;
  char32_t sub;        // what byte 0x1A decodes to (U+FFFD in ftfy's sloppy codecs)
  char32_t high[128];  // bytes 0x80..0xFF; 0 where the encoding leaves the byte undefined
};
#include "gen/text/ftfy_tables.inc"

// The code point at s[i], i moved past it; throws ModelError where s is not UTF-8 there.
uint32_t next_utf8(std::string_view s, size_t& i) {
  auto bad = [] { throw ModelError("prompt is not valid UTF-8"); };
  auto c = static_cast<unsigned char>(s[i]);
  uint32_t cp = 0;
  int extra = 0;
  if (c < 0x80) {
    ++i;
    return c;
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
  i += extra + 1;
  return cp;
}

std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(next_utf8(s, i));
  return out;
}

// decode_utf8's checks without its copy: a long text is checked whole though only its start is read.
void decode_utf8_check(const std::string& s) {
  for (size_t i = 0; i < s.size();) next_utf8(s, i);
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

namespace {

template <class T, size_t N>
bool in_ranges(const T (&table)[N], char32_t c) {
  auto it = std::upper_bound(std::begin(table), std::end(table), c,
                             [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != std::begin(table) && c <= std::prev(it)->last;
}

template <size_t N>
const char* mapped(const CodeMap (&table)[N], char32_t c) {
  auto it =
      std::lower_bound(std::begin(table), std::end(table), c, [](const CodeMap& m, char32_t v) { return m.cp < v; });
  return it != std::end(table) && it->cp == c ? it->value : nullptr;
}

// str.translate with a table of code points to strings.
template <size_t N>
std::u32string translate(const std::u32string& s, const CodeMap (&table)[N]) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (const char* v = mapped(table, c))
      out += decode_utf8(v);
    else
      out.push_back(c);
  }
  return out;
}

// ---- NFC (unicodedata.normalize("NFC")) ---------------------------------------------------------------------

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;  // the first combining mark
  auto it = std::lower_bound(std::begin(kCombiningClasses), std::end(kCombiningClasses), c,
                             [](const CombiningClass& e, char32_t v) { return e.cp < v; });
  return it != std::end(kCombiningClasses) && it->cp == c ? it->ccc : 0;
}

void decompose(char32_t c, std::u32string& out) {
  if (c < 0xC0) {  // the first character with a decomposition is U+00C0
    out.push_back(c);
    return;
  }
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                             [](const Decomposition& d, char32_t v) { return d.cp < v; });
  if (it != std::end(kDecompositions) && it->cp == c)
    out.append(kDecompData + it->offset, it->length);
  else
    out.push_back(c);
}

char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = std::lower_bound(
      std::begin(kCompositions), std::end(kCompositions), std::pair(a, b),
      [](const Composition& e, std::pair<char32_t, char32_t> v) { return std::pair(e.first, e.second) < v; });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

std::u32string nfc(const std::u32string& s) {
  std::u32string d;
  d.reserve(s.size());
  for (char32_t c : s) decompose(c, d);
  // Canonical order: each run of non-starters sorted by combining class, stably.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j,
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless blocked by one of its class or a starter.
  std::u32string out;
  out.reserve(d.size());
  size_t starter = std::u32string::npos;
  int last_class = -1;
  for (char32_t c : d) {
    const int cc = combining_class(c);
    if (starter != std::u32string::npos && (last_class < cc || (last_class == 0 && out.size() == starter + 1))) {
      if (char32_t p = compose_pair(out[starter], c)) {
        out[starter] = p;
        continue;
      }
    }
    if (cc == 0) starter = out.size();
    last_class = cc;
    out.push_back(c);
  }
  return out;
}

// ---- ftfy.fix_text ------------------------------------------------------------------------------------------

bool is_ascii_alnum(char32_t c) { return c < 0x80 && (is_ascii_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')); }

const char* find_upper_entity(const std::string& ref) {
  auto it =
      std::lower_bound(std::begin(kUpperHtmlEntities), std::end(kUpperHtmlEntities), ref,
                       [](const HtmlEntity& e, const std::string& n) { return std::strcmp(e.name, n.c_str()) < 0; });
  return it != std::end(kUpperHtmlEntities) && ref == it->name ? it->value : nullptr;
}

// ftfy's unescape_html: only references of the form &#?[0-9A-Za-z]{1,24}; and only html5's names with ';' (plus
// upper-cased Latin ones), so that "this&not that" stays as written.
std::u32string ftfy_unescape_html(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] != '&') {
      out.push_back(s[i++]);
      continue;
    }
    auto run_end = [&](size_t from) {
      size_t k = from;
      while (k < s.size() && is_ascii_alnum(s[k])) ++k;
      return k;
    };
    const bool numeric = i + 1 < s.size() && s[i + 1] == '#';
    size_t start = i + 1 + (numeric ? 1 : 0);
    size_t end = run_end(start);
    if (end - start < 1 || end - start > 24 || end >= s.size() || s[end] != ';') {
      out.push_back(s[i++]);
      continue;
    }
    const std::string ref = encode_utf8(std::u32string_view(s).substr(i, end + 1 - i));
    std::string value = ref;
    if (!numeric) {
      if (const char* v = find_entity(ref.substr(1)))
        value = v;
      else if (const char* u = find_upper_entity(ref))
        value = u;
    } else {
      // A numeric reference html.unescape decodes only in part (its ';' left over) is kept whole.
      std::string u = python_html_unescape(ref);
      if (u.find(';') == std::string::npos) value = u;
    }
    out += decode_utf8(value);
    i = end + 1;
  }
  return out;
}

std::u32string fix_c1_controls(const std::u32string& s) { return translate(s, kC1Controls); }

std::u32string uncurl_quotes(std::u32string s) {
  for (char32_t& c : s) {
    if (in_ranges(kDoubleQuotes, c))
      c = '"';
    else if (in_ranges(kSingleQuotes, c))
      c = '\'';
  }
  return s;
}

std::u32string fix_line_breaks(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const char32_t c = s[i];
    if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') continue;
    out.push_back(c == '\r' || c == 0x2028 || c == 0x2029 || c == 0x85 ? U'\n' : c);
  }
  return out;
}

bool is_python_decimal(char32_t c) { return in_ranges(kPythonDecimal, c); }

// ESC [ (digits or ';')* letter: ANSI terminal escapes ("\d" is Python's: any decimal digit).
std::u32string remove_terminal_escapes(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == 0x1B && i + 1 < s.size() && s[i + 1] == '[') {
      size_t k = i + 2;
      while (k < s.size() && (s[k] == ';' || is_python_decimal(s[k]))) ++k;
      if (k < s.size() && s[k] < 0x80 && (s[k] | 0x20) >= 'a' && (s[k] | 0x20) <= 'z') {
        i = k + 1;
        continue;
      }
    }
    out.push_back(s[i++]);
  }
  return out;
}

std::u32string remove_control_chars(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s)
    if (!in_ranges(kControlChars, c)) out.push_back(c);
  return out;
}

std::u32string fix_encoding(const std::u32string& s);

// ftfy's fix_and_explain for one segment: every fixer in ftfy's order, again until nothing changes.
std::u32string fix_segment(std::u32string text, bool unescape_html) {
  while (true) {
    const std::u32string orig = text;
    if (unescape_html) text = ftfy_unescape_html(text);
    text = fix_encoding(text);
    text = fix_c1_controls(text);
    text = translate(text, kLigatures);
    text = translate(text, kWidthMap);
    text = uncurl_quotes(std::move(text));
    text = fix_line_breaks(text);
    // fix_surrogates has nothing to do: valid UTF-8 holds no surrogates.
    text = remove_terminal_escapes(text);
    text = remove_control_chars(text);
    text = nfc(text);
    if (text == orig) return text;
  }
}

// ftfy's segments: lines (with their '\n'), cut every max_decode_length (1e6) code points within a long one.
constexpr size_t kFtfySegment = 1000000;

size_t segment_end(const std::u32string& s, size_t pos) {
  size_t nl = s.find(U'\n', pos);
  size_t end = nl == std::u32string::npos ? s.size() : nl + 1;
  return std::min(end, pos + kFtfySegment);
}

// All of ftfy.fix_text's default steps are here, checked against ftfy itself on a corpus and on random mojibake in
// every encoding ftfy tries (tests/fixtures/gen_prompt_clean_fixtures.py). What differs: fix_surrogates has no
// work (a C++ prompt is UTF-8, which cannot hold surrogates; ftfy needs it for Python strings decoded by other
// means), text that is not valid UTF-8 is refused rather than fixed, and the Unicode tables are those of the
// Python and ftfy that tools/gen_ftfy_tables.py ran with (Unicode 14.0, ftfy 6.3.1): a newer Unicode may
// normalise characters assigned since differently.
std::u32string fix_text(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  // "auto": a segment with a '<' is probably HTML whose entities are meant; ftfy keeps them from there on.
  bool unescape_html = true;
  for (size_t pos = 0; pos < s.size();) {
    const size_t end = segment_end(s, pos);
    std::u32string segment = s.substr(pos, end - pos);
    if (unescape_html && segment.find(U'<') != std::u32string::npos) unescape_html = false;
    out += fix_segment(std::move(segment), unescape_html);
    pos = end;
  }
  return out;
}

// ---- ftfy.fix_encoding --------------------------------------------------------------------------------------

bool in_ranges(const CodeRange* first, size_t n, char32_t c) {
  auto it = std::upper_bound(first, first + n, c, [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != first && c <= std::prev(it)->last;
}

bool bad_element_matches(const BadElement& e, char32_t c) {
  if (e.flags & 4) return is_python_space(c);
  if (e.flags & 8) return in_ranges(kPythonWord, c);
  if (c >= 0x10000) return e.flags & 16;
  return in_ranges(kBadRanges + e.first_range, e.ranges, c);
}

bool bad_match(const BadElement* e, const BadElement* end, const std::u32string_view s, size_t pos) {
  if (e == end) return true;
  if (e->flags & 2) return pos == 0 && bad_match(e + 1, end, s, pos);
  const bool here = pos < s.size() && bad_element_matches(*e, s[pos]) && bad_match(e + 1, end, s, pos + 1);
  return here || ((e->flags & 1) && bad_match(e + 1, end, s, pos));
}

// For each pattern, which ASCII characters can start a match: the others are not tried there.
using AsciiSet = std::array<bool, 128>;
std::array<AsciiSet, std::size(kBadAlternatives)> bad_ascii_starts() {
  std::array<AsciiSet, std::size(kBadAlternatives)> out{};
  for (size_t a = 0; a < std::size(kBadAlternatives); ++a) {
    const BadAlternative& alt = kBadAlternatives[a];
    for (uint8_t k = 0; k < alt.elements; ++k) {
      const BadElement& e = kBadElements[alt.first_element + k];
      if (!(e.flags & 2))
        for (char32_t c = 0; c < 128; ++c) out[a][c] = out[a][c] || bad_element_matches(e, c);
      if (!(e.flags & 3)) break;  // a required element: later ones cannot start the match
    }
  }
  return out;
}

// ftfy's is_bad: does any of BADNESS_RE's patterns of unlikely character sequences occur?
bool is_bad(std::u32string_view s) {
  static const auto ascii_starts = bad_ascii_starts();
  for (size_t pos = 0; pos < s.size(); ++pos) {
    for (size_t a = 0; a < std::size(kBadAlternatives); ++a) {
      if (s[pos] < 0x80 && !ascii_starts[a][s[pos]]) continue;
      const BadElement* first = kBadElements + kBadAlternatives[a].first_element;
      if (bad_match(first, first + kBadAlternatives[a].elements, s, pos)) return true;
    }
  }
  return false;
}

bool encodable(const Charmap& map, char32_t c) {
  if (c < 0x80) return c != 0x1A || map.sub == 0x1A;
  if (c == map.sub) return true;
  return std::find(std::begin(map.high), std::end(map.high), c) != std::end(map.high);
}

bool possible_encoding(std::u32string_view s, const Charmap& map) {
  return std::all_of(s.begin(), s.end(), [&](char32_t c) { return encodable(map, c); });
}

std::string encode_charmap(std::u32string_view s, const Charmap& map) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c == map.sub) {
      out.push_back(0x1A);
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      auto at = std::find(std::begin(map.high), std::end(map.high), c) - std::begin(map.high);
      out.push_back(static_cast<char>(0x80 + at));
    }
  }
  return out;
}

using Bytes = std::string;
bool byte_in(unsigned char b, unsigned char lo, unsigned char hi) { return b >= lo && b <= hi; }
bool cont(unsigned char b) { return byte_in(b, 0x80, 0xBF); }
// [\x80-\x84\x86-\x9f\xa1-\xbf]: a continuation byte, but not 0x85 or 0xA0
bool cont_not_85_a0(unsigned char b) { return cont(b) && b != 0x85 && b != 0xA0; }

// ftfy's ALTERED_UTF8_RE at `i`: the length of its match (UTF-8 with a space where a byte 0xA0 was), or 0.
size_t altered_utf8_at(const Bytes& s, size_t i) {
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1; };
  const int b0 = at(0);
  if ((b0 == 0xC2 || b0 == 0xC3 || b0 == 0xC5 || b0 == 0xCE || b0 == 0xD0 || b0 == 0xD9) && at(1) == ' ') return 2;
  if ((b0 == 0xE2 || b0 == 0xE3) && at(1) == ' ' && at(2) >= 0 && cont_not_85_a0(at(2))) return 3;
  if (b0 >= 0xE0 && b0 <= 0xE3 && at(1) >= 0 && cont_not_85_a0(at(1)) && at(2) == ' ') return 3;
  if (b0 == 0xF0) {
    const int b1 = at(1), b2 = at(2), b3 = at(3);
    auto c = [](int b) { return b >= 0 && cont(b); };
    if (b1 == ' ' && c(b2) && c(b3)) return 4;
    if (c(b1) && b2 == ' ' && c(b3)) return 4;
    if (c(b1) && c(b2) && b3 == ' ') return 4;
  }
  return 0;
}

bool has_altered_utf8(const Bytes& s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (altered_utf8_at(s, i)) return true;
  return false;
}

// ftfy's restore_byte_a0: "\xc3 " that is a word "à" keeps its space, then every altered sequence gets its 0xA0.
Bytes restore_byte_a0(const Bytes& in) {
  Bytes s;
  s.reserve(in.size() + 8);
  for (size_t i = 0; i < in.size(); ++i) {
    s.push_back(in[i]);
    if (static_cast<unsigned char>(in[i]) == 0xC3 && i + 1 < in.size() && in[i + 1] == ' ') {
      const std::string_view rest = std::string_view(in).substr(i + 2);
      const bool excluded = rest.starts_with(" ") || rest.starts_with("quele") || rest.starts_with("quela") ||
                            rest.starts_with("quilo") || rest.starts_with("s ");
      if (!excluded) s.push_back(static_cast<char>(0xA0));
    }
  }
  Bytes out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (size_t n = altered_utf8_at(s, i)) {
      for (size_t k = 0; k < n; ++k) out.push_back(s[i + k] == ' ' ? static_cast<char>(0xA0) : s[i + k]);
      i += n;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// ftfy's LOSSY_UTF8_RE at `i`: UTF-8 (or CESU-8) whose lost bytes became 0x1A (or one '?'); its length or 0.
size_t lossy_utf8_at(const Bytes& s, size_t i) {
  auto at = [&](size_t k) -> int { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : -1; };
  auto lost = [](int b) { return b == 0x1A || b == '?'; };
  auto sub_or_cont = [](int b) { return b == 0x1A || (b >= 0x80 && b <= 0xBF); };
  auto any = [&](int b) { return lost(b) || (b >= 0x80 && b <= 0xBF); };
  const int b0 = at(0), b1 = at(1), b2 = at(2), b3 = at(3), b4 = at(4), b5 = at(5);
  if (b0 >= 0xC2 && b0 <= 0xDF && b1 == 0x1A) return 2;
  if ((b0 == 0xC2 || b0 == 0xC3) && b1 == '?') return 2;
  if (b0 == 0xED && b1 >= 0xA0 && b1 <= 0xAF && lost(b2) && b3 == 0xED && b4 >= 0xB0 && b4 <= 0xBF && any(b5)) return 6;
  if (b0 == 0xED && b1 >= 0xA0 && b1 <= 0xAF && any(b2) && b3 == 0xED && b4 >= 0xB0 && b4 <= 0xBF && lost(b5)) return 6;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (lost(b1) && sub_or_cont(b2)) return 3;
    if (sub_or_cont(b1) && lost(b2)) return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (lost(b1) && sub_or_cont(b2) && sub_or_cont(b3)) return 4;
    if (sub_or_cont(b1) && lost(b2) && sub_or_cont(b3)) return 4;
    if (sub_or_cont(b1) && sub_or_cont(b2) && lost(b3)) return 4;
  }
  return b0 == 0x1A ? 1 : 0;
}

Bytes replace_lossy_sequences(const Bytes& s) {
  Bytes out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (size_t n = lossy_utf8_at(s, i)) {
      out += "\xef\xbf\xbd";
      i += n;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// Python's strict UTF-8 decoder, or with `variants` ftfy's utf-8-variants: also CESU-8 surrogate pairs and Java's
// two-byte NUL (C0 80). Empty when the bytes do not decode.
std::optional<std::u32string> decode_utf8_strict(const Bytes& s, bool variants) {
  std::u32string out;
  out.reserve(s.size());
  auto b = [&](size_t k) -> int { return k < s.size() ? static_cast<unsigned char>(s[k]) : -1; };
  for (size_t i = 0; i < s.size();) {
    const int c = b(i);
    if (variants && c == 0xC0 && b(i + 1) == 0x80) {
      out.push_back(0);
      i += 2;
      continue;
    }
    if (variants && c == 0xED && b(i + 1) >= 0xA0 && b(i + 1) <= 0xAF && cont(b(i + 2)) && b(i + 3) == 0xED &&
        b(i + 4) >= 0xB0 && b(i + 4) <= 0xBF && b(i + 5) >= 0 && cont(b(i + 5))) {
      out.push_back(0x10000 + ((b(i + 1) & 0x0F) << 16) + ((b(i + 2) & 0x3F) << 10) + ((b(i + 4) & 0x0F) << 6) +
                    (b(i + 5) & 0x3F));
      i += 6;
      continue;
    }
    int extra;
    char32_t cp;
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      extra = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3, cp = c & 0x07;
    } else {
      return std::nullopt;
    }
    for (int k = 1; k <= extra; ++k) {
      const int cc = b(i + k);
      if (cc < 0 || !cont(cc)) return std::nullopt;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

bool in_clue(const CodeRange* first, size_t n, char32_t c) { return c < 0x10000 && in_ranges(first, n, c); }
#define CLUE(table, c) in_clue(table, std::size(table), c)

// ftfy's UTF8_DETECTOR_RE at `i` (its look-behind checked by the caller): runs of what looks like UTF-8 read as a
// single-byte encoding; the length of the run or 0.
size_t utf8_detector_at(const std::u32string& s, size_t i) {
  size_t k = i;
  while (true) {
    auto conts = [&](size_t from, size_t n) {
      for (size_t x = 0; x < n; ++x)
        if (from + x >= s.size() || !CLUE(kUtf8Continuation, s[from + x])) return false;
      return true;
    };
    if (k >= s.size()) break;
    if (CLUE(kUtf8FirstOf2, s[k]) && conts(k + 1, 1))
      k += 2;
    else if (CLUE(kUtf8FirstOf3, s[k]) && conts(k + 1, 2))
      k += 3;
    else if (CLUE(kUtf8FirstOf4, s[k]) && conts(k + 1, 3))
      k += 4;
    else
      break;
  }
  return k - i;
}

// ftfy's decode_inconsistent_utf8: each UTF-8-looking run that is itself bad (and shorter than the text) is fixed
// on its own.
std::u32string decode_inconsistent_utf8(const std::u32string& s, bool* found) {
  std::u32string out;
  out.reserve(s.size());
  *found = false;
  for (size_t i = 0; i < s.size();) {
    size_t n = (i > 0 && CLUE(kUtf8ContinuationStrict, s[i - 1])) ? 0 : utf8_detector_at(s, i);
    if (n == 0) {
      out.push_back(s[i++]);
      continue;
    }
    *found = true;
    const std::u32string run = s.substr(i, n);
    out += (run.size() < s.size() && is_bad(run)) ? fix_encoding(run) : run;
    i += n;
  }
  return out;
}

// Strict Windows-1252 (bytes 0x81, 0x8D, 0x8F, 0x90, 0x9D undefined), for Latin-1 text with C1 controls.
std::optional<std::u32string> latin1_as_windows1252(const std::u32string& s) {
  std::u32string out = s;
  for (char32_t& c : out) {
    if (c < 0x80 || c > 0x9F) continue;
    if (c == 0x81 || c == 0x8D || c == 0x8F || c == 0x90 || c == 0x9D) return std::nullopt;
    c = decode_utf8(mapped(kC1Controls, c))[0];
  }
  return out;
}

bool has_c1(const std::u32string& s) {
  return std::any_of(s.begin(), s.end(), [](char32_t c) { return c >= 0x80 && c <= 0x9F; });
}

// One step of ftfy's fix_encoding: re-decode text that reads as UTF-8 mistaken for a single-byte encoding.
std::u32string fix_encoding_step(const std::u32string& s) {
  if (s.empty()) return s;
  if (std::all_of(s.begin(), s.end(), [](char32_t c) { return c < 0x80; }) || !is_bad(s)) return s;
  bool latin1_possible = false;
  for (const Charmap& map : kCharmaps) {
    if (!possible_encoding(s, map)) continue;
    const std::string_view name = map.name;
    if (name == "latin-1") latin1_possible = true;
    Bytes bytes = encode_charmap(s, map);
    if (name != "macroman" && has_altered_utf8(bytes)) bytes = restore_byte_a0(bytes);
    if (name.starts_with("sloppy")) bytes = replace_lossy_sequences(bytes);
    const bool variants = bytes.find('\xed') != Bytes::npos || bytes.find('\xc0') != Bytes::npos;
    if (auto fixed = decode_utf8_strict(bytes, variants)) return *fixed;
  }
  bool found = false;
  std::u32string fixed = decode_inconsistent_utf8(s, &found);
  if (found && fixed != s) return fixed;
  // ftfy checks for "windows-1252" among the possible encodings, a name its list never holds (it has the sloppy
  // one), so Latin-1 text is always tried as Windows-1252.
  if (latin1_possible) {
    if (auto w = latin1_as_windows1252(s); w && *w != s) return *w;
  }
  if (has_c1(s)) return fix_c1_controls(s);
  return s;
}

std::u32string fix_encoding(const std::u32string& s) {
  std::u32string text = s;
  while (true) {
    std::u32string next = fix_encoding_step(text);
    if (next == text) return text;
    text = std::move(next);
  }
}

// diffusers' whitespace_clean after basic_clean's strip(): every run of Python whitespace to one space, trimmed.
std::u32string collapse_whitespace(const std::u32string& s) {
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
  return out;
}

// Where the ftfy segment that starts at byte `pos` ends, in bytes (segment_end on UTF-8).
size_t segment_end_bytes(const std::string& s, size_t pos) {
  size_t count = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && count++ == kFtfySegment) return i;
    if (s[i] == '\n') return i + 1;
  }
  return s.size();
}

std::string clean_fixed(const std::string& fixed) {
  return encode_utf8(collapse_whitespace(decode_utf8(python_html_unescape(python_html_unescape(fixed)))));
}

}  // namespace

std::string ftfy_fix_text(const std::string& text) { return encode_utf8(fix_text(decode_utf8(text))); }

TokenizerInputPrefix wan_prompt_clean_prefix(const std::string& text, size_t max_bytes) {
  if (max_bytes >= text.size()) return {wan_prompt_clean(text), true};
  decode_utf8_check(text);
  size_t end = 0;
  while (end < text.size()) {
    const size_t next = segment_end_bytes(text, end);
    if (next > max_bytes) break;
    end = next;
  }
  // Whole segments: ftfy fixes each on its own, and a '<' only changes those after it.
  std::u32string fixed = fix_text(decode_utf8(text.substr(0, end)));
  // html.unescape's references hold none of " \t\n\f", so the text up to one unescapes as the start of the whole.
  const size_t cut = fixed.find_last_of(U" \t\n\f");
  if (cut == std::u32string::npos) return {{}, false};
  fixed.resize(cut + 1);
  return {clean_fixed(encode_utf8(fixed)), false};
}

std::string wan_prompt_clean(const std::string& text) { return clean_fixed(ftfy_fix_text(text)); }

}  // namespace latent
