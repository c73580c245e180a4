#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "latent/runtime/devices.h"

namespace latent {

void run_on_side_stream(torch::Device device, const std::function<void()>& work) {
  if (device.is_cuda()) {
    // Through c10's device-generic stream interface: this library does not link the CUDA runtime itself.
    const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream stream =
        cuda->getStreamFromGlobalPool(c10::Device(c10::DeviceType::CUDA, device.has_index() ? device.index() : 0));
    {
      c10::StreamGuard guard(stream);
      work();
    }
    // Tensors made on the stream are handed to another: done before they leave.
    stream.synchronize();
    return;
  }
  work();
}

}  // namespace latent
