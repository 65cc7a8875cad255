#include "run/worker.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "run/pool.h"
#include "run/results.h"

namespace attncheck {

namespace fs = std::filesystem;

std::unique_ptr<CaseContext> make_context(const WorkerConfig& cfg) {
  auto ctx = std::make_unique<CaseContext>();
  ctx->files = load_case_dir(cfg.cases_dir);
  ctx->repro_dir = cfg.repro_dir;
  if (fs::is_directory(cfg.golden_dir))
    ctx->goldens = std::make_unique<GoldenStore>(cfg.golden_dir);
  else if (!cfg.allow_missing_goldens)
    throw std::runtime_error("golden directory '" + cfg.golden_dir +
                             "' does not exist (pass --golden DIR, or --allow-missing-goldens to "
                             "run without goldens)");
  EvalContext& e = ctx->eval;
  e.goldens = ctx->goldens.get();
  e.require_goldens = !cfg.allow_missing_goldens;
  e.options.repeat = cfg.repeat;
  e.options.stress = cfg.stress;
  e.options.kernels_path = cfg.kernels;
  e.options.repro_extra = cfg.repro_extra;
  if (cfg.kernels.empty()) {
    e.no_kernel_reason = "no kernel library (pass --kernels or set ATTNCHECK_KERNELS)";
  } else {
    ctx->lib = KernelLibrary::open(cfg.kernels);
    std::string why;
    ctx->device = ctx->lib->device(&why);
    if (!ctx->device) {
      const bool py = cfg.kernels.rfind("py:", 0) == 0;
      throw std::runtime_error(
          "--kernels " + cfg.kernels + (py ? ": the adapter cannot run (" : ": no usable GPU (") +
          (why.empty() ? std::string("the library gave no reason") : why) + ")");
    }
  }
  e.options.arch = !cfg.arch.empty() ? cfg.arch : ctx->device ? ctx->device->arch : "";
  if (ctx->device) {
    ctx->runner = std::make_unique<DeviceRunner>(*ctx->lib, e.options.arch);
    e.device = ctx->runner.get();
  }
  return ctx;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::vector<std::string> nearest_case_ids(const std::vector<CaseFile>& files, const std::string& id,
                                          size_t n) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& f : files)
    for (const auto& [tier, cases] : f.tiers)
      for (const auto& c : cases)
        if (std::none_of(scored.begin(), scored.end(),
                         [&](const auto& s) { return s.second == c.id; }))
          scored.emplace_back(edit_distance(id, c.id), c.id);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < std::min(n, scored.size()); ++i) out.push_back(scored[i].second);
  return out;
}

Result run_case_id(CaseContext& ctx, const std::string& id) {
  const auto c = find_case(ctx.files, id);
  if (!c) {
    Result r;
    r.id = id;
    r.op = id.substr(0, id.find('/'));
    r.verdict = Verdict::error;
    r.message = "no case with id '" + id + "'";
    const auto near = nearest_case_ids(ctx.files, id, 3);
    if (!near.empty()) {
      r.message += "; nearest:";
      for (const auto& s : near) r.message += " " + s;
    }
    return r;
  }
  CaseArtifacts artifacts;
  Result r = evaluate(*c, ctx.eval, &artifacts);
  if (r.failing() && artifacts.present && !ctx.repro_dir.empty()) {
    const std::string path = (fs::path(ctx.repro_dir) / (id_to_filename(id) + ".h5")).string();
    try {
      write_repro_bundle(path, r, artifacts, context_hello(ctx));
      r.bundle = path;
    } catch (const std::exception& e) {
      r.message += "; the repro bundle could not be written: " + std::string(e.what());
    }
  }
  return r;
}

nlohmann::json context_hello(const CaseContext& ctx) {
  return {{"pid", ::getpid()},
          {"kernels", ctx.eval.options.kernels_path},
          {"library", ctx.lib ? ctx.lib->library() : ""},
          {"entries", ctx.lib ? ctx.lib->entries() : std::vector<std::string>{}},
          {"device", ctx.device ? ctx.device->name : ""},
          {"device_arch", ctx.device ? ctx.device->arch : ""},
          {"arch", ctx.eval.options.arch},
          {"mode", ctx.device ? "kernel" : "reference"},
          {"no_device", ctx.eval.no_kernel_reason}};
}

int worker_main(const WorkerConfig& cfg) {
  FILE* proto = claim_protocol_stdout();
  auto emit = [&](const nlohmann::json& j) {
    const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    std::fwrite(s.data(), 1, s.size(), proto);
    std::fflush(proto);
  };
  std::unique_ptr<CaseContext> ctx;
  try {
    ctx = make_context(cfg);
  } catch (const std::exception& e) {
    emit({{"fatal", e.what()}});
    return 2;
  }
  emit({{"hello", context_hello(*ctx)}});
  std::string id;
  while (std::getline(std::cin, id)) {
    while (!id.empty() && (id.back() == '\r' || id.back() == ' ')) id.pop_back();
    if (id.empty()) continue;
    const Result r = run_case_id(*ctx, id);
    emit({{"result", r.to_json()}, {"retire", r.device_error}});
    // A GPU fault can leave the context unusable for every later launch: this worker ends, and
    // the parent, told so above, gives the next case to a fresh one.
    if (r.device_error) return 0;
  }
  return 0;
}

}  // namespace attncheck
