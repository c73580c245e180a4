// libFuzzer target for the JSON reader: no crash on any input, and dump() of an accepted document parses back
// to the same text.
#include <cstdint>
#include <string>
#include <string_view>

#include "io/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  latent::json::Value v;
  try {
    v = latent::json::parse(text);
  } catch (const latent::json::Error&) {
    return 0;
  }
  std::string once = latent::json::dump(v);
  std::string twice = latent::json::dump(latent::json::parse(once));
  if (once != twice) __builtin_trap();
  return 0;
}
