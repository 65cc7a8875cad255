#include "run/graph_replay.h"

#include <algorithm>
#include <stdexcept>

namespace attncheck {

namespace {
std::string joined(const std::vector<std::string>& parts, const char* sep = ", ") {
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : sep) + p;
  return s;
}

std::string status_words(int status) {
  switch (status) {
    case ATTNCHECK_REFUSED:
      return "the kernel refused the captured launch";
    case ATTNCHECK_HOST_ERROR:
      return "the kernel entry failed on the host";
    case ATTNCHECK_UNKNOWN_OP:
      return "the library does not know the entry";
    case ATTNCHECK_NO_DEVICE:
      return "no device";
    default:
      return "kernel error";
  }
}
}  // namespace

std::string graph_variant_error(const Problem& p, const GraphVariant& variant) {
  const VariantDifference d = variant_difference(p, variant.capture);
  if (!d.structure.empty()) return "it changes more than contents: " + d.structure;
  for (const auto& name : d.contents)
    if (std::find(variant.changed.begin(), variant.changed.end(), name) == variant.changed.end())
      return "argument '" + name +
             "' differs but is not declared mutable (declared: " + joined(variant.changed) + ")";
  for (const auto& a : p.args)
    if (a.role != Role::input &&
        std::find(d.contents.begin(), d.contents.end(), a.name) != d.contents.end())
      return "output '" + a.name + "' differs: only inputs are metadata";
  if (d.contents.empty()) return "its contents equal the case's (nothing changes between replays)";
  return "";
}

GraphReplayOutcome judge_graph_replay(const std::string& how, const DeviceOutcome& o,
                                      const OutputJudge& judge) {
  GraphReplayOutcome g;
  const std::string what = "graph replay (captured with " + how + ", replayed with the case's own)";
  if (o.status == ATTNCHECK_UNSUPPORTED) {
    g.kind = GraphReplayOutcome::Kind::skipped;
    g.message = "graph replay skipped: " + o.message;
    return g;
  }
  g.kind = GraphReplayOutcome::Kind::failed;
  if (o.status != ATTNCHECK_OK) {
    g.device_error = o.status == ATTNCHECK_ERROR;
    g.message = what + ": " + status_words(o.status) + ": " + o.message;
    return g;
  }
  std::vector<std::string> problems;
  for (const auto& v : o.violations) problems.push_back(v);
  for (const auto& ch : judge(o.outputs))
    if (!ch.passed) problems.push_back(ch.name + ": " + ch.message);
  if (!problems.empty()) {
    g.message = what + ": " + joined(problems, "; ");
    return g;
  }
  g.kind = GraphReplayOutcome::Kind::passed;
  g.message = "graph replay within budget (" + how + " at capture)";
  return g;
}

GraphReplayOutcome graph_replay_step(const Op& op, const Problem& p, const DeviceRunner& device,
                                     const OutputJudge& judge) {
  const auto variant = op.graph_variant(p);
  if (!variant) return {};
  if (const std::string error = graph_variant_error(p, *variant); !error.empty())
    throw std::logic_error("op " + op.name() + ": graph variant (" + variant->how +
                           ") is not a replay of the same launch: " + error);
  if (!device.can_capture_graphs()) {
    GraphReplayOutcome g;
    g.kind = GraphReplayOutcome::Kind::skipped;
    g.message = "graph replay skipped: the kernel library " + device.library().library() +
                " offers no graph capture (extension table, docs/abi.md)";
    return g;
  }
  return judge_graph_replay(variant->how, device.replay(variant->capture, p), judge);
}

}  // namespace attncheck
