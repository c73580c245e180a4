// libFuzzer target for the whole weight-loading path of a model file: the container (a .safetensors file, or a
// torch.save archive when the input starts like a zip: the restricted reader and its mapped tensors), the config in
// __metadata__, family detection (config class, "family" key, tensor names and the renaming of the original Wan
// layout), each family's config checks and its shape-checked WeightReader, and page residency. Every input must
// load or be refused with the loader's own errors; any other exception (a LibTorch error escaping the checks, a
// standard exception) is a finding, as is a crash, a leak or undefined behaviour.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/json.h"
#include "latent/io/safetensors.h"
#include "latent/io/weights.h"
#include "latent/vae/vae.h"

namespace {

// One file per process and reader, rewritten for every input: the loader reads paths, and the extension picks
// the reader.
std::string scratch_path(bool zip) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/latent-fuzz-weights-" + std::to_string(::getpid()) +
         (zip ? ".pth" : ".safetensors");
}

void write_all(const std::string& path, const uint8_t* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const bool zip = size >= 2 && data[0] == 'P' && data[1] == 'K';
  const std::string path = scratch_path(zip);
  write_all(path, data, size);
  try {
    auto vae = latent::load_vae(std::filesystem::path(path));
    // A model that loads must be usable: its spec is consistent.
    if (vae->spec().temporal_factor < 1 || vae->spec().spatial_factor < 1) std::abort();
  } catch (const latent::ModelError&) {
  } catch (const latent::SafetensorsError&) {
  }
  return 0;
}
