// latent-inspect: validates safetensors files (model weights, latent streams) and prints what they hold.
// Exit status 0 when every file is valid, 1 otherwise; each defect is reported with the file it came from.
#include <cstdio>
#include <exception>
#include <string>

#include "latent/io/safetensors.h"
#include "latent/runtime/build_info.h"

namespace {

std::string shape_text(const latent::st::TensorEntry& e) {
  std::string s = "[";
  for (size_t i = 0; i < e.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(e.shape[i]);
  return s + "]";
}

void print_file(const latent::SafetensorsFile& f) {
  uint64_t total = 0;
  for (const auto& e : f.entries()) total += e.nbytes();
  std::printf("%s: %zu tensors, %llu data bytes\n", f.path().c_str(), f.entries().size(),
              static_cast<unsigned long long>(total));
  for (const auto& [k, v] : f.metadata()) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
  for (const auto& e : f.entries()) {
    std::printf("  %-48s %-8s %s\n", e.name.c_str(), latent::st::dtype_name(e.dtype), shape_text(e).c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: latent-inspect FILE.safetensors...\n       latent-inspect --runtime\n");
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--runtime") {
    std::printf("%s\n", latent::runtime_summary().c_str());
    return 0;
  }
  int status = 0;
  for (int i = 1; i < argc; ++i) {
    try {
      print_file(latent::SafetensorsFile::open(argv[i]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "latent-inspect: %s\n", e.what());
      status = 1;
    }
  }
  return status;
}
