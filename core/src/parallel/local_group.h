// Ranks that are threads of one process (ThreadGroup) share more than a store: each can reach every rank's
// communicators directly.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "latent/parallel/comm.h"

namespace latent::parallel::testing {

// Lets a test stand between a thread group and its communicators: to fail a rank on its Nth call, or to put in a
// backend that blocks as an NCCL kernel does. Thread groups joined while a hook is set pass it every communicator
// they made (`name`: "halo" or "collectives") and use what it returns. Not for concurrent use with other groups.
using CommunicatorHook =
    std::function<std::shared_ptr<Communicator>(std::shared_ptr<Communicator> made, const std::string& name)>;
void set_communicator_hook(CommunicatorHook hook);  // an empty hook removes it

}  // namespace latent::parallel::testing
