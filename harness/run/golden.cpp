#include "golden.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>

#include "run/provenance.h"
#include "run/sha256.h"

namespace attncheck {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string short_hex(const std::string& h) {
  return h.size() > 12 ? h.substr(0, 12) : h;
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

// What differs between two digest records, in words; empty when equal.
std::string digest_difference(const nlohmann::json& golden, const nlohmann::json& now) {
  if (golden == now) return "";
  std::string s;
  auto add = [&](const std::string& w) { s += (s.empty() ? "" : "; ") + w; };
  const auto& ga = golden.value("args", nlohmann::json::object());
  const auto& na = now.value("args", nlohmann::json::object());
  for (const auto& [name, h] : na.items()) {
    if (!ga.contains(name))
      add("argument '" + name + "' is new");
    else if (ga.at(name) != h)
      add("argument '" + name + "' sha256 " + short_hex(h.get<std::string>()) + ", golden has " +
          short_hex(ga.at(name).get<std::string>()));
  }
  for (const auto& [name, h] : ga.items())
    if (!na.contains(name)) add("argument '" + name + "' no longer exists");
  if (golden.value("kernel_params", nlohmann::json()) !=
      now.value("kernel_params", nlohmann::json()))
    add("kernel_params " + now.value("kernel_params", nlohmann::json()).dump() + ", golden has " +
        golden.value("kernel_params", nlohmann::json()).dump());
  if (golden.value("expect_refusal", "") != now.value("expect_refusal", ""))
    add("expect_refusal '" + now.value("expect_refusal", std::string()) + "', golden has '" +
        golden.value("expect_refusal", std::string()) + "'");
  return s.empty() ? "digest records differ" : s;
}

// Compares a recomputed output with its golden.
CheckResult compare_output(const std::string& name, const Tensor& golden, DType golden_ref_dtype,
                           const Tensor& now) {
  if (now.dtype() != golden_ref_dtype || now.shape() != golden.shape()) {
    CheckResult r;
    r.name = name;
    r.budget.kind = Budget::Kind::exact;
    r.message = "the reference now returns " + now.describe() + ", the golden holds " +
                std::string(dtype_name(golden_ref_dtype)) + " of shape " + golden.describe();
    return r;
  }
  const Budget b = golden_budget(golden_ref_dtype);
  if (b.kind == Budget::Kind::exact) {
    CheckResult r = compare_exact(name, golden, now);
    r.budget = b;
    return r;
  }
  return compare_numeric(name, golden, now, b);
}

std::string checks_message(const std::vector<CheckResult>& checks) {
  std::string s;
  for (const auto& c : checks)
    if (!c.passed) s += (s.empty() ? "" : "; ") + c.name + ": " + c.message;
  return s;
}

}  // namespace

nlohmann::json input_digests(const Problem& p) {
  nlohmann::json args = nlohmann::json::object();
  for (const auto& a : p.args) {
    Sha256 h;
    std::ostringstream head;
    head << a.name << '|' << static_cast<int>(a.role) << '|' << dtype_name(a.tensor.dtype()) << '|';
    for (auto d : a.tensor.shape()) head << d << ',';
    head << '|';
    for (auto s : a.tensor.strides()) head << s << ',';
    head << '|' << a.tensor.offset() << '|' << a.tensor.storage()->bytes.size();
    h.update(head.str());
    // Initial bytes of pure outputs are poison by contract: they do not determine the result.
    if (a.role != Role::output)
      h.update(a.tensor.storage()->bytes.data(), a.tensor.storage()->bytes.size());
    args[a.name] = h.hex();
  }
  return {{"args", args}, {"kernel_params", p.kernel_params}, {"expect_refusal", p.expect_refusal}};
}

Tensor golden_storage_form(const Tensor& expected) {
  if (expected.dtype() == DType::f64) return expected.to(DType::f32);
  return expected.contiguous();
}

Budget golden_budget(DType reference_dtype) {
  Budget b;
  if (reference_dtype != DType::f64) {
    b.kind = Budget::Kind::exact;
    b.why = "stored exactly (" + std::string(dtype_name(reference_dtype)) + "): bitwise";
    return b;
  }
  b.kind = Budget::Kind::numeric;
  b.rtol = std::ldexp(1.0, -24) + std::ldexp(1.0, -44);
  b.atol = std::ldexp(1.0, -150);
  b.why =
      "float64 reference stored as float32: round-to-nearest error <= 2^-24 |stored|, + 2^-44 "
      "|stored| for re-association noise of float64 reductions, + 2^-150 for subnormals";
  return b;
}

std::string golden_group(const std::string& id) {
  std::string vars = id.substr(id.find('/') + 1);
  std::string out;
  for (char c : vars) out += c == '/' ? std::string("__") : std::string(1, c);
  return "cases/" + out;
}

std::string GoldenStore::path_of(const std::string& op) const {
  return (fs::path(dir_) / (op + ".h5")).string();
}

bool GoldenStore::has_op(const std::string& op) const {
  return fs::exists(path_of(op));
}

H5File& GoldenStore::file(const std::string& op) {
  auto it = open_.find(op);
  if (it != open_.end()) return *it->second;
  auto f = std::make_unique<H5File>(H5File::open(path_of(op)));
  const int64_t format = f->has_attr("/", "format") ? f->attr_int("/", "format") : -1;
  if (format != kGoldenFormat)
    throw std::runtime_error(path_of(op) + ": golden format " + std::to_string(format) +
                             ", this attncheck reads format " + std::to_string(kGoldenFormat) +
                             " (regenerate with `attncheck golden generate --op " + op + "`)");
  return *open_.emplace(op, std::move(f)).first->second;
}

std::vector<std::string> GoldenStore::case_ids(const std::string& op) {
  H5File& f = file(op);
  std::vector<std::string> ids;
  if (!f.has("cases")) return ids;
  for (const auto& g : f.children("cases")) ids.push_back(f.attr_string("cases/" + g, "id"));
  return ids;
}

std::optional<GoldenCase> GoldenStore::load(const std::string& op, const std::string& id) {
  if (!has_op(op)) return std::nullopt;
  H5File& f = file(op);
  const std::string g = golden_group(id);
  if (!f.has(g)) return std::nullopt;
  GoldenCase gc;
  gc.id = f.attr_string(g, "id");
  if (gc.id != id)
    throw std::runtime_error(path_of(op) + ": group '" + g + "' holds case '" + gc.id +
                             "', expected '" + id + "'");
  gc.params = f.attr_json(g, "params");
  gc.input_digests = f.attr_json(g, "input_digests");
  gc.expect_refusal = f.attr_string(g, "expect_refusal");
  if (f.has(g + "/outputs"))
    for (const auto& name : f.children(g + "/outputs")) {
      const std::string ds = g + "/outputs/" + name;
      Tensor t = f.read_tensor(ds);
      const auto ref = parse_dtype(f.attr_string(ds, "reference_dtype"));
      if (!ref)
        throw std::runtime_error(path_of(op) + ": '" + ds + "' has an unknown reference_dtype");
      gc.stored_dtypes[name] = t.dtype();
      gc.outputs[name] = *ref == t.dtype() ? t : t.to(*ref);  // f32 -> f64 widening is exact
    }
  return gc;
}

Result verify_against_golden(const Op& op, const Case& c, const GoldenCase& g,
                             CaseArtifacts* artifacts) {
  Result r;
  r.id = c.id;
  r.op = c.op;
  r.params = c.params;
  r.mode = "reference";
  r.repro = repro_command(c, {});
  std::vector<std::string> problems;
  try {
    auto t0 = std::chrono::steady_clock::now();
    Problem p = op.make(c);
    if (p.kernel.empty()) p.kernel = op.name();
    r.timings.generate_ms = seconds_since(t0) * 1e3;
    if (artifacts) {
      artifacts->problem = p;
      artifacts->expected = g.outputs;
    }
    const std::string digests = digest_difference(g.input_digests, input_digests(p));
    if (!digests.empty())
      problems.push_back("inputs differ from those the golden was computed from (" + digests +
                         "): the input generator changed; regenerate the golden deliberately");
    if (!p.expect_refusal.empty() || !g.expect_refusal.empty()) {
      if (p.expect_refusal.empty() || g.expect_refusal.empty())
        problems.push_back(p.expect_refusal.empty()
                               ? "the golden marks this case invalid, the op now accepts it"
                               : "the op now marks this case invalid, the golden holds outputs");
      try {
        t0 = std::chrono::steady_clock::now();
        (void)op.reference(p);
        problems.push_back("reference accepted an invalid configuration (" + p.expect_refusal +
                           ")");
      } catch (const InvalidConfig&) {
      }
      r.timings.reference_ms = seconds_since(t0) * 1e3;
      r.verdict = problems.empty() ? Verdict::refused_as_expected : Verdict::failed;
    } else {
      t0 = std::chrono::steady_clock::now();
      const TensorMap now = op.reference(p);
      r.timings.reference_ms = seconds_since(t0) * 1e3;
      if (artifacts) artifacts->actual = now;
      for (const auto& [name, t] : now) {
        const auto it = g.outputs.find(name);
        if (it == g.outputs.end()) {
          problems.push_back("output '" + name + "' is not in the golden");
          continue;
        }
        r.checks.push_back(compare_output(name, it->second, it->second.dtype(), t));
      }
      for (const auto& [name, t] : g.outputs)
        if (!now.count(name))
          problems.push_back("golden output '" + name + "' is no longer produced");
      const std::string drift = checks_message(r.checks);
      if (!drift.empty()) problems.push_back("reference drift: " + drift);
      r.verdict = problems.empty() ? Verdict::passed : Verdict::failed;
    }
  } catch (const InvalidConfig& e) {
    problems.push_back(std::string("reference refused a case not marked invalid: ") + e.what());
    r.verdict = Verdict::failed;
  } catch (const std::exception& e) {
    r.verdict = Verdict::error;
    problems.push_back(e.what());
  }
  for (const auto& s : problems) r.message += (r.message.empty() ? "" : "; ") + s;
  if (r.message.empty())
    r.message = r.verdict == Verdict::refused_as_expected
                    ? "reference refused, as the golden records"
                    : "reference matches the golden";
  return r;
}

std::vector<ManifestEntry> read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "MANIFEST").string();
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": missing (run `attncheck golden generate`)");
  std::vector<ManifestEntry> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    ManifestEntry e;
    if (!(ls >> e.sha256 >> e.size >> e.cases >> e.file) || e.sha256.size() != 64)
      throw std::runtime_error(path + ":" + std::to_string(n) +
                               ": expected '<sha256> <bytes> <cases> <file>', got '" + line + "'");
    out.push_back(e);
  }
  return out;
}

