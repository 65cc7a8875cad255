// `attncheck golden generate|verify|diff` (docs/goldens.md): the goldens' lifecycle, on top of the
// storage rules in golden.h and the one evaluation path in evaluate.h.
#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
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

std::string golden_staging_dir(const std::string& dir) {
  const fs::path d = fs::absolute(dir).lexically_normal();
  const fs::path name = d.has_filename() ? d.filename() : d.parent_path().filename();
  const fs::path parent = d.has_filename() ? d.parent_path() : d.parent_path().parent_path();
  return (parent / ("." + name.string() + ".staging")).string();
}

namespace {

// Swaps two directories in one step; a kill before it leaves the old set, after it the new.
void swap_directories(const fs::path& a, const fs::path& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return;
  throw std::runtime_error("cannot swap '" + a.string() + "' and '" + b.string() +
                           "' (renameat2 RENAME_EXCHANGE): " + std::strerror(errno) +
                           "; the golden set is unchanged, the new one is in '" + a.string() + "'");
}

}  // namespace

namespace {

// Hard links (copies where a link cannot be made) in `staging` of everything in `dir` that is not
// regenerated: the golden files of other ops and whatever else the directory holds.
void stage_kept_files(const fs::path& dir, const fs::path& staging,
                      const std::map<std::string, std::vector<Case>>& per_op) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "MANIFEST") continue;
    if (name.size() > 3 && name.ends_with(".h5") && per_op.count(name.substr(0, name.size() - 3)))
      continue;
    if (name.find(".h5.tmp.") != std::string::npos) continue;  // left by an older attncheck
    std::error_code ec;
    if (entry.is_regular_file() && !entry.is_symlink())
      fs::create_hard_link(entry.path(), staging / name, ec);
    if (ec || !entry.is_regular_file() || entry.is_symlink())
      fs::copy(entry.path(), staging / name,
               fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
}

// One case's group: its id, values, input digests and refusal, and the reference's outputs
// (none for an invalid configuration: the op's invalid(), decided once in Op::problem).
void write_golden_case(H5File& f, const Op& op, const Case& c) {
  Problem p = op.problem(c);
  const std::string g = golden_group(c.id);
  f.create_group(g);
  f.set_attr(g, "id", c.id);
  f.set_attr_json(g, "params", c.params);
  f.set_attr_json(g, "tiers", c.tiers);
  f.set_attr_json(g, "input_digests", input_digests(p));
  f.set_attr(g, "expect_refusal", p.expect_refusal.value_or(""));
  if (p.expect_refusal) return;
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

// <op>.h5 at `path`, holding every case of the op; its MANIFEST line.
ManifestEntry write_op_golden(const Op& op, const std::vector<Case>& cases, const fs::path& path) {
  H5File f = H5File::create(path);
  // No revision in the file: its bytes depend on the case files and the reference alone, so
  // regenerating on a clean checkout is byte-identical (the commit that wrote golden/ is its
  // provenance: `git log golden/`).
  f.set_attr("/", "format", kGoldenFormat);
  f.set_attr("/", "op", op.name());
  f.set_attr("/", "generator", "attncheck " + attncheck_version() + " golden generate");
  f.set_attr("/", "tiers", "smoke,quick");
  f.set_attr("/", "case_count", static_cast<int64_t>(cases.size()));
  f.set_attr("/", "storage", kGoldenStorageNote);
  for (const auto& c : cases) write_golden_case(f, op, c);
  f.commit();
  ManifestEntry e;
  e.file = op.name() + ".h5";
  e.sha256 = sha256_file(path.string());
  e.size = fs::file_size(path);
  e.cases = static_cast<int64_t>(cases.size());
  return e;
}

// The set's total size against kGoldenBudgetBytes: 1 (naming the heaviest files) when over.
int report_golden_budget(const std::vector<ManifestEntry>& entries, std::ostream& out) {
  uint64_t total = 0;
  for (const auto& e : entries) total += e.size;
  out << "  total " << fmt_bytes(total) << " in " << entries.size() << " files (budget "
      << fmt_bytes(kGoldenBudgetBytes) << ")\n";
  if (total <= kGoldenBudgetBytes) return 0;
  auto heavy = entries;
  std::sort(heavy.begin(), heavy.end(),
            [](const auto& a, const auto& b) { return a.size > b.size; });
  out << "  OVER BUDGET; heaviest:";
  for (size_t i = 0; i < std::min<size_t>(3, heavy.size()); ++i)
    out << " " << heavy[i].file << " (" << fmt_bytes(heavy[i].size) << ")";
  out << "\n";
  return 1;
}

}  // namespace

