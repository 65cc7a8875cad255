// The graph-replay step (docs/verification.md "Graph replay"; issue 21 item 5): for an op that
// declares mutable metadata (Op::graph_variant), the kernel's launch is captured into a CUDA/HIP
// graph with the variant's metadata, the case's own contents are uploaded into the same buffers,
// the graph is replayed, and its outputs are judged like the first launch's. A kernel or wrapper
// that read metadata on the host at capture (a maximum length, a grid, a prefix sum) replays the
// stale values and fails, named "graph replay". A library without graph capture, or an entry it
// cannot capture, skips the step with the library's reason.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/compare.h"
#include "ops/op.h"
#include "run/device.h"

namespace attncheck {

struct GraphReplayOutcome {
  enum class Kind { not_declared, skipped, passed, failed };
  Kind kind = Kind::not_declared;
  std::string message;        // the note for a passed case, the reason or the failure
  bool device_error = false;  // the replay faulted on the device (a fresh process is due)
};

// The checks of one launch's outputs against the case's expected outputs (the caller's judge).
using OutputJudge = std::function<std::vector<CheckResult>(const TensorMap& outputs)>;

// Runs the step for problem `p` of `op`. Throws std::logic_error when the op's variant changes
// more than the contents of the inputs it declares (a harness bug, not the kernel's).
GraphReplayOutcome graph_replay_step(const Op& op, const Problem& p, const DeviceRunner& device,
                                     const OutputJudge& judge);

// The verdict of one replay's outcome (separate for tests without a GPU): `how` describes the
// variant, `outcome` is DeviceRunner::replay's.
GraphReplayOutcome judge_graph_replay(const std::string& how, const DeviceOutcome& outcome,
                                      const OutputJudge& judge);

// Whether the variant differs from `p` exactly in contents, and only of inputs it declares:
// "" when it does, else what is wrong.
std::string graph_variant_error(const Problem& p, const GraphVariant& variant);

}  // namespace attncheck
