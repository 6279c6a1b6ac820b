// Concurrent branches of one step (the shared expert beside the routed ones, the indexer beside the
// query projections): work that shares no data until a join point.
//
// run_side(device, body): the ops `body` issues form a side branch. On a GPU inside a recorded step (a CUDA
// graph) they run on a second stream, concurrently with the ops the caller issues next, until
// join_side(device); eagerly and on the CPU they run in issue order, so results are the same bits either
// way. The side branch may read only what exists before run_side() and may write only what the main branch
// does not touch before join_side(); tensors it makes must outlive the join if the main branch reads them.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace tern::ops {

class Context;  // ops/context.h

// Whether the caller expects the branch to be the longer of the two (the join waits for it: the CSA indexer's)
// or to finish first (the shared expert beside the routed ones): a scheduling hint, never a change of results.
enum class BranchLength { shorter, longer };

// (In ctx: the side branch of ctx's backend, for work on `device`.)
void run_side(const Context& ctx, Device device, const std::function<void()>& body,
              BranchLength length = BranchLength::shorter);
void join_side(const Context& ctx, Device device);

}  // namespace tern::ops
