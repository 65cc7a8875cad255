// Partial contracts (docs/verification.md "Partial contracts"): what a kernel entry declares it
// leaves out (kernels_under_test/attncheck_abi.h, the extension table's `partial`), checked
// against the op, and how a launch's outputs and the expected outputs are judged under it:
//   not produced   the output must come back untouched (a write there is a violation); it is
//                  then left out of the outputs and of every comparison
//   unspecified    the region's elements (the op says which, Op::in_region) are not compared:
//                  they are zeroed in the outputs and in the expected outputs alike; writes there
//                  must still stay inside the output's view (the runner's guards check that)
// Every other output and region is judged in full.
#pragma once
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/op.h"
#include "run/device.h"

namespace attncheck {

struct PartialContract {
  std::vector<std::string> not_produced;           // output names, in declaration order
  std::map<std::string, std::string> unspecified;  // output -> region
  bool empty() const { return not_produced.empty() && unspecified.empty(); }
  bool produces(const std::string& output) const;
  // {"not_produced": [...], "unspecified": {...}}; null when empty (results.jsonl "partial").
  nlohmann::json to_json() const;
  // "'lse' not produced; 'logits' past_context unspecified" ("" when empty).
  std::string describe() const;
};

// A Result's "partial" record read back (no checks: it was written from a checked contract).
PartialContract partial_from_json(const nlohmann::json& j);

// A declaration that names no output of the op, a region the op does not define for that
// output, or is not the JSON the ABI asks for.
struct PartialContractError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The outputs (output and inout arguments) of the op's problems that launch `entry`, from its
// default case and the default with one axis at each allowed value; kept.
const std::vector<std::string>& op_outputs(const Op& op, const std::string& entry);
// The op whose kernel_entries() list `entry`, or nullptr.
const Op* op_of_entry(const std::string& entry);

// `json` (the library's answer for `entry` of `op`) read and checked; `library` names the library
// in messages. Throws PartialContractError naming the library, the entry, the op and the bad name.
PartialContract parse_partial(const std::string& json, const Op& op, const std::string& entry,
                              const std::string& library);
// What `lib` declares for `entry` of `op`, checked (the text is asked once per entry and kept).
PartialContract entry_partial(const KernelLibrary& lib, const std::string& entry, const Op& op);

// One launch of `launched` (status OK) judged under the contract its entry declares: a write to a
// not-produced output becomes a violation and the output leaves o.outputs; an unspecified
// region is zeroed in o.outputs. Nothing for a library or entry that declares none; a bad
// declaration becomes a violation (evaluate() refuses such entries before any launch).
void settle_launch(const KernelLibrary& lib, const Problem& launched, DeviceOutcome& o);
// The same for the expected outputs of `p`: not-produced outputs removed, regions zeroed.
void settle_expected(const PartialContract& c, const Op& op, const Problem& p, TensorMap& expected);
// `checks` without those of not-produced outputs.
std::vector<OutputCheck> produced_checks(std::vector<OutputCheck> checks, const PartialContract& c);

}  // namespace attncheck
