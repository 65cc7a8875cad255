// `attncheck golden generate|verify|diff` (docs/goldens.md): the goldens' lifecycle, on top of the
// storage rules in golden.h and the one evaluation path in evaluate.h.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <set>
#include <sstream>

#include "run/evaluate.h"
#include "run/golden.h"
#include "run/provenance.h"
#include "run/sha256.h"

namespace attncheck {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string fmt_bytes(uint64_t b) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(2);
  if (b >= 1000 * 1000)
    os << static_cast<double>(b) / 1e6 << " MB";
  else
    os << static_cast<double>(b) / 1e3 << " kB";
  return os.str();
}

// Reference vs golden for one case, through the one evaluation path.
Result verify_case(const Case& c, GoldenStore& store) {
  EvalContext ctx;
  ctx.goldens = &store;
  ctx.no_kernel_reason = "golden verification";
  return evaluate(c, ctx);
}

}  // namespace

int golden_generate(const std::vector<CaseFile>& files, const GoldenOptions& opt,
                    std::ostream& out) {
  const auto per_op = golden_cases(files, opt.ops);
  fs::create_directories(opt.dir);
  std::map<std::string, ManifestEntry> manifest;
  if (fs::exists(fs::path(opt.dir) / "MANIFEST"))
    for (const auto& e : read_manifest(opt.dir)) manifest[e.file] = e;
  const std::string git = git_revision(opt.root);
  const std::string ref_rev =
      git_revision_of(opt.root, {"reference", "harness/ops", "harness/core"});

  for (const auto& [op_name, cases] : per_op) {
    const auto t0 = std::chrono::steady_clock::now();
    const Op& op = *find_op(op_name);
    const fs::path path = fs::path(opt.dir) / (op_name + ".h5");
    H5File f = H5File::create(path);
    f.set_attr("/", "format", kGoldenFormat);
    f.set_attr("/", "op", op_name);
    f.set_attr("/", "generator", "attncheck " + attncheck_version() + " golden generate");
    f.set_attr("/", "git_revision", git);
    f.set_attr("/", "reference_revision", ref_rev);
    f.set_attr("/", "tiers", "smoke,quick");
    f.set_attr("/", "case_count", static_cast<int64_t>(cases.size()));
    f.set_attr("/", "storage",
               "float64 outputs as float32; every other dtype exactly (raw bits + dtype attribute "
               "for bf16/f16/fp8)");
    for (const auto& c : cases) {
      Problem p = op.problem(c);
      const std::string g = golden_group(c.id);
      f.create_group(g);
      f.set_attr(g, "id", c.id);
      f.set_attr_json(g, "params", c.params);
      f.set_attr_json(g, "tiers", c.tiers);
      f.set_attr_json(g, "input_digests", input_digests(p));
      f.set_attr(g, "expect_refusal", p.expect_refusal);
      if (!p.expect_refusal.empty()) {
        try {
          (void)op.reference(p);
        } catch (const InvalidConfig&) {
          continue;
        }
        throw std::runtime_error(c.id + ": reference accepted an invalid configuration (" +
                                 p.expect_refusal + ")");
      }
      TensorMap expected;
      try {
        expected = op.reference(p);
      } catch (const std::exception& e) {
        throw std::runtime_error(c.id + " (" + c.source + "): reference failed: " + e.what());
      }
      for (const auto& [name, t] : expected) {
        const std::string ds = g + "/outputs/" + name;
        f.write_tensor(ds, golden_storage_form(t));
        f.set_attr(ds, "reference_dtype", std::string(dtype_name(t.dtype())));
      }
    }
    f.commit();
    ManifestEntry e;
    e.file = op_name + ".h5";
    e.sha256 = sha256_file(path.string());
    e.size = fs::file_size(path);
    e.cases = static_cast<int64_t>(cases.size());
    manifest[e.file] = e;
    out << "  " << std::left << std::setw(24) << op_name << std::right << std::setw(6)
        << cases.size() << " cases " << std::setw(12) << fmt_bytes(e.size) << "  " << std::fixed
        << std::setprecision(1) << seconds_since(t0) << " s\n";
  }
  std::vector<ManifestEntry> entries;
  for (const auto& [file, e] : manifest)
    if (fs::exists(fs::path(opt.dir) / file)) entries.push_back(e);
  write_manifest(opt.dir, entries);

  uint64_t total = 0;
  for (const auto& e : entries) total += e.size;
  out << "  total " << fmt_bytes(total) << " in " << entries.size() << " files (budget "
      << fmt_bytes(kGoldenBudgetBytes) << ")\n";
  if (total > kGoldenBudgetBytes) {
    auto heavy = entries;
    std::sort(heavy.begin(), heavy.end(),
              [](const auto& a, const auto& b) { return a.size > b.size; });
    out << "  OVER BUDGET; heaviest:";
    for (size_t i = 0; i < std::min<size_t>(3, heavy.size()); ++i)
      out << " " << heavy[i].file << " (" << fmt_bytes(heavy[i].size) << ")";
    out << "\n";
    return 1;
  }
  return 0;
}

