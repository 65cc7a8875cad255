#include "run/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <map>
#include <optional>
#include <sstream>

#include "run/cases.h"
#include "run/graph_replay.h"
#include "run/invariance.h"
#include "run/partial.h"

namespace attncheck {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Adds the time until the end of its scope to one phase of a case's Timings.
class PhaseClock {
 public:
  explicit PhaseClock(double& into) : into_(into) {}
  ~PhaseClock() { into_ += ms_since(t0_); }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

 private:
  double& into_;
  Clock::time_point t0_ = Clock::now();
};

std::string join(const std::vector<std::string>& parts, const std::string& sep = "; ") {
  std::string s;
  for (const auto& p : parts) s += (s.empty() ? "" : sep) + p;
  return s;
}

bool known_bug_applies(const Case& c, const std::string& arch) {
  if (!c.known_bug) return false;
  if (c.known_bug->arch.empty()) return true;
  return IdRegex(c.known_bug->arch, "known bug arch").search(arch);
}

// Known bugs are kernel bugs: only kernel-mode verdicts are marked.
void apply_known_bug(Result& r, const Case& c) {
  if (!known_bug_applies(c, r.arch)) return;
  if (r.verdict == Verdict::failed) {
    r.verdict = Verdict::known_bug;
    r.message = "known bug (" + c.known_bug->reason + "): " + r.message;
  } else if (r.verdict == Verdict::passed || r.verdict == Verdict::refused_as_expected) {
    r.verdict = Verdict::unexpected_pass;
    r.message = "passed although marked known bug (" + c.known_bug->reason + "): " + r.message;
  }
}

Result skeleton(const Case& c, const RunOptions& opt) {
  Result r;
  r.id = c.id;
  r.op = c.op;
  r.params = c.params;
  r.arch = opt.arch;
  r.repro = repro_command(c, opt);
  return r;
}

// Elements of a pure output that hold their initial bytes after both launches (first from the
// original poison, second from its complement): the kernel never wrote them.
std::string unwritten_elements(const std::string& name, const Tensor& init1, const Tensor& out1,
                               const Tensor& init2, const Tensor& out2) {
  int64_t count = 0;
  Index first;
  out1.for_each_index([&](const Index& idx, int64_t) {
    if (out1.get_bits(idx) == init1.get_bits(idx) && out2.get_bits(idx) == init2.get_bits(idx)) {
      if (count++ == 0) first = idx;
    }
  });
  if (count == 0) return "";
  return std::to_string(count) + " of " + std::to_string(out1.numel()) + " elements of '" + name +
         "' were never written (first at " + format_index(first) +
         "): they keep whatever the buffer held before the launch";
}

// A launch status other than OK, in words; sets the verdict it implies.
void launch_failed(Result& r, const DeviceOutcome& o, const std::string& launch) {
  r.device_error = r.device_error || o.status == ATTNCHECK_ERROR;
  switch (o.status) {
    case ATTNCHECK_REFUSED:
      r.verdict = Verdict::failed;
      r.message = launch + "kernel refused a valid configuration: " + o.message;
      return;
    case ATTNCHECK_HOST_ERROR:
      r.verdict = Verdict::failed;
      r.message = launch + "kernel entry failed on the host: " + o.message;
      return;
    case ATTNCHECK_UNKNOWN_OP:
      r.verdict = Verdict::failed;
      r.message =
          launch + "the kernel library does not know entry '" + r.kernel_entry + "': " + o.message;
      return;
    default:
      r.verdict = Verdict::failed;
      r.message = launch + "kernel error: " + o.message;
  }
}

// The shared-memory poison patterns stress launches cycle through (docs/abi.md): NaN in f32,
// bf16 and f16 (two kinds), and none at all, which leaves what the previous launch wrote.
constexpr const char* kStressPoisons[] = {"0x7FFF7FFF", "0xFFFFFFFF", "0x7FC07FC0", "off"};

bool all_passed(const std::vector<CheckResult>& checks) {
  return std::all_of(checks.begin(), checks.end(), [](const CheckResult& c) { return c.passed; });
}

std::string failures_of(const std::vector<CheckResult>& checks) {
  std::vector<std::string> parts;
  for (const auto& ch : checks)
    if (!ch.passed) parts.push_back(ch.name + ": " + ch.message);
  return join(parts);
}

// The budgets of one problem under arithmetic contracts (docs/verification.md "Arithmetic
// contracts"): outputs are judged by the default contract's budgets and, only when those fail and
// the kernel declares another contract, by the declared contract's. Each contract's checks are
// derived once, when first needed.
class ContractJudge {
 public:
  // `declared`: the entry's contract; nullopt for ops whose budgets no contract changes.
  // `partial`: the entry's partial contract; its not-produced outputs are never checked.
  ContractJudge(const Op& op, const Problem& p, const TensorMap& expected,
                std::optional<Contract> declared, const PartialContract& partial, Timings& timings)
      : op_(op),
        p_(p),
        expected_(expected),
        declared_(declared),
        partial_(partial),
        timings_(timings) {}

