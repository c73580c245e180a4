#include "io/numbers.h"

#include <charconv>

namespace latent {

std::optional<int64_t> bounded_integer(std::string_view text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

std::optional<double> bounded_number(std::string_view text, double lo, double hi) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !(v >= lo && v <= hi))
    return std::nullopt;
  return v;
}

}  // namespace latent
