#include "ops/branch.h"

#include <exception>

#include "ops/backend.h"
#include "ops/context.h"

namespace tern::ops {

void run_side(const Context& ctx, Device device, const std::function<void()>& body, BranchLength length) {
  Backend& backend = ctx.backend_for(device);
  backend.side_begin(length == BranchLength::longer);
  try {
    body();
  } catch (...) {
    // Back on the main branch, with the side's work joined, before the error leaves: the caller's next
    // ops (or its unwinding) must not land on the side stream.
    backend.side_end();
    backend.side_join();
    throw;
  }
  backend.side_end();
}

void join_side(const Context& ctx, Device device) {
  ctx.backend_for(device).side_join();
}

}  // namespace tern::ops