  bool applies() const { return declared_.has_value(); }
  const Contract& declared() const { return *declared_; }
  const TensorMap& expected() const { return expected_; }

  // The default budgets of a case kept in `prepared` are derived once per process: `expected_key`
  // says where the expected outputs came from (and the partial contract that settled them).
  void keep_in(PreparedCases* prepared, std::string id, std::string expected_key) {
    prepared_ = prepared;
    id_ = std::move(id);
    expected_key_ = std::move(expected_key);
  }

  const std::vector<OutputCheck>& checks_for(const Contract& c) {
    for (const auto& [contract, checks] : derived_)
      if (contract == c) return checks;
    const PhaseClock clock(timings_.budgets_ms);
    auto derive = [&] {
      return c.is_default() ? op_.checks(p_, expected_) : op_.contract_checks(p_, expected_, c);
    };
    derived_.emplace_back(
        c, produced_checks(prepared_ && c.is_default()
                               ? prepared_->default_checks(id_, expected_key_, derive)
                               : derive(),
                           partial_));
    return derived_.back().second;
  }

  // The checks of one launch's outputs. *declared_used: whether they are the declared contract's
  // (the default's failed); *default_failures: the default's failures then, in words.
  std::vector<CheckResult> check(const TensorMap& outputs, bool* declared_used = nullptr,
                                 std::string* default_failures = nullptr) {
    auto results = timed_check(checks_for(Contract{}), outputs);
    if (declared_used) *declared_used = false;
    if (all_passed(results) || !applies() || declared_->is_default()) return results;
    if (default_failures) *default_failures = failures_of(results);
    if (declared_used) *declared_used = true;
    return timed_check(checks_for(*declared_), outputs);
  }

  // The first known contract, other than the default and the declared one, whose budgets every
  // output meets: what the error would fit.
  std::optional<Contract> explaining(const TensorMap& outputs) {
    for (const Contract& c : known_contracts()) {
      if (c.is_default() || c == *declared_) continue;
      if (all_passed(timed_check(checks_for(c), outputs))) return c;
    }
    return std::nullopt;
  }

 private:
  std::vector<CheckResult> timed_check(const std::vector<OutputCheck>& checks,
                                       const TensorMap& outputs) {
    const PhaseClock clock(timings_.compare_ms);
    return check_outputs(checks, expected_, outputs);
  }