namespace {

struct ManifestCheck {
  std::map<std::string, ManifestEntry> entries;
  bool readable = true;
};

}  // namespace

int golden_verify(const std::vector<CaseFile>& files, const GoldenOptions& opt, std::ostream& out) {
  const auto per_op = golden_cases(files, opt.ops);
  int problems = 0;
  auto problem = [&](const std::string& s) {
    ++problems;
    out << "  FAIL " << s << "\n";
  };
  const std::string dir = opt.dir;
  auto shown = [&](const std::string& file) { return (fs::path(dir) / file).string(); };

  ManifestCheck man;
  try {
    for (const auto& e : read_manifest(dir)) man.entries[e.file] = e;
  } catch (const std::exception& e) {
    man.readable = false;
    problem(e.what());
  }
  if (opt.ops.empty()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().extension() != ".h5") continue;
      const std::string op = e.path().stem().string();
      if (!per_op.count(op))
        problem(e.path().string() + ": no case file has smoke/quick cases for op '" + op +
                "' (stale golden: delete it, then `attncheck golden generate`)");
    }
    for (const auto& [file, entry] : man.entries)
      if (!fs::exists(fs::path(dir) / file))
        problem(shown("MANIFEST") + " lists " + file + ", which does not exist");
  }

  GoldenStore store(dir);
  for (const auto& [op_name, cases] : per_op) {
    const auto t0 = std::chrono::steady_clock::now();
    const int before = problems;
    const std::string file = op_name + ".h5";
    const std::string path = shown(file);
    if (!fs::exists(path)) {
      problem(path + " missing: " + std::to_string(cases.size()) + " smoke/quick cases of '" +
              op_name + "' have no golden (run `attncheck golden generate --op " + op_name + "`)");
      continue;
    }
    const auto it = man.entries.find(file);
    if (man.readable && it == man.entries.end()) {
      problem(path + " is not listed in " + shown("MANIFEST"));
    } else if (it != man.entries.end()) {
      const uint64_t size = fs::file_size(path);
      const std::string sha = sha256_file(path);
      if (size != it->second.size)
        problem(path + ": " + std::to_string(size) + " bytes, MANIFEST says " +
                std::to_string(it->second.size) + " (truncated or replaced)");
      if (sha != it->second.sha256)
        problem(path + ": sha256 " + sha + " does not match MANIFEST (" + it->second.sha256 +
                "): the file is corrupt or was changed outside `attncheck golden generate`");
    }
    if (opt.manifest_only) {
      if (problems == before) out << "  ok   " << file << " matches MANIFEST\n";
      continue;
    }
    std::vector<std::string> stored;
    try {
      stored = store.case_ids(op_name);
    } catch (const std::exception& e) {
      problem(std::string("cannot read golden: ") + e.what());
      continue;
    }
    std::set<std::string> stored_set(stored.begin(), stored.end()), wanted;
    for (const auto& c : cases) wanted.insert(c.id);
    for (const auto& id : stored)
      if (!wanted.count(id))
        problem(path + " holds '" + id + "', which is no longer a smoke/quick case (regenerate)");
    int verified = 0;
    double worst_ratio = 0;
    for (const auto& c : cases) {
      if (!stored_set.count(c.id)) {
        problem(c.id + " (" + c.source + "): no golden (run `attncheck golden generate --op " +
                op_name + "`)");
        continue;
      }
      try {
        const Result r = verify_case(c, store);
        if (r.failing()) {
          problem(c.id + ": " + r.message);
          continue;
        }
        for (const auto& ch : r.checks)
          if (std::isfinite(ch.metrics.worst.ratio))
            worst_ratio = std::max(worst_ratio, ch.metrics.worst.ratio);
        ++verified;
      } catch (const std::exception& e) {
        problem(c.id + ": cannot read its golden: " + e.what());
      }
    }
    out << "  " << (problems == before ? "ok   " : "FAIL ") << std::left << std::setw(24) << op_name
        << std::right << std::setw(5) << verified << "/" << cases.size() << " cases verified"
        << "  worst drift " << std::setprecision(2) << worst_ratio << " of the storage bound  "
        << std::fixed << std::setprecision(1) << seconds_since(t0) << " s\n"
        << std::defaultfloat;
  }
  return problems;
}

