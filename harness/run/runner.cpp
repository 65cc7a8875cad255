#include "runner.h"

#include <chrono>
#include <cmath>
#include <map>
#include <regex>

namespace attncheck {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
bool known_bug_applies(const Case& c, const std::string& arch) {
  if (!c.known_bug) return false;
  if (c.known_bug->arch.empty()) return true;
  return std::regex_search(arch, std::regex(c.known_bug->arch));
}
nlohmann::json metrics_json(const Metrics& m) {
  nlohmann::json j = {{"count", m.count},
                      {"mismatches", m.mismatches},
                      {"mismatch_frac", m.mismatch_frac},
                      {"max_abs", m.max_abs},
                      {"max_rel", m.max_rel},
                      {"rel_l2", m.rel_l2},
                      {"calc_diff", m.calc_diff},
                      {"cosine", m.cosine},
                      {"nan_actual", m.nan_actual},
                      {"nan_expected", m.nan_expected},
                      {"inf_actual", m.inf_actual},
                      {"neginf_mask_mismatch", m.neginf_mask_mismatch},
                      {"max_ulp", m.max_ulp},
                      {"bit_mismatches", m.bit_mismatches},
                      {"topk_missing", m.topk_missing},
                      {"topk_invalid", m.topk_invalid}};
  if (!m.worst.index.empty())
    j["worst"] = {{"index", m.worst.index},
                  {"expected", m.worst.expected},
                  {"actual", m.worst.actual},
                  {"abs_err", m.worst.abs_err},
                  {"ratio", m.worst.ratio}};
  // JSON has no NaN/inf: store them as strings so the record stays parseable.
  for (auto& [k, v] : j.items())
    if (v.is_number_float()) v = json_number(v.get<double>());
  if (j.contains("worst"))
    for (auto& [k, v] : j["worst"].items())
      if (v.is_number_float()) v = json_number(v.get<double>());
  return j;
}
std::string_view kind_name(Budget::Kind k) {
  switch (k) {
    case Budget::Kind::numeric:
      return "numeric";
    case Budget::Kind::exact:
      return "exact";
    case Budget::Kind::topk_set:
      return "topk_set";
  }
  return "?";
}
}  // namespace

nlohmann::json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::passed:
      return "passed";
    case Verdict::failed:
      return "failed";
    case Verdict::refused_as_expected:
      return "refused_as_expected";
    case Verdict::known_bug:
      return "known_bug";
    case Verdict::unexpected_pass:
      return "unexpected_pass";
    case Verdict::skipped:
      return "skipped";
    case Verdict::error:
      return "error";
  }
  return "?";
}
bool verdict_is_failure(Verdict v) {
  return v == Verdict::failed || v == Verdict::error;
}

nlohmann::json Result::to_json() const {
  nlohmann::json checks_j = nlohmann::json::array();
  for (const auto& c : checks) {
    nlohmann::json b = {{"kind", kind_name(c.budget.kind)},
                        {"atol", json_number(c.budget.atol)},
                        {"rtol", json_number(c.budget.rtol)},
                        {"max_mismatch_frac", json_number(c.budget.max_mismatch_frac)},
                        {"max_calc_diff", json_number(c.budget.max_calc_diff)},
                        {"why", c.budget.why}};
    checks_j.push_back({{"name", c.name},
                        {"passed", c.passed},
                        {"message", c.message},
                        {"budget", b},
                        {"metrics", metrics_json(c.metrics)}});
  }
  nlohmann::json j = {{"id", id},
                      {"op", op},
                      {"params", params},
                      {"verdict", verdict_name(verdict)},
                      {"mode", mode},
                      {"message", message},
                      {"checks", checks_j},
                      {"timings_ms",
                       {{"generate", timings.generate_ms},
                        {"reference", timings.reference_ms},
                        {"kernel", timings.kernel_ms}}},
                      {"arch", arch},
                      {"repro", repro}};
  if (device_error) j["device_error"] = true;
  return j;
}

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
    a.tensor.for_each_index(
        [&](const Index& idx, int64_t) { a.tensor.set_bits(idx, ~a.tensor.get_bits(idx) & mask); });
  }
  return q;
}

namespace {
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
}  // namespace

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

