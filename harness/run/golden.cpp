#include "golden.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <set>
#include <sstream>

#include "run/results.h"
#include "run/sha256.h"

namespace attncheck {

namespace fs = std::filesystem;

namespace {

std::string short_hex(const std::string& h) {
  return h.size() > 12 ? h.substr(0, 12) : h;
}

}  // namespace

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

CheckResult compare_golden_output(const std::string& name, const Tensor& golden,
                                  DType golden_ref_dtype, const Tensor& now) {
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

std::vector<CheckResult> compare_with_golden(const GoldenCase& g, const TensorMap& now,
                                             std::vector<std::string>& problems) {
  std::vector<CheckResult> checks;
  for (const auto& [name, t] : now) {
    const auto it = g.outputs.find(name);
    if (it == g.outputs.end()) {
      problems.push_back("output '" + name + "' is not in the golden");
      continue;
    }
    checks.push_back(compare_golden_output(name, it->second, it->second.dtype(), t));
  }
  for (const auto& [name, t] : g.outputs)
    if (!now.count(name)) problems.push_back("golden output '" + name + "' is no longer produced");
  return checks;
}

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
  return {{"args", args},
          {"kernel_params", p.kernel_params},
          {"expect_refusal", p.expect_refusal.value_or("")}};
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

std::string golden_manifest_problem(const std::string& dir, const std::string& op) {
  const std::string file = op + ".h5";
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return path + ": not a regular file" + (fs::exists(path, ec) ? "" : " (missing)");
  std::vector<ManifestEntry> manifest;
  try {
    manifest = read_manifest(dir);
  } catch (const std::exception& e) {
    return path + ": not read, nothing to check it against: " + e.what();
  }
  const auto it = std::find_if(manifest.begin(), manifest.end(),
                               [&](const ManifestEntry& e) { return e.file == file; });
  if (it == manifest.end())
    return path + ": not read: it is not listed in " + (fs::path(dir) / "MANIFEST").string();
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size != it->size)
    return path + ": not read: " + std::to_string(size) + " bytes, MANIFEST says " +
           std::to_string(it->size) + " (truncated or replaced)";
  if (sha256_file(path) != it->sha256)
    return path +
           ": not read: its sha256 does not match MANIFEST (corrupt, or changed outside "
           "`attncheck golden generate`)";
  return "";
}

std::string probe_golden_file(const std::string& dir, const std::string& op, double timeout_s) {
  return read_in_child(
      [&] {
        GoldenStore probe(dir);
        probe.checked_ = false;
        for (const auto& id : probe.case_ids(op)) (void)probe.load(op, id);
      },
      timeout_s);
}

std::string golden_file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  return std::to_string(st.st_size) + ":" +
         std::to_string(int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
}

double golden_read_timeout_s() {
  const char* env = std::getenv("ATTNCHECK_GOLDEN_READ_TIMEOUT");
  if (!env || !*env) return kGoldenReadTimeoutS;
  char* end = nullptr;
  const double v = std::strtod(env, &end);
  if (*end != '\0' || !std::isfinite(v) || v <= 0 || v > 86400)
    throw std::invalid_argument(std::string("ATTNCHECK_GOLDEN_READ_TIMEOUT='") + env +
                                "': expected seconds, > 0 and <= 86400");
  return v;
}

std::string golden_file_verdict(const std::string& dir, const std::string& op) {
  if (std::string why = golden_manifest_problem(dir, op); !why.empty()) return why;
  if (std::string why = probe_golden_file(dir, op); !why.empty())
    return (fs::path(dir) / (op + ".h5")).string() +
           ": unreadable (read in a child process): " + why;
  return "";
}

std::map<std::string, std::string> set_aside_unreadable_goldens(const std::string& dir,
                                                                std::vector<Case>& cases,
                                                                size_t& runnable) {
  const auto unreadable = unreadable_golden_files(dir, cases);
  const auto end = std::stable_partition(cases.begin(), cases.end(),
                                         [&](const Case& c) { return !unreadable.count(c.op); });
  runnable = static_cast<size_t>(end - cases.begin());
  return unreadable;
}

std::map<std::string, std::string> unreadable_golden_files(const std::string& dir,
                                                           const std::vector<Case>& cases) {
  std::map<std::string, std::string> unreadable;
  std::set<std::string> checked;
  std::vector<std::string> ops;
  const GoldenStore store(dir);
  for (const auto& c : cases)
    if (checked.insert(c.op).second && store.has_op(c.op)) ops.push_back(c.op);
  // Every file at once (each is hashed and read in its own child process): the run's start waits
  // for the slowest file, not for the sum of them.
  std::vector<std::future<std::string>> verdicts;
  for (const auto& op : ops)
    verdicts.push_back(
        std::async(std::launch::async, [&dir, op] { return golden_file_verdict(dir, op); }));
  for (size_t i = 0; i < ops.size(); ++i)
    if (std::string why = verdicts[i].get(); !why.empty()) unreadable[ops[i]] = why;
  return unreadable;
}

H5File& GoldenStore::file(const std::string& op) {
  auto it = open_.find(op);
  if (it != open_.end()) return *it->second;
  if (const auto bad = unreadable_.find(op); bad != unreadable_.end())
    throw std::runtime_error(bad->second + " (this run's verdict on the file; not read again)");
  const auto trusted = trusted_.find(op);
  const bool checked_before =
      trusted != trusted_.end() && golden_file_stamp(path_of(op)) == trusted->second;
  if (checked_ && !checked_before) {
    std::string why;
    try {
      why = golden_file_verdict(dir_, op);
    } catch (const std::exception& e) {  // no child process, a bad timeout setting
      why = path_of(op) + ": not read: " + e.what();
    }
    if (!why.empty()) {
      unreadable_[op] = why;
      throw std::runtime_error(why);
    }
  }
  auto f = std::make_unique<H5File>(H5File::open(path_of(op)));
  const int64_t format = f->has_attr("/", "format") ? f->attr_int("/", "format") : -1;
  if (format != kGoldenFormat)
    throw std::runtime_error(path_of(op) + ": golden format " + std::to_string(format) +
                             ", this attncheck reads format " + std::to_string(kGoldenFormat) +
                             " (regenerate with `attncheck golden generate --op " + op + "`)");
  return *open_.emplace(op, std::move(f)).first->second;
}

std::vector<std::string> GoldenStore::case_ids(const std::string& op) {
  const std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());  // the store's maps too
  H5File& f = file(op);
  std::vector<std::string> ids;
  if (!f.has("cases")) return ids;
  for (const auto& g : f.children("cases")) ids.push_back(f.attr_string("cases/" + g, "id"));
  return ids;
}