int golden_generate(const std::vector<CaseFile>& files, const GoldenOptions& opt,
                    std::ostream& out) {
  const auto per_op = golden_cases(files, opt.ops);
  fs::create_directories(opt.dir);
  // The real directory (a symlinked golden/ keeps its link), and a fresh staging directory next
  // to it; a killed generate's staging directory is removed here.
  const fs::path dir = fs::canonical(opt.dir);
  const fs::path staging = golden_staging_dir(dir.string());
  fs::remove_all(staging);
  fs::create_directory(staging);
  std::map<std::string, ManifestEntry> manifest;
  if (fs::exists(dir / "MANIFEST"))
    for (const auto& e : read_manifest(dir.string())) manifest[e.file] = e;
  stage_kept_files(dir, staging, per_op);

  for (const auto& [op_name, cases] : per_op) {
    const auto t0 = std::chrono::steady_clock::now();
    const ManifestEntry e = write_op_golden(*find_op(op_name), cases, staging / (op_name + ".h5"));
    manifest[e.file] = e;
    out << "  " << std::left << std::setw(24) << op_name << std::right << std::setw(6)
        << cases.size() << " cases " << std::setw(12) << fmt_bytes(e.size) << "  " << std::fixed
        << std::setprecision(1) << seconds_since(t0) << " s\n";
  }
  std::vector<ManifestEntry> entries;
  for (const auto& [file, e] : manifest)
    if (fs::exists(staging / file)) entries.push_back(e);
  write_manifest(staging.string(), entries);
  swap_directories(staging, dir);
  fs::remove_all(staging);  // now the old set
  return report_golden_budget(entries, out);
}

namespace {

struct ManifestCheck {
  std::map<std::string, ManifestEntry> entries;
  bool readable = true;
};

// What golden_verify found wrong, one line each, flushed: a verify that is killed (or a reader
// that dies) loses nothing it said.
struct VerifyLog {
  std::ostream& out;
  int problems = 0;
  void fail(const std::string& s) {
    ++problems;
    out << "  FAIL " << s << std::endl;
  }
};

ManifestCheck read_manifest_check(const std::string& dir, VerifyLog& log) {
  ManifestCheck man;
  try {
    for (const auto& e : read_manifest(dir)) man.entries[e.file] = e;
  } catch (const std::exception& e) {
    man.readable = false;
    log.fail(e.what());
  }
  return man;
}

// The directory as a whole: only <op>.h5 files of ops with smoke/quick cases and MANIFEST, and
// every file MANIFEST lists present.
void verify_golden_dir(const std::string& dir, const ManifestCheck& man,
                       const std::map<std::string, std::vector<Case>>& per_op, VerifyLog& log) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename() == "MANIFEST") continue;
    if (e.path().extension() != ".h5") {
      log.fail(e.path().string() +
               ": not a golden file and not MANIFEST (a leftover? golden/ "
               "holds only <op>.h5 and MANIFEST)");
      continue;
    }
    const std::string op = e.path().stem().string();
    if (!per_op.count(op))
      log.fail(e.path().string() + ": no case file has smoke/quick cases for op '" + op +
               "' (stale golden: delete it, then `attncheck golden generate`)");
  }
  for (const auto& [file, entry] : man.entries)
    if (!fs::exists(fs::path(dir) / file))
      log.fail((fs::path(dir) / "MANIFEST").string() + " lists " + file + ", which does not exist");
}

// What a path that is no regular file is, for the message.
const char* file_kind(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  return fs::is_directory(st)        ? "a directory"
         : fs::is_fifo(st)           ? "a FIFO"
         : fs::is_character_file(st) ? "a character device"
         : fs::is_block_file(st)     ? "a block device"
         : fs::is_socket(st)         ? "a socket"
         : fs::exists(st)            ? "not a regular file"
                                     : "a dangling symbolic link";
}