  const Op& op_;
  const Problem& p_;
  const TensorMap& expected_;
  std::optional<Contract> declared_;
  const PartialContract& partial_;
  Timings& timings_;
  PreparedCases* prepared_ = nullptr;
  std::string id_, expected_key_;
  std::deque<std::pair<Contract, std::vector<OutputCheck>>> derived_;  // stable references
};

// V12b: `launches` more launches of `p`, launch i with poison pattern i % 4, an L2 flush on odd i
// and concurrent work on every third (where the library offers them); every output is compared
// bitwise with the first launch's. A declared-deterministic kernel fails on any difference; every
// kernel fails when a stress launch fails the checks.
void stress_launches(Result& r, const Op& op, const Problem& p, const TensorMap& first,
                     ContractJudge& judge, bool& declared_used, const DeviceRunner& device,
                     int launches, std::vector<std::string>& problems) {
  StressStats st;
  const bool flush = device.can_flush_l2(), background = device.can_run_background();
  st.conditions = std::string("shared-memory poison 0x7FFF7FFF / 0xFFFFFFFF / 0x7FC07FC0 / off") +
                  (flush ? ", L2 flushed before every 2nd launch" : ", no L2 flush (library)") +
                  (background ? ", concurrent work on another stream in every 3rd"
                              : ", no concurrent work (library)");
  std::string first_failure;
  {
    for (int i = 0; i < launches; ++i) {
      LaunchConditions when;
      when.smem_poison = kStressPoisons[i % 4];
      when.flush_l2 = flush && i % 2 == 1;
      when.background_us = background && i % 3 == 2 ? 200 : 0;
      const std::string which = "stress launch " + std::to_string(i + 1) + " (poison " +
                                kStressPoisons[i % 4] + (when.flush_l2 ? ", L2 flushed" : "") +
                                (when.background_us ? ", concurrent work" : "") + ")";
      const auto again = device.run(p, when);
      if (again.status != ATTNCHECK_OK) {
        Result failed_launch = r;
        launch_failed(failed_launch, again, which + ": ");
        r.device_error = r.device_error || failed_launch.device_error;
        problems.push_back(failed_launch.message);
        break;
      }
      ++st.launches;
      for (const auto& v : again.violations) problems.push_back(which + ": " + v);
      bool differs = false;
      const PhaseClock clock(r.timings.compare_ms);
      for (const auto& [name, t] : first) {
        const auto cmp = compare_exact(name, t, again.outputs.at(name));
        if (cmp.passed) continue;
        if (!differs && st.first_difference.empty())
          st.first_difference = which + ": '" + name + "': " + cmp.message;
        differs = true;
      }
      st.differing += differs;
      if (!differs && op.deterministic()) continue;  // same bits as the checked first launch
      bool failed = false, declared = false;
      for (const auto& ch : judge.check(again.outputs, &declared)) {
        if (ch.passed) continue;
        if (first_failure.empty()) first_failure = which + ": " + ch.name + ": " + ch.message;
        failed = true;
      }
      st.failed += failed;
      declared_used = declared_used || declared;
    }
  }
  if (st.failed)
    problems.push_back("stress: " + std::to_string(st.failed) + " of " +
                       std::to_string(st.launches) +
                       " launches fail the checks; first: " + first_failure);
  if (op.deterministic() && st.differing)
    problems.push_back("not deterministic under stress: " + std::to_string(st.differing) + " of " +
                       std::to_string(st.launches) +
                       " launches differ bitwise from the first; first: " + st.first_difference);
  r.stress = st;
}

// The second launch, from flipped poison: elements neither launch wrote (they differ between
// the launches by construction), then the same outputs bitwise for a deterministic op, or within
// the budgets for a nondeterministic one.
void second_launch(Result& r, const Op& op, const Problem& p, const DeviceOutcome& o,
                   ContractJudge& judge, const DeviceRunner& device, bool& declared_used,
                   std::vector<std::string>& problems) {
  std::optional<PhaseClock> poison_clock(std::in_place, r.timings.guards_ms);
  const Problem q = with_flipped_poison(p);
  poison_clock.reset();
  const auto o2 = device.run(q);
  r.device_error = o2.status == ATTNCHECK_ERROR;
  if (o2.status != ATTNCHECK_OK) {
    Result second = r;
    launch_failed(second, o2, "second launch: ");
    problems.push_back(second.message);
    return;
  }
  for (const auto& v : o2.violations) problems.push_back("second launch: " + v);
  bool unwritten = false;
  poison_clock.emplace(r.timings.guards_ms);
  for (const auto& a : p.args) {
    if (a.role != Role::output || !o.outputs.count(a.name) || !o2.outputs.count(a.name)) continue;
    // Over the held rows: the outputs came back as those (a sparse output's, docs/abi.md).
    const auto u = unwritten_elements(a.name, a.tensor.held_rows(), o.outputs.at(a.name),
                                      q.arg(a.name).held_rows(), o2.outputs.at(a.name));
    if (!u.empty()) problems.push_back(u);
    unwritten = unwritten || !u.empty();
  }
  poison_clock.reset();
  if (unwritten) return;
  if (op.deterministic()) {
    const PhaseClock clock(r.timings.compare_ms);
    for (const auto& [name, t] : o.outputs) {
      const auto cmp = compare_exact(name, t, o2.outputs.at(name));
      if (!cmp.passed)
        problems.push_back("not deterministic: launch 2 of '" + name + "': " + cmp.message);
    }
  } else {
    bool declared = false;
    for (const auto& ch : judge.check(o2.outputs, &declared))
      if (!ch.passed) problems.push_back("launch 2: " + ch.name + ": " + ch.message);
    declared_used = declared_used || declared;
  }
}

// Launches 3..repeat start from the first poison and must repeat the first launch bitwise.
void repeat_launches(Result& r, const Op& op, const Problem& p, const DeviceOutcome& o,
                     const DeviceRunner& device, int repeat, std::vector<std::string>& problems) {
  for (int i = 2; problems.empty() && i < repeat && op.deterministic(); ++i) {
    const auto again = device.run(p);
    if (again.status != ATTNCHECK_OK) {
      Result later = r;
      launch_failed(later, again, "launch " + std::to_string(i + 1) + ": ");
      r.device_error = later.device_error;
      problems.push_back(later.message);
      break;
    }
    const PhaseClock clock(r.timings.compare_ms);
    for (const auto& [name, t] : o.outputs) {
      const auto cmp = compare_exact(name, t, again.outputs.at(name));
      if (!cmp.passed) {
        problems.push_back("not deterministic: launch " + std::to_string(i + 1) + " of '" + name +
                           "': " + cmp.message);
        break;
      }
    }
  }
}

// The contract whose budgets the checks hold, and what it means for the verdict's message: a pass
// under the declared contract says so (and whether the default's budgets fail); a first launch
// that failed says which known contract its error would fit.
void contract_message(Result& r, ContractJudge& judge, const DeviceOutcome& o, bool passed,
                      bool declared_used, const std::string& default_failures,
                      bool first_checks_failed) {
  const Contract& declared = judge.declared();
  const std::string default_name(kDefaultContractName);
  r.contract = declared_used ? declared.name() : default_name;
  if (passed && declared_used) {
    r.message =
        "passed under declared contract " + declared.name() + ": all checks within its budgets" +
        (default_failures.empty()
             ? ""
             : " (the default " + default_name + " budgets fail: " + default_failures + ")");
  } else if (first_checks_failed) {
    const auto fits = judge.explaining(o.outputs);
    const std::string hint = fits ? "the error would fit contract " + fits->name()
                                  : std::string("no known contract explains it");
    r.message = (declared.is_default()
                     ? "fails its declared contract " + default_name + " (the default); " + hint
                     : "fails its declared contract " + declared.name() + " and the default " +
                           default_name + "; " + hint) +
                ": " + r.message;
  }
}

// Kernel launches and checks for a valid problem: the first launch against the expected outputs,
// the second from flipped poison (never-written elements, determinism), further repeats bitwise.
void judge_kernel(Result& r, const Op& op, const Problem& p, ContractJudge& judge,
                  const DeviceRunner& device, const RunOptions& opt, CaseArtifacts* artifacts) {
  const auto o = device.run(p);
  r.timings.kernel_ms = o.wall_ms;
  if (o.status == ATTNCHECK_UNSUPPORTED) {
    r.mode = Mode::none;
    r.verdict = Verdict::unsupported;
    r.message = o.message;
    return;
  }
  if (o.status != ATTNCHECK_OK) return launch_failed(r, o, "");
  if (artifacts) artifacts->actual = o.outputs;
  bool declared_used = false;  // some launch needed the declared contract's budgets
  std::string default_failures;
  r.checks = judge.check(o.outputs, &declared_used, &default_failures);
  const bool first_checks_failed = !all_passed(r.checks);
  std::vector<std::string> problems = o.violations;
  for (const auto& ch : r.checks)
    if (!ch.passed) problems.push_back(ch.name + ": " + ch.message);

  if (opt.repeat >= 2) second_launch(r, op, p, o, judge, device, declared_used, problems);
  repeat_launches(r, op, p, o, device, opt.repeat, problems);
  if (opt.invariance && problems.empty())  // the op's relations (run/invariance.h)
    check_invariance(r, op, p, judge.expected(), o.outputs,
                     judge.applies() ? std::optional(judge.declared()) : std::nullopt, device,
                     problems);
  if (opt.stress > 0)
    stress_launches(r, op, p, o.outputs, judge, declared_used, device, opt.stress, problems);
  // Graph replay (run/graph_replay.h), for ops that declare mutable metadata.
  GraphReplayOutcome graph;
  if (!r.device_error)
    graph =
        graph_replay_step(op, p, device, [&](const TensorMap& out) { return judge.check(out); });
  if (graph.kind == GraphReplayOutcome::Kind::failed) problems.push_back(graph.message);
  r.device_error = r.device_error || graph.device_error;
  r.verdict = problems.empty() ? Verdict::passed : Verdict::failed;
  r.message = problems.empty() ? "all checks within budget" : join(problems);
  if (problems.empty() && graph.kind != GraphReplayOutcome::Kind::not_declared)
    r.message += "; " + graph.message;
  if (judge.applies())
    contract_message(r, judge, o, problems.empty(), declared_used, default_failures,
                     first_checks_failed);
}

// The one refusal branch (both modes): the configuration is invalid by the op's invalid() (asked
// once, in Op::problem), or the golden records it so. A kernel must refuse it; in reference mode
// the golden must record it as invalid too. The reference is never asked: it does not decide
// validity.
void judge_refusal(Result& r, const Problem& p, const std::optional<GoldenCase>& golden,
                   const EvalContext& ctx) {
  std::vector<std::string> problems;
  if (!ctx.device) {
    const std::string not_checked = "; kernel not checked: " + ctx.no_kernel_reason;
    if (!golden) {
      r.verdict = Verdict::skipped;
      r.message = "nothing compared: no golden for this case; invalid configuration (" +
                  p.expect_refusal.value_or("") + ")" + not_checked;
      return;
    }
    r.mode = Mode::reference;
    r.expected_from = "golden";
    const std::string digests = digest_difference(golden->input_digests, input_digests(p));
    if (!digests.empty())
      problems.push_back("inputs differ from those the golden was computed from (" + digests +
                         "): the input generator changed; regenerate the golden deliberately");
    if (p.expect_refusal.has_value() != golden->expect_refusal.has_value())
      problems.push_back(!p.expect_refusal
                             ? "the golden marks this case invalid, the op now accepts it"
                             : "the op now marks this case invalid, the golden holds outputs");
    r.verdict = problems.empty() ? Verdict::refused_as_expected : Verdict::failed;
    r.message = problems.empty() ? "invalid configuration (" + p.expect_refusal.value_or("") +
                                       "), as the golden records" + not_checked
                                 : join(problems);
    return;
  }
  const auto o = ctx.device->run(p);
  r.timings.kernel_ms = o.wall_ms;
  if (o.status == ATTNCHECK_REFUSED || o.status == ATTNCHECK_UNSUPPORTED) {
    r.verdict = o.violations.empty() ? Verdict::refused_as_expected : Verdict::failed;
    r.message = o.violations.empty() ? "refused: " + o.message
                                     : "refused, but wrote: " + join(o.violations);
  } else if (o.status == ATTNCHECK_OK) {
    r.verdict = Verdict::failed;
    r.message = "kernel ran an invalid configuration (" + p.expect_refusal.value_or("") + ")";
  } else {
    launch_failed(r, o, "instead of refusing: ");
  }
}

// The adapter's name when `lib` is a Python adapter (`py:NAME` or `py:DIR/NAME.py`), else "".
std::string adapter_name(const KernelLibrary& lib) {
  const std::string& path = lib.path();
  if (path.rfind("py:", 0) != 0) return "";
  std::string name = path.substr(3);
  if (const auto slash = name.find_last_of('/'); slash != std::string::npos)
    name = name.substr(slash + 1);
  if (name.size() > 3 && name.ends_with(".py")) name.resize(name.size() - 3);
  return name;
}

// A Python adapter implements the ops it chooses (docs/bridge.md): a case of an entry it lacks
// is not provided (unsupported, summed up once per op), never a failure. A native library that
// lacks an entry fails the case instead: a build that dropped one must never pass. Whether the
// case was marked so.
bool not_provided(Result& r, const KernelLibrary& lib, const std::string& op,
                  const std::string& entry) {
  const std::string adapter = adapter_name(lib);
  if (adapter.empty()) return false;
  r.mode = Mode::none;
  r.verdict = Verdict::unsupported;
  r.not_provided_by = adapter;
  r.message = "not provided by " + adapter + ": the adapter has no entry '" + entry + "' (op " +
              op + "; entries: " + join(lib.entries()) + ")";
  return true;
}

void evaluate_kernel(Result& r, const Op& op, const Case& c, const Problem& p,
                     const std::optional<GoldenCase>& golden, const EvalContext& ctx,
                     CaseArtifacts* artifacts) {
  const KernelLibrary& lib = ctx.device->library();
  if (!lib.has_entry(p.kernel)) {
    if (not_provided(r, lib, c.op, p.kernel)) return;
    r.mode = Mode::none;
    r.verdict = Verdict::failed;
    r.message = "not run: the kernel library " + lib.library() + " has no entry '" + p.kernel +
                "' (op " + c.op + ")";
    return;
  }
  // The entry's partial contract; a declaration the op cannot have is the library's error.
  PartialContract partial;
  try {
    partial = entry_partial(lib, p.kernel, op);
  } catch (const PartialContractError& e) {
    r.verdict = Verdict::error;
    r.message = e.what();
    return;
  }
  // The entry's arithmetic contract; an unknown name is the library's error, whatever the op.
  const std::string declared_name = lib.declared_contract(p.kernel);
  const auto declared = declared_name.empty() ? Contract{} : parse_contract(declared_name);
  if (!declared) {
    r.verdict = Verdict::error;
    r.message = "kernel library " + lib.library() + ": entry '" + p.kernel +
                "' declares unknown arithmetic contract '" + declared_name +
                "' (known: " + known_contract_names() + ")";
    return;
  }
  r.mode = Mode::kernel;
  if (p.expect_refusal) return judge_refusal(r, p, golden, ctx);

  TensorMap expected;
  bool golden_fits = false;
  if (ctx.golden_as_expected && golden && !golden->expect_refusal) {
    const PhaseClock clock(r.timings.golden_ms);  // the inputs' digests against the golden's
    golden_fits = golden->input_digests == input_digests(p);
  }
  if (golden_fits) {
    expected = golden->outputs;
    r.expected_from = "golden";
  } else {
    const PhaseClock clock(r.timings.reference_ms);
    expected = op.reference(p);
    r.expected_from = "reference";
  }
  if (!partial.empty()) {
    settle_expected(partial, op, p, expected);
    r.partial = partial.to_json();
  }
  if (artifacts) artifacts->expected = expected;
  ContractJudge judge(op, p, expected,
                      op.contract_dependent() ? declared : std::optional<Contract>(), partial,
                      r.timings);
  judge.keep_in(ctx.prepared, c.id,
                r.expected_from + (partial.empty() ? "" : " " + partial.to_json().dump()));
  judge_kernel(r, op, p, judge, *ctx.device, ctx.options, artifacts);
  if (!partial.empty() && r.mode == Mode::kernel)
    r.message += " [judged under the entry's partial contract: " + partial.describe() + "]";
}

void evaluate_reference(Result& r, const Op& op, const Case& c, const Problem& p,
                        const std::optional<GoldenCase>& golden, const EvalContext& ctx,
                        CaseArtifacts* artifacts) {
  const std::string not_checked = "; kernel not checked: " + ctx.no_kernel_reason;
  if (!golden) {
    const bool golden_tier = c.in_tier("smoke") || c.in_tier("quick");
    if (golden_tier && ctx.require_goldens) {
      r.verdict = Verdict::error;
      r.message =
          "no golden for this case in " +
          (ctx.goldens ? ctx.goldens->path_of(c.op) : std::string("(no golden directory)")) +
          " (run `attncheck golden generate --op " + c.op +
          "`, or pass --allow-missing-goldens to run the reference with nothing to "
          "compare)";
      return;
    }
    // Reference vs nothing: the reference and its budgets must still run without error.
    const std::string ran = "the reference and its budgets ran without error";
    std::optional<PhaseClock> clock(std::in_place, r.timings.reference_ms);
    const TensorMap now = op.reference(p);
    clock.emplace(r.timings.budgets_ms);
    (void)op.checks(p, now);
    clock.reset();
    if (artifacts) artifacts->actual = now;
    r.verdict = Verdict::skipped;
    r.message = std::string("nothing compared: no golden for this case") +
                (golden_tier ? "" : " (goldens cover the smoke and quick tiers)") + "; " + ran +
                not_checked;
    return;
  }

  r.mode = Mode::reference;
  r.expected_from = "golden";
  if (artifacts) artifacts->expected = golden->outputs;
  std::vector<std::string> problems;
  std::optional<PhaseClock> clock(std::in_place, r.timings.golden_ms);
  const std::string digests = digest_difference(golden->input_digests, input_digests(p));
  if (!digests.empty())
    problems.push_back("inputs differ from those the golden was computed from (" + digests +
                       "): the input generator changed; regenerate the golden deliberately");
  clock.emplace(r.timings.reference_ms);
  const TensorMap now = op.reference(p);
  clock.emplace(r.timings.compare_ms);
  if (artifacts) artifacts->actual = now;
  r.checks = compare_with_golden(*golden, now, problems);
  clock.reset();
  for (const auto& ch : r.checks)
    if (!ch.passed) problems.push_back("reference drift: " + ch.name + ": " + ch.message);
  r.verdict = problems.empty() ? Verdict::passed : Verdict::failed;
  r.message = problems.empty() ? "reference matches the golden" + not_checked : join(problems);
}

}  // namespace