int golden_diff(const std::vector<CaseFile>& files, const GoldenOptions& opt, std::ostream& out) {
  const auto per_op = golden_cases(files, opt.ops);
  GoldenStore store(opt.dir);
  std::optional<GoldenStore> other;
  if (!opt.against.empty()) other.emplace(opt.against);
  int changed = 0;
  out << std::setprecision(3);
  for (const auto& [op_name, cases] : per_op) {
    std::vector<std::string> stored =
        store.has_op(op_name) ? store.case_ids(op_name) : std::vector<std::string>{};
    std::set<std::string> stored_set(stored.begin(), stored.end());
    if (other) {
      // Golden vs golden: cases of either side.
      std::vector<std::string> theirs =
          other->has_op(op_name) ? other->case_ids(op_name) : std::vector<std::string>{};
      std::set<std::string> their_set(theirs.begin(), theirs.end());
      for (const auto& id : stored)
        if (!their_set.count(id)) {
          ++changed;
          out << "  only in " << opt.dir << "  " << id << "\n";
        }
      for (const auto& id : theirs) {
        if (!stored_set.count(id)) {
          ++changed;
          out << "  only in " << opt.against << "  " << id << "\n";
          continue;
        }
        const auto a = store.load(op_name, id);
        const auto b = other->load(op_name, id);
        std::string what = digest_difference(a->input_digests, b->input_digests);
        if (!what.empty()) what = "inputs: " + what;
        for (const auto& [name, t] : b->outputs) {
          const auto ia = a->outputs.find(name);
          if (ia == a->outputs.end()) {
            what += (what.empty() ? "" : "; ") + ("output '" + name + "' added");
            continue;
          }
          const CheckResult cr = compare_golden_output(name, ia->second, ia->second.dtype(), t);
          if (!cr.passed) what += (what.empty() ? "" : "; ") + name + ": " + cr.message;
        }
        if (!what.empty()) {
          ++changed;
          out << "  changed " << id << "\n    " << what << "\n";
        }
      }
      continue;
    }
    std::set<std::string> wanted;
    for (const auto& c : cases) wanted.insert(c.id);
    for (const auto& id : stored)
      if (!wanted.count(id)) {
        ++changed;
        out << "  removed " << id << " (no longer a smoke/quick case)\n";
      }
    for (const auto& c : cases) {
      if (!stored_set.count(c.id)) {
        ++changed;
        out << "  added   " << c.id << " (no golden yet)\n";
        continue;
      }
      const Result r = verify_case(c, store);
      if (!r.failing()) continue;
      ++changed;
      out << "  changed " << c.id << "\n    " << r.message << "\n";
    }
  }
  out << "  " << changed << " case(s) differ\n";
  return changed;
}

}  // namespace attncheck