namespace {
Result run_case_unmarked(const Op& op, const Case& c, const DeviceRunner* device,
                         const RunOptions& opt, const TensorMap* expected_override,
                         CaseArtifacts* artifacts) {
  Result r;
  r.id = c.id;
  r.op = c.op;
  r.params = c.params;
  r.arch = opt.arch;
  r.repro = repro_command(c, opt);
  r.mode = device ? "kernel" : (expected_override ? "reference" : "none");
  try {
    auto t0 = std::chrono::steady_clock::now();
    Problem p = op.make(c);
    if (p.kernel.empty()) p.kernel = op.name();
    r.timings.generate_ms = ms_since(t0);
    if (artifacts) artifacts->problem = p;

    if (!p.expect_refusal.empty()) {
      // Invalid configuration: the reference must refuse it, and so must the kernel.
      try {
        (void)op.reference(p);
        r.verdict = Verdict::failed;
        r.message = "reference accepted an invalid configuration (" + p.expect_refusal + ")";
        return r;
      } catch (const InvalidConfig&) {
      }
      if (!device) {
        r.verdict = Verdict::refused_as_expected;
        r.message = "reference refused: " + p.expect_refusal + "; kernel not checked (no device)";
        return r;
      }
      const auto o = device->run(p);
      r.device_error = o.status == ATTNCHECK_ERROR;
      if (o.status == ATTNCHECK_REFUSED) {
        r.verdict = Verdict::refused_as_expected;
        r.message = "refused: " + o.message;
      } else {
        r.verdict = Verdict::failed;
        r.message = o.status == ATTNCHECK_OK
                        ? "kernel ran an invalid configuration (" + p.expect_refusal + ")"
                        : "kernel failed instead of refusing: " + o.message;
      }
      return r;
    }

    t0 = std::chrono::steady_clock::now();
    const TensorMap expected = expected_override ? *expected_override : op.reference(p);
    r.timings.reference_ms = ms_since(t0);
    if (artifacts) artifacts->expected = expected;
    const auto checks = op.checks(p, expected);

    if (!device) {
      r.verdict = Verdict::skipped;
      r.message = "kernel checks skipped: no device";
      return r;
    }
    const auto o = device->run(p);
    r.timings.kernel_ms = o.wall_ms;
    if (artifacts) artifacts->actual = o.outputs;
    r.device_error = o.status == ATTNCHECK_ERROR;
    if (o.status != ATTNCHECK_OK) {
      r.verdict = Verdict::failed;
      r.message = (o.status == ATTNCHECK_REFUSED ? "kernel refused a valid configuration: "
                                                 : "kernel error: ") +
                  o.message;
    } else {
      r.checks = check_outputs(checks, expected, o.outputs);
      std::vector<std::string> problems = o.violations;
      for (const auto& ch : r.checks)
        if (!ch.passed) problems.push_back(ch.name + ": " + ch.message);
      if (opt.repeat >= 2) {
        // Second launch from the complemented poison: never-written elements and nondeterminism.
        const Problem q = with_flipped_poison(p);
        const auto o2 = device->run(q);
        r.device_error = o2.status == ATTNCHECK_ERROR;
        if (o2.status != ATTNCHECK_OK) {
          problems.push_back("second launch: status " + std::to_string(o2.status) + ": " +
                             o2.message);
        } else {
          for (const auto& v : o2.violations) problems.push_back("second launch: " + v);
          bool unwritten = false;
          for (const auto& a : p.args) {
            if (a.role != Role::output || !o.outputs.count(a.name) || !o2.outputs.count(a.name))
              continue;
            const auto u = unwritten_elements(a.name, a.tensor, o.outputs.at(a.name), q.arg(a.name),
                                              o2.outputs.at(a.name));
            if (!u.empty()) problems.push_back(u);
            unwritten = unwritten || !u.empty();
          }
          // Unwritten elements differ between the launches by construction: not nondeterminism.
          if (!unwritten && op.deterministic()) {
            for (const auto& [name, t] : o.outputs) {
              const auto cmp = compare_exact(name, t, o2.outputs.at(name));
              if (!cmp.passed)
                problems.push_back("not deterministic: launch 2 of '" + name + "': " + cmp.message);
            }
          } else if (!unwritten) {
            for (const auto& ch : check_outputs(checks, expected, o2.outputs))
              if (!ch.passed) problems.push_back("launch 2: " + ch.name + ": " + ch.message);
          }
        }
      }
      // Launches 3..repeat start from the first poison and must repeat the first launch bitwise.
      for (int i = 2; problems.empty() && i < opt.repeat && op.deterministic(); ++i) {
        const auto again = device->run(p);
        for (const auto& [name, t] : o.outputs) {
          const auto cmp = compare_exact(name, t, again.outputs.at(name));
          if (!cmp.passed) {
            problems.push_back("not deterministic: launch " + std::to_string(i + 1) + " of '" +
                               name + "': " + cmp.message);
            break;
          }
        }
      }
      std::string msg;
      for (const auto& m : problems) msg += (msg.empty() ? "" : "; ") + m;
      r.verdict = problems.empty() ? Verdict::passed : Verdict::failed;
      r.message = problems.empty() ? "all checks within budget" : msg;
    }
  } catch (const InvalidConfig& e) {
    r.verdict = Verdict::failed;
    r.message = std::string("reference refused a case not marked invalid: ") + e.what();
  } catch (const std::exception& e) {
    r.verdict = Verdict::error;
    r.message = e.what();
    r.device_error = device != nullptr;
  }
  return r;
}
}  // namespace

void apply_known_bug(Result& r, const Case& c, const std::string& arch) {
  if (!known_bug_applies(c, arch)) return;
  if (r.verdict == Verdict::failed) {
    r.verdict = Verdict::known_bug;
    r.message = "known bug (" + c.known_bug->reason + "): " + r.message;
  } else if (r.verdict == Verdict::passed || r.verdict == Verdict::refused_as_expected) {
    r.verdict = Verdict::unexpected_pass;
    r.message = "passed although marked known bug (" + c.known_bug->reason + "): " + r.message;
  }
}

Result run_case(const Op& op, const Case& c, const DeviceRunner* device, const RunOptions& opt,
                const TensorMap* expected_override, CaseArtifacts* artifacts) {
  Result r = run_case_unmarked(op, c, device, opt, expected_override, artifacts);
  // Known bugs are kernel bugs: reference-only runs are not marked.
  if (device) apply_known_bug(r, c, opt.arch);
  return r;
}

}  // namespace attncheck
