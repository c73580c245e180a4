// Numbers in untrusted text (metadata values): the whole string must be the number, within [lo, hi]. Empty when
// it is not, so each caller words its own error naming the file and the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace latent {

std::optional<int64_t> bounded_integer(std::string_view text, int64_t lo, int64_t hi);
// NaN never lies within bounds, so it is refused too.
std::optional<double> bounded_number(std::string_view text, double lo, double hi);

}  // namespace latent