std::string repro_command(const Case& c, const RunOptions& opt) {
  std::string cmd = "attncheck repro '" + c.id + "'";
  if (!opt.kernels_path.empty()) cmd += " --kernels " + opt.kernels_path;
  return cmd + opt.repro_extra;
}

Problem with_flipped_poison(const Problem& p) {
  Problem q = p;
  std::map<const Storage*, std::shared_ptr<Storage>> copies;
  for (const auto& a : p.args)
    if (a.role == Role::output && !copies.count(a.tensor.storage().get()))
      copies[a.tensor.storage().get()] = std::make_shared<Storage>(*a.tensor.storage());
  for (auto& a : q.args) {
    const auto it = copies.find(a.tensor.storage().get());
    if (it != copies.end()) a.tensor = a.tensor.rebased(it->second);
  }
  for (auto& a : q.args) {
    if (a.role != Role::output) continue;
    const int bits = static_cast<int>(a.tensor.element_size() * 8);
    const uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    const Tensor held = a.tensor.held_rows();  // a sparse output: the host holds these only
    held.for_each_index(
        [&](const Index& idx, int64_t) { held.set_bits(idx, ~held.get_bits(idx) & mask); });
  }
  return q;
}

std::vector<CheckResult> check_outputs(const std::vector<OutputCheck>& checks,
                                       const TensorMap& expected, const TensorMap& actual) {
  std::vector<CheckResult> out;
  for (const auto& chk : checks) {
    const auto e = expected.find(chk.name);
    const auto a = actual.find(chk.name);
    if (e == expected.end() || a == actual.end()) {
      CheckResult r;
      r.name = chk.name;
      r.budget = chk.budget;
      r.message = std::string("output '") + chk.name + "' missing from " +
                  (e == expected.end() ? "expected" : "actual");
      out.push_back(r);
      continue;
    }
    if (chk.budget.kind == Budget::Kind::topk_set)
      out.push_back(compare_topk(chk.name, e->second, a->second, chk.topk_values,
                                 chk.topk_row_offsets, chk.budget));
    else
      out.push_back(compare(chk.name, e->second, a->second, chk.budget));
  }
  return out;
}