namespace {
// Attribute names of `object` that are not in `allowed`, as "'a', 'b'"; "" when none.
std::string unexpected_attrs(const H5File& f, const std::string& object,
                             const std::set<std::string>& allowed) {
  std::string out;
  for (const auto& name : f.attr_names(object))
    if (!allowed.count(name)) out += (out.empty() ? "'" : ", '") + name + "'";
  return out;
}

bool is_generator_note(const std::string& s) {
  const std::string head = "attncheck ", tail = " golden generate";
  if (s.size() <= head.size() + tail.size() || !s.starts_with(head) || !s.ends_with(tail))
    return false;
  const std::string version = s.substr(head.size(), s.size() - head.size() - tail.size());
  return version.find_first_of(" \t\n") == std::string::npos;
}

// The root's attributes against what generate writes; `stored`: the case groups in the file.
void root_problems(const H5File& f, const std::string& op, size_t stored,
                   const std::function<void(const std::string&)>& problem) {
  const std::set<std::string> names = {"case_count", "format",  "generator",
                                       "op",         "storage", "tiers"};
  for (const auto& name : names)
    if (!f.has_attr("/", name)) problem("attribute '" + name + "' is missing");
  if (const auto extra = unexpected_attrs(f, "/", names); !extra.empty())
    problem("attributes " + extra + " are not written by `attncheck golden generate`");
  if (f.has_attr("/", "op") && f.attr_string("/", "op") != op)
    problem("attribute 'op' is '" + f.attr_string("/", "op") + "', not '" + op + "'");
  if (f.has_attr("/", "generator") && !is_generator_note(f.attr_string("/", "generator")))
    problem("attribute 'generator' is '" + f.attr_string("/", "generator") +
            "', not 'attncheck <version> golden generate'");
  if (f.has_attr("/", "tiers") && f.attr_string("/", "tiers") != "smoke,quick")
    problem("attribute 'tiers' is '" + f.attr_string("/", "tiers") + "', not 'smoke,quick'");
  if (f.has_attr("/", "storage") && f.attr_string("/", "storage") != kGoldenStorageNote)
    problem("attribute 'storage' is '" + f.attr_string("/", "storage") +
            "', not the storage generate uses");
  if (f.has_attr("/", "case_count") &&
      f.attr_int("/", "case_count") != static_cast<int64_t>(stored))
    problem("attribute 'case_count' is " + std::to_string(f.attr_int("/", "case_count")) +
            ", but the file holds " + std::to_string(stored) + " cases");
}

// One case group's attributes and its outputs' attribute names; `c`: its case, when wanted.
void case_problems(const H5File& f, const std::string& g, const Case* c,
                   const std::function<void(const std::string&)>& problem) {
  const std::set<std::string> names = {"expect_refusal", "id", "input_digests", "params", "tiers"};
  for (const auto& name : names)
    if (!f.has_attr(g, name)) problem("'" + g + "': attribute '" + name + "' is missing");
  if (const auto extra = unexpected_attrs(f, g, names); !extra.empty())
    problem("'" + g + "': attributes " + extra + " are not written by `attncheck golden generate`");
  if (c && f.has_attr(g, "params") && f.attr_json(g, "params") != c->params)
    problem("'" + g + "' (" + c->id + "): stored params " + f.attr_json(g, "params").dump() +
            " are not the case's " + c->params.dump());
  if (c && f.has_attr(g, "tiers") && f.attr_json(g, "tiers") != nlohmann::json(c->tiers))
    problem("'" + g + "' (" + c->id + "): stored tiers " + f.attr_json(g, "tiers").dump() +
            " are not the case's " + nlohmann::json(c->tiers).dump());
  if (!f.has(g + "/outputs")) return;
  if (const auto extra = unexpected_attrs(f, g + "/outputs", {}); !extra.empty())
    problem("'" + g + "/outputs': attributes " + extra + " are not written by generate");
  for (const auto& name : f.children(g + "/outputs")) {
    const std::string ds = g + "/outputs/" + name;
    if (const auto extra = unexpected_attrs(f, ds, {"dtype", "encoding", "reference_dtype"});
        !extra.empty())
      problem("'" + ds + "': attributes " + extra + " are not written by generate");
  }
}
}  // namespace