// One op's golden file against MANIFEST: present, a regular file, listed, of the listed size and
// sha256. False when the file cannot be checked further (missing or not a regular file).
bool verify_golden_file(const std::string& dir, const std::string& op_name, size_t cases,
                        const ManifestCheck& man, VerifyLog& log) {
  const std::string file = op_name + ".h5";
  const std::string path = (fs::path(dir) / file).string();
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) {
    log.fail(path + " missing: " + std::to_string(cases) + " smoke/quick cases of '" + op_name +
             "' have no golden (run `attncheck golden generate --op " + op_name + "`)");
    return false;
  }
  // A directory, FIFO, socket or device (also behind a symlink) is reported and skipped: a
  // FIFO would block the hash, /dev/zero never end it.
  if (!fs::is_regular_file(path, ec)) {
    log.fail(path + " is " + file_kind(path) + ", not a golden file (not read)");
    return false;
  }
  const auto it = man.entries.find(file);
  if (man.readable && it == man.entries.end()) {
    log.fail(path + " is not listed in " + (fs::path(dir) / "MANIFEST").string());
  } else if (it != man.entries.end()) {
    const uint64_t size = fs::file_size(path);
    const std::string sha = sha256_file(path);
    if (size != it->second.size)
      log.fail(path + ": " + std::to_string(size) + " bytes, MANIFEST says " +
               std::to_string(it->second.size) + " (truncated or replaced)");
    if (sha != it->second.sha256)
      log.fail(path + ": sha256 " + sha + " does not match MANIFEST (" + it->second.sha256 +
               "): the file is corrupt or was changed outside `attncheck golden generate`");
  }
  return true;
}

struct OpVerified {
  int cases = 0;
  double worst_ratio = 0;  // the largest drift, as a fraction of the storage bound
};

// Every case of one op against its golden: stored, recomputed within the storage bound; stored
// ids that are no longer cases, and metadata that changed, are problems too.
OpVerified verify_op_cases(const std::string& path, const std::string& op_name,
                           const std::vector<Case>& cases, GoldenStore& store, VerifyLog& log) {
  OpVerified v;
  std::vector<std::string> stored;
  try {
    stored = store.case_ids(op_name);
  } catch (const std::exception& e) {
    log.fail(std::string("cannot read golden: ") + e.what());
    v.cases = -1;
    return v;
  }
  try {
    for (const auto& why : store.metadata_problems(op_name, cases)) log.fail(why);
  } catch (const std::exception& e) {
    log.fail(std::string("cannot read golden metadata: ") + e.what());
  }
  std::set<std::string> stored_set(stored.begin(), stored.end()), wanted;
  for (const auto& c : cases) wanted.insert(c.id);
  for (const auto& id : stored)
    if (!wanted.count(id))
      log.fail(path + " holds '" + id + "', which is no longer a smoke/quick case (regenerate)");
  for (const auto& c : cases) {
    if (!stored_set.count(c.id)) {
      log.fail(c.id + " (" + c.source + "): no golden (run `attncheck golden generate --op " +
               op_name + "`)");
      continue;
    }
    try {
      const Result r = verify_case(c, store);
      if (r.failing()) {
        log.fail(c.id + ": " + r.message);
        continue;
      }
      for (const auto& ch : r.checks)
        if (std::isfinite(ch.metrics.worst.ratio))
          v.worst_ratio = std::max(v.worst_ratio, ch.metrics.worst.ratio);
      ++v.cases;
    } catch (const std::exception& e) {
      log.fail(c.id + ": cannot read its golden: " + e.what());
    }
  }
  return v;
}

}  // namespace

int golden_verify(const std::vector<CaseFile>& files, const GoldenOptions& opt, std::ostream& out) {
  const auto per_op = golden_cases(files, opt.ops);
  VerifyLog log{out};
  const std::string dir = opt.dir;
  const ManifestCheck man = read_manifest_check(dir, log);
  if (opt.ops.empty()) verify_golden_dir(dir, man, per_op, log);

  GoldenStore store(dir);
  for (const auto& [op_name, cases] : per_op) {
    const auto t0 = std::chrono::steady_clock::now();
    const int before = log.problems;
    const std::string file = op_name + ".h5";
    if (!verify_golden_file(dir, op_name, cases.size(), man, log)) continue;
    if (opt.manifest_only) {
      if (log.problems == before) out << "  ok   " << file << " matches MANIFEST" << std::endl;
      continue;
    }
    // Only a file that matches its MANIFEST line is parsed (GoldenStore checks again, and reads
    // it once in a child process first).
    if (log.problems != before || !man.readable) {
      out << "  FAIL " << std::left << std::setw(24) << op_name << std::right
          << " not parsed: the file does not match MANIFEST" << std::endl;
      continue;
    }
    const OpVerified v =
        verify_op_cases((fs::path(dir) / file).string(), op_name, cases, store, log);
    if (v.cases < 0) continue;
    out << "  " << (log.problems == before ? "ok   " : "FAIL ") << std::left << std::setw(24)
        << op_name << std::right << std::setw(5) << v.cases << "/" << cases.size()
        << " cases verified"
        << "  worst drift " << std::setprecision(2) << v.worst_ratio << " of the storage bound  "
        << std::fixed << std::setprecision(1) << seconds_since(t0) << " s" << std::endl
        << std::defaultfloat;
  }
  return log.problems;
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
