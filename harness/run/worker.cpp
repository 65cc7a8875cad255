#include "worker.h"

#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "run/pool.h"
#include "run/results.h"

namespace attncheck {

CaseContext make_context(const WorkerConfig& cfg) {
  CaseContext ctx;
  ctx.files = load_case_dir(cfg.cases_dir);
  ctx.goldens = std::make_unique<GoldenStore>(cfg.golden_dir);
  ctx.options.repeat = cfg.repeat;
  ctx.options.kernels_path = cfg.kernels;
  ctx.options.repro_extra = cfg.repro_extra;
  if (cfg.kernels.empty()) {
    ctx.no_device_reason = "no kernel library (pass --kernels or set ATTNCHECK_KERNELS)";
  } else {
    ctx.lib = KernelLibrary::open(cfg.kernels);
    std::string why;
    ctx.device = ctx.lib->device(&why);
    if (!ctx.device) ctx.no_device_reason = "no GPU: " + why;
  }
  ctx.arch = !cfg.arch.empty() ? cfg.arch : ctx.device ? ctx.device->arch : "";
  ctx.options.arch = ctx.arch;
  return ctx;
}

nlohmann::json CaseOutcome::to_json() const {
  nlohmann::json j = result.to_json();
  if (!expected_from.empty()) j["expected_from"] = expected_from;
  if (!kernel_skipped.empty()) j["kernel_skipped"] = kernel_skipped;
  return j;
}

CaseOutcome run_one(CaseContext& ctx, const Case& c) {
  CaseOutcome out;
  const Op* op = find_op(c.op);
  if (!op) {
    out.result.id = c.id;
    out.result.op = c.op;
    out.result.verdict = Verdict::error;
    out.result.message = "op '" + c.op + "' is not registered in this attncheck";
    return out;
  }
  std::optional<GoldenCase> golden;
  std::string golden_error;
  try {
    golden = ctx.goldens->load(c.op, c.id);
  } catch (const std::exception& e) {
    golden_error = e.what();
  }

  const bool kernel = ctx.device && ctx.lib->has_op(c.op);
  if (kernel) {
    DeviceRunner runner(*ctx.lib, ctx.arch);
    const TensorMap* expected = nullptr;
    out.expected_from = "reference";
    if (ctx.golden_as_expected && golden && golden->expect_refusal.empty()) {
      try {
        if (input_digests(op->make(c)) == golden->input_digests) {
          expected = &golden->outputs;
          out.expected_from = "golden";
        }
      } catch (const std::exception&) {
        // run_case reports the generator's error.
      }
    }
    out.result = run_case(*op, c, &runner, ctx.options, expected, &out.artifacts);
    out.has_artifacts = true;
    return out;
  }

  out.kernel_skipped = !ctx.lib      ? ctx.no_device_reason
                       : !ctx.device ? ctx.no_device_reason
                                     : "the kernel library has no '" + c.op + "' kernel";
  if (!golden_error.empty()) {
    out.result.id = c.id;
    out.result.op = c.op;
    out.result.params = c.params;
    out.result.mode = "reference";
    out.result.verdict = Verdict::error;
    out.result.message = "cannot read the golden: " + golden_error;
    out.result.repro = repro_command(c, ctx.options);
    return out;
  }
  if (golden) {
    out.result = verify_against_golden(*op, c, *golden, &out.artifacts);
    out.result.repro = repro_command(c, ctx.options);
    out.expected_from = "golden";
    out.has_artifacts = true;
  } else {
    out.result = run_case(*op, c, nullptr, ctx.options, nullptr, &out.artifacts);
    out.result.mode = "reference";
    if (out.result.verdict == Verdict::skipped)
      out.result.message = "no golden for this case: the reference ran (" +
                           std::to_string(static_cast<int64_t>(out.result.timings.reference_ms)) +
                           " ms) with nothing to compare against";
  }
  out.result.arch = ctx.arch;
  if (!verdict_is_failure(out.result.verdict))
    out.result.message += "; kernel not checked: " + out.kernel_skipped;
  return out;
}

nlohmann::json context_hello(const CaseContext& ctx) {
  nlohmann::json ops = nlohmann::json::array();
  if (ctx.lib)
    for (const Op* o : all_ops())
      if (ctx.lib->has_op(o->name())) ops.push_back(o->name());
  return {{"pid", ::getpid()},
          {"kernels", ctx.options.kernels_path},
          {"library", ctx.lib ? ctx.lib->library() : ""},
          {"device", ctx.device ? ctx.device->name : ""},
          {"device_arch", ctx.device ? ctx.device->arch : ""},
          {"arch", ctx.arch},
          {"ops", ops},
          {"no_device", ctx.device ? "" : ctx.no_device_reason}};
}

int worker_main(const WorkerConfig& cfg) {
  FILE* proto = claim_protocol_stdout();
  auto emit = [&](const nlohmann::json& j) {
    const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(s.data(), 1, s.size(), proto);
    std::fflush(proto);
  };
  CaseContext ctx;
  try {
    ctx = make_context(cfg);
  } catch (const std::exception& e) {
    emit({{"fatal", e.what()}});
    return 2;
  }
  emit({{"hello", context_hello(ctx)}});
  std::string id;
  while (std::getline(std::cin, id)) {
    while (!id.empty() && (id.back() == '\r' || id.back() == ' ')) id.pop_back();
    if (id.empty()) continue;
    const auto c = find_case(ctx.files, id);
    if (!c) {
      Result r;
      r.id = id;
      r.op = id.substr(0, id.find('/'));
      r.verdict = Verdict::error;
      r.message = "no case with id '" + id + "' in " + cfg.cases_dir;
      emit(r.to_json());
      continue;
    }
    CaseOutcome o = run_one(ctx, *c);
    nlohmann::json j = o.to_json();
    if (o.has_artifacts && !cfg.repro_dir.empty() && verdict_is_failure(o.result.verdict)) {
      const std::string path =
          (std::filesystem::path(cfg.repro_dir) / (id_to_filename(id) + ".h5")).string();
      try {
        write_repro_bundle(path, o.result, o.artifacts, context_hello(ctx));
        j["bundle"] = path;
      } catch (const std::exception& e) {
        j["bundle_error"] = e.what();
      }
    }
    emit(j);
    // A GPU fault can leave the context unusable for every later launch: end this worker, the
    // parent starts a fresh one for the next case.
    if (o.result.device_error) return 0;
  }
  return 0;
}

}  // namespace attncheck