std::vector<std::string> GoldenStore::metadata_problems(const std::string& op,
                                                        const std::vector<Case>& cases) {
  const std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  H5File& f = file(op);
  std::vector<std::string> out;
  auto problem = [&](const std::string& why) { out.push_back(path_of(op) + ": " + why); };
  const auto groups = f.has("cases") ? f.children("cases") : std::vector<std::string>{};
  root_problems(f, op, groups.size(), problem);
  std::map<std::string, const Case*> by_id;
  for (const auto& c : cases) by_id[c.id] = &c;
  for (const auto& name : groups) {
    const std::string g = "cases/" + name;
    const Case* c = nullptr;
    if (f.has_attr(g, "id")) {
      const auto it = by_id.find(f.attr_string(g, "id"));
      if (it != by_id.end()) c = it->second;
      if (c && golden_group(c->id) != g)
        problem("'" + g + "' holds case '" + c->id + "', whose group is '" + golden_group(c->id) +
                "'");
    }
    case_problems(f, g, c, problem);
  }
  return out;
}

std::optional<GoldenCase> GoldenStore::load(const std::string& op, const std::string& id) {
  const std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());  // the store's maps too
  const std::string key = op + "\n" + id;
  if (const auto it = overrides_.find(key); it != overrides_.end()) return it->second;
  if (const auto it = kept_.find(key); it != kept_.end()) return it->second;
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
  if (std::string why = f.attr_string(g, "expect_refusal"); !why.empty())
    gc.expect_refusal = std::move(why);
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
  uint64_t bytes = 0;
  for (const auto& [name, t] : gc.outputs)
    bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
  if (kept_bytes_ + bytes <= kGoldenKeptBytes) {
    kept_bytes_ += bytes;
    kept_.emplace(key, gc);
  }
  return gc;
}

std::vector<ManifestEntry> read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "MANIFEST").string();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw std::runtime_error(path + ": missing (run `attncheck golden generate`)");
  if (!fs::is_regular_file(path, ec))  // a FIFO would block, /dev/zero never end
    throw std::runtime_error(path + ": not a regular file");
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be opened");
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
  std::ostringstream out;
  out << "# attncheck goldens (written by `attncheck golden generate`; checked by `attncheck "
         "golden verify`)\n# sha256 bytes cases file\n";
  for (const auto& e : entries)
    out << e.sha256 << ' ' << e.size << ' ' << e.cases << ' ' << e.file << '\n';
  write_file_atomic((fs::path(dir) / "MANIFEST").string(), out.str());
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

}  // namespace attncheck