void write_manifest(const std::string& dir, const std::vector<ManifestEntry>& entries) {
  const fs::path path = fs::path(dir) / "MANIFEST";
  const fs::path tmp = fs::path(dir) / "MANIFEST.tmp";
  {
    std::ofstream out(tmp);
    out << "# attncheck goldens (written by `attncheck golden generate`; checked by `attncheck "
           "golden verify`)\n# sha256 bytes cases file\n";
    for (const auto& e : entries)
      out << e.sha256 << ' ' << e.size << ' ' << e.cases << ' ' << e.file << '\n';
    if (!out) throw std::runtime_error(tmp.string() + ": write failed");
  }
  fs::rename(tmp, path);
}

std::map<std::string, std::vector<Case>> golden_cases(const std::vector<CaseFile>& files,
                                                      const std::vector<std::string>& ops) {
  for (const auto& o : ops)
    if (!find_op(o)) throw std::invalid_argument("unknown op '" + o + "'");
  std::map<std::string, std::vector<Case>> out;
  std::set<std::string> seen;
  for (const auto& f : files) {
    if (!ops.empty() && std::find(ops.begin(), ops.end(), f.op) == ops.end()) continue;
    for (std::string_view t : kGoldenTiers) {
      const auto it = f.tiers.find(std::string(t));
      if (it == f.tiers.end()) continue;
      for (const auto& c : it->second)
        if (seen.insert(c.id).second) out[f.op].push_back(c);
    }
  }
  for (const auto& o : ops)
    if (!out.count(o))
      throw std::invalid_argument("op '" + o + "' has no smoke or quick cases, hence no golden");
  return out;
}

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
      Problem p = op.make(c);
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
        const auto g = store.load(op_name, c.id);
        const Result r = verify_against_golden(*find_op(op_name), c, *g);
        if (verdict_is_failure(r.verdict)) {
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
    const Op& op = *find_op(op_name);
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
          const CheckResult cr = compare_output(name, ia->second, ia->second.dtype(), t);
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
      const Result r = verify_against_golden(op, c, *store.load(op_name, c.id));
      if (!verdict_is_failure(r.verdict)) continue;
      ++changed;
      out << "  changed " << c.id << "\n    " << r.message << "\n";
    }
  }
  out << "  " << changed << " case(s) differ\n";
  return changed;
}

}  // namespace attncheck
