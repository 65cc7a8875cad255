#include "runner.h"

#include <chrono>
#include <cmath>
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
    if (v.is_number_float() && !std::isfinite(v.get<double>())) v = std::to_string(v.get<double>());
  if (j.contains("worst"))
    for (auto& [k, v] : j["worst"].items())
      if (v.is_number_float() && !std::isfinite(v.get<double>()))
        v = std::to_string(v.get<double>());
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
                        {"atol", c.budget.atol},
                        {"rtol", c.budget.rtol},
                        {"max_mismatch_frac", c.budget.max_mismatch_frac},
                        {"max_calc_diff", c.budget.max_calc_diff},
                        {"why", c.budget.why}};
    checks_j.push_back({{"name", c.name},
                        {"passed", c.passed},
                        {"message", c.message},
                        {"budget", b},
                        {"metrics", metrics_json(c.metrics)}});
  }
  return {{"id", id},
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
}

std::string repro_command(const Case& c, const RunOptions& opt) {
  std::string cmd = "attncheck repro '" + c.id + "'";
  if (!opt.kernels_path.empty()) cmd += " --kernels " + opt.kernels_path;
  return cmd;
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

Result run_case(const Op& op, const Case& c, const DeviceRunner* device, const RunOptions& opt,
                const TensorMap* expected_override) {
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
    const auto checks = op.checks(p, expected);

    if (!device) {
      r.verdict = Verdict::skipped;
      r.message = "kernel checks skipped: no device";
      return r;
    }
    const auto o = device->run(p);
    r.timings.kernel_ms = o.wall_ms;
    if (o.status != ATTNCHECK_OK) {
      r.verdict = Verdict::failed;
      r.message = (o.status == ATTNCHECK_REFUSED ? "kernel refused a valid configuration: "
                                                 : "kernel error: ") +
                  o.message;
    } else {
      r.checks = check_outputs(checks, expected, o.outputs);
      bool ok = o.violations.empty();
      for (const auto& ch : r.checks) ok = ok && ch.passed;
      std::string msg;
      for (const auto& v : o.violations) msg += (msg.empty() ? "" : "; ") + v;
      for (const auto& ch : r.checks)
        if (!ch.passed) msg += (msg.empty() ? "" : "; ") + ch.name + ": " + ch.message;
      // Repeats: declared-deterministic kernels must give identical bytes.
      for (int i = 1; ok && i < opt.repeat && op.deterministic(); ++i) {
        const auto again = device->run(p);
        for (const auto& [name, t] : o.outputs) {
          const auto cmp = compare_exact(name, t, again.outputs.at(name));
          if (!cmp.passed) {
            ok = false;
            msg += "not deterministic: repeat " + std::to_string(i) + " of '" + name +
                   "': " + cmp.message;
            break;
          }
        }
      }
      r.verdict = ok ? Verdict::passed : Verdict::failed;
      r.message = ok ? "all checks within budget" : msg;
    }
  } catch (const InvalidConfig& e) {
    r.verdict = Verdict::failed;
    r.message = std::string("reference refused a case not marked invalid: ") + e.what();
  } catch (const std::exception& e) {
    r.verdict = Verdict::error;
    r.message = e.what();
  }
  if (known_bug_applies(c, opt.arch)) {
    if (r.verdict == Verdict::failed) {
      r.verdict = Verdict::known_bug;
      r.message = "known bug (" + c.known_bug->reason + "): " + r.message;
    } else if (r.verdict == Verdict::passed) {
      r.verdict = Verdict::unexpected_pass;
      r.message = "passed although marked known bug: " + c.known_bug->reason;
    }
  }
  return r;
}

}  // namespace attncheck