std::vector<std::string> sanitizer_findings(const std::string& report) {
  static constexpr std::string_view kTool = "========= ";
  static constexpr std::string_view kFindings[] = {
      "Invalid ",      "Error",      "Uninitialized ", "Barrier error", "Program hit ",
      "Race reported", "Malformed ", "Misaligned ",    "Out-of-range ", "Address "};
  std::vector<std::string> out;
  std::istringstream in(report);
  for (std::string line; std::getline(in, line);) {
    const std::string_view l(line);
    if (!l.starts_with(kTool)) continue;
    for (const auto f : kFindings)
      if (l.substr(kTool.size()).starts_with(f)) {
        out.push_back(line.substr(kTool.size()));
        break;
      }
  }
  return out;
}

void apply_sanitizer_report(Result& r, const std::string& report, const std::string& tool,
                            const std::string& path) {
  const auto found = sanitizer_findings(report);
  if (found.empty()) return;
  const std::string what = "compute-sanitizer " + tool + ": " + std::to_string(found.size()) +
                           " finding(s); first: " + found.front() + " (report: " + path + ")";
  if (r.verdict == Verdict::passed || r.verdict == Verdict::refused_as_expected ||
      r.verdict == Verdict::unexpected_pass) {
    r.verdict = Verdict::failed;
    r.message = what;
  } else {
    r.message = what + "; " + r.message;
  }
}

namespace {

// The launches' share of the case's time (the device runner's clocks), and the rest of `total_ms`
// as "other".
void complete_timings(Timings& t, const DeviceRunner* device, double total_ms) {
  if (device) {
    const LaunchTimings l = device->take_timings();
    t.upload_ms += l.upload_ms;
    t.relaunch_ms += std::max(0.0, l.launch_ms - t.kernel_ms);
    t.download_ms += l.download_ms;
    t.guards_ms += l.guards_ms;
    t.locked_ms += l.locked_ms;
    t.launches += l.launches;
  }
  t.other_ms = 0;
  t.ipc_ms = 0;
  t.other_ms = std::max(0.0, total_ms - t.total_ms());
}

Result evaluate_timed(const Case& c, const EvalContext& ctx, CaseArtifacts* artifacts);

}  // namespace

Result evaluate(const Case& c, const EvalContext& ctx, CaseArtifacts* artifacts) {
  const auto t0 = Clock::now();
  if (ctx.device) (void)ctx.device->take_timings();  // nothing of an earlier case
  Result r = evaluate_timed(c, ctx, artifacts);
  complete_timings(r.timings, ctx.device, ms_since(t0));
  return r;
}

namespace {

bool none_provided(const Op& op, const KernelLibrary& lib) {
  const auto entries = op.kernel_entries();
  return std::none_of(entries.begin(), entries.end(),
                      [&](const std::string& e) { return lib.has_entry(e); });
}

Result evaluate_timed(const Case& c, const EvalContext& ctx, CaseArtifacts* artifacts) {
  Result r = skeleton(c, ctx.options);
  const Op* op = find_op(c.op);
  if (!op) {
    r.verdict = Verdict::error;
    r.message = "op '" + c.op + "' is not registered in this attncheck";
    return r;
  }
  if (ctx.device && none_provided(*op, ctx.device->library()) &&
      not_provided(r, ctx.device->library(), c.op, join(op->kernel_entries(), "', '"))) {
    r.kernel_entry = op->kernel_entries().front();
    return r;  // no inputs made for a case no entry can run
  }
  try {
    const auto t0 = Clock::now();
    const Problem p =
        ctx.prepared ? ctx.prepared->problem(c, [&] { return op->problem(c); }) : op->problem(c);
    r.timings.generate_ms = ms_since(t0);
    r.kernel_entry = p.kernel;
    if (artifacts) {
      artifacts->present = true;
      artifacts->problem = p;
    }
    std::optional<GoldenCase> golden;
    if (ctx.goldens) {
      const PhaseClock clock(r.timings.golden_ms);
      try {
        golden = ctx.goldens->load(c.op, c.id);
      } catch (const std::exception& e) {
        r.verdict = Verdict::error;
        r.message = std::string("cannot read the golden: ") + e.what();
        return r;
      }
    }
    if (!ctx.device && (p.expect_refusal || (golden && golden->expect_refusal)))
      judge_refusal(r, p, golden, ctx);
    else if (ctx.device) {
      evaluate_kernel(r, *op, c, p, golden, ctx, artifacts);
      if (r.mode == Mode::kernel) apply_known_bug(r, c);
    } else {
      evaluate_reference(r, *op, c, p, golden, ctx, artifacts);
    }
  } catch (const InvalidConfig& e) {
    r.verdict = Verdict::failed;
    r.message = std::string("reference refused a case not marked invalid: ") + e.what();
  } catch (const std::exception& e) {
    // The harness's own code (generator, reference, comparison) failed: not the device.
    r.verdict = Verdict::error;
    r.message = e.what();
  }
  return r;
}

}  // namespace

Result lost_case_result(const Case& c, Mode mode, const RunOptions& opt, const std::string& what) {
  Result r = skeleton(c, opt);
  r.mode = mode;
  r.verdict = mode == Mode::kernel ? Verdict::failed : Verdict::error;
  r.message = what;
  if (mode == Mode::kernel) apply_known_bug(r, c);
  return r;
}

}  // namespace attncheck
