#include "results.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/hdf5io.h"
#include "core/safe_output.h"
#include "run/partial.h"
#include "run/sha256.h"

namespace attncheck {

namespace fs = std::filesystem;

namespace {

// The summary table's columns: every verdict, and how many cases compared a kernel's output.
constexpr Verdict kColumns[] = {Verdict::passed,
                                Verdict::failed,
                                Verdict::refused_as_expected,
                                Verdict::known_bug,
                                Verdict::unexpected_pass,
                                Verdict::unsupported,
                                Verdict::skipped,
                                Verdict::error};
constexpr const char* kHeadings[] = {"passed", "failed",      "refused", "known_bug",
                                     "xpass",  "unsupported", "skipped", "error"};

std::string xml_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&apos;";
        break;
      case '\n':
        o += "&#10;";
        break;
      case '\t':
        o += "&#9;";
        break;
      default:
        if (c < 0x20)
          o += ' ';  // not allowed in XML 1.0
        else
          o += static_cast<char>(c);
    }
  }
  return o;
}

std::string text_of(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    std::ostringstream os;
    os << std::setprecision(6) << v.get<double>();
    return os.str();
  }
  return v.dump();
}

double seconds_of(const nlohmann::json& r) {
  double ms = 0;
  if (r.contains("timings_ms"))
    for (const auto& [k, v] : r["timings_ms"].items())
      if (v.is_number()) ms += v.get<double>();
  return ms / 1e3;
}

}  // namespace

std::string id_to_filename(const std::string& id) {
  std::string s;
  for (const char c : id) {
    if (c == '/')
      s += "__";
    else if (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._+=-", c))
      s += c;
    else
      s += '_';
  }
  if (s.empty() || s[0] == '.' || s[0] == '-') s.insert(0, "_");
  // NAME_MAX is 255; ".h5" and the temporary suffix ".tmp.<16 hex>" still have to fit.
  constexpr size_t kMaxName = 180;
  if (s.size() > kMaxName) s = s.substr(0, kMaxName - 17) + "_" + sha256_hex(id).substr(0, 16);
  return s;
}

JsonlWriter::JsonlWriter(const std::string& path)
    : path_(path), out_(path, OutputStream::Mode::fresh) {}

void JsonlWriter::append(const std::string& line) {
  // One write per line, straight to the file (no user-space buffer to lose in a crash).
  out_.write(line + "\n");
}

void Summary::add(const Result& r) {
  if (!r.not_provided_by.empty()) {
    ++not_provided[r.not_provided_by][r.op];
    return;
  }
  if (!r.partial.is_null() && r.mode == Mode::kernel)
    ++partial[r.kernel_entry.empty() ? r.op : r.kernel_entry]
             [partial_from_json(r.partial).describe()];
  ++per_op[r.op][r.verdict];
  if (r.mode == Mode::kernel) ++kernel_mode[r.op];
  if (r.mode != Mode::none) ++compared;
  if (r.failing()) ++failures;
}

void Summary::print(std::ostream& out) const {
  size_t w = 8;
  for (const auto& [op, counts] : per_op) w = std::max(w, op.size() + 2);
  out << std::left << std::setw(static_cast<int>(w)) << "op" << std::right;
  for (const char* h : kHeadings) out << std::setw(12) << h;
  out << std::setw(12) << "kernel_run"
      << "\n";
  std::map<Verdict, int64_t> total;
  int64_t total_kernel = 0;
  for (const auto& [op, counts] : per_op) {
    out << std::left << std::setw(static_cast<int>(w)) << op << std::right;
    for (Verdict v : kColumns) {
      const auto it = counts.find(v);
      const int64_t n = it == counts.end() ? 0 : it->second;
      total[v] += n;
      out << std::setw(12) << n;
    }
    const auto k = kernel_mode.find(op);
    const int64_t nk = k == kernel_mode.end() ? 0 : k->second;
    total_kernel += nk;
    out << std::setw(12) << nk << "\n";
  }
  out << std::left << std::setw(static_cast<int>(w)) << "total" << std::right;
  for (Verdict v : kColumns) out << std::setw(12) << total[v];
  out << std::setw(12) << total_kernel << "\n";
  print_not_provided(out);
  for (const auto& [entry, contracts] : partial)
    for (const auto& [contract, n] : contracts)
      out << "partial contract: " << entry << ": " << n << " case(s) judged with " << contract
          << "\n";
}

void Summary::print_not_provided(std::ostream& out) const {
  for (const auto& [adapter, ops] : not_provided) {
    int64_t cases = 0;
    std::string list;
    for (const auto& [op, n] : ops) {
      cases += n;
      list += (list.empty() ? "" : ", ") + op + " " + std::to_string(n);
    }
    out << "not provided by " << adapter << ": " << ops.size() << " op(s), " << cases
        << " case(s), not run (" << list << ")\n";
  }
}

std::string junit_xml(const std::vector<const Result*>& results, const std::string& suite_name) {
  std::vector<nlohmann::json> records;
  records.reserve(results.size());
  for (const Result* r : results) records.push_back(r->to_json());
  return junit_xml(records, suite_name);
}

std::string junit_xml(const std::vector<nlohmann::json>& results, const std::string& suite_name) {
  std::map<std::string, std::vector<const nlohmann::json*>> by_op;
  for (const auto& r : results) by_op[r.value("op", "?")].push_back(&r);
  std::ostringstream os;
  int64_t tests = 0, failures = 0, errors = 0, skipped = 0;
  double time = 0;
  std::ostringstream suites;
  for (const auto& [op, rs] : by_op) {
    int64_t f = 0, e = 0, s = 0;
    double t = 0;
    std::ostringstream cases;
    for (const auto* r : rs) {
      const std::string v = r->value("verdict", "error");
      const double sec = seconds_of(*r);
      t += sec;
      cases << "    <testcase classname=\"" << xml_escape(op) << "\" name=\""
            << xml_escape(r->value("id", "?")) << "\" time=\"" << std::fixed << std::setprecision(3)
            << sec << std::defaultfloat << "\">\n";
      cases << "      <properties>\n";
      auto prop = [&](const std::string& name, const std::string& value) {
        cases << "        <property name=\"" << xml_escape(name) << "\" value=\""
              << xml_escape(value) << "\"/>\n";
      };
      prop("verdict", v);
      prop("mode", r->value("mode", ""));
      prop("arch", r->value("arch", ""));
      if (r->contains("contract")) prop("contract", r->value("contract", ""));
      if (r->contains("partial") && !(*r)["partial"].is_null())
        prop("partial", (*r)["partial"].dump());
      if (r->contains("params")) prop("params", (*r)["params"].dump());
      if (r->contains("checks"))
        for (const auto& c : (*r)["checks"]) {
          const std::string n = c.value("name", "?");
          prop(n + ".passed", c.value("passed", false) ? "true" : "false");
          for (const auto& [k, val] : c["budget"].items())
            if (k != "why") prop(n + ".budget." + k, text_of(val));
          for (const auto& [k, val] : c["metrics"].items())
            if (k != "worst") prop(n + "." + k, text_of(val));
          if (c["metrics"].contains("worst")) prop(n + ".worst", c["metrics"]["worst"].dump());
        }
      cases << "      </properties>\n";
      const std::string msg = r->value("message", "");
      const std::string body = msg + "\nrepro: " + r->value("repro", "");
      if (r->value("failing", true) && v != "error") {
        ++f;
        cases << "      <failure message=\"" << xml_escape(msg) << "\">" << xml_escape(body)
              << "</failure>\n";
      } else if (r->value("failing", true)) {
        ++e;
        cases << "      <error message=\"" << xml_escape(msg) << "\">" << xml_escape(body)
              << "</error>\n";
      } else if (v == "skipped" || v == "known_bug" || v == "unsupported") {
        ++s;
        cases << "      <skipped message=\"" << xml_escape(v + ": " + msg) << "\"/>\n";
      }
      cases << "    </testcase>\n";
    }
    tests += static_cast<int64_t>(rs.size());
    failures += f;
    errors += e;
    skipped += s;
    time += t;
    suites << "  <testsuite name=\"" << xml_escape(op) << "\" tests=\"" << rs.size()
           << "\" failures=\"" << f << "\" errors=\"" << e << "\" skipped=\"" << s << "\" time=\""
           << std::fixed << std::setprecision(3) << t << std::defaultfloat << "\">\n"
           << cases.str() << "  </testsuite>\n";
  }
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"" << xml_escape(suite_name)
     << "\" tests=\"" << tests << "\" failures=\"" << failures << "\" errors=\"" << errors
     << "\" skipped=\"" << skipped << "\" time=\"" << std::fixed << std::setprecision(3) << time
     << "\">\n"
     << suites.str() << "</testsuites>\n";
  return os.str();
}

void write_file_atomic(const std::string& path, const std::string& text) {
  write_file_safely(path, text);
}

void write_repro_bundle(const std::string& path, const Result& r, const CaseArtifacts& a,
                        const nlohmann::json& meta) {
  const std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  H5File f = H5File::create(path);
  const nlohmann::json rj = r.to_json();
  f.set_attr("/", "id", r.id);
  f.set_attr("/", "op", r.op);
  f.set_attr_json("/", "params", r.params);
  f.set_attr_json("/", "kernel_params", a.problem.kernel_params);
  f.set_attr("/", "kernel", a.problem.kernel);
  f.set_attr("/", "expect_refusal", a.problem.expect_refusal.value_or(""));
  f.set_attr("/", "verdict", std::string(verdict_name(r.verdict)));
  f.set_attr("/", "mode", std::string(mode_name(r.mode)));
  f.set_attr("/", "message", r.message);
  f.set_attr("/", "repro", r.repro);
  f.set_attr("/", "arch", r.arch);
  f.set_attr_json("/", "checks", rj["checks"]);
  f.set_attr_json("/", "meta", meta);
  f.create_group("inputs");
  f.create_group("expected");
  f.create_group("actual");
  // Arguments that share a storage (a V view inside K's cache) carry the same "storage" number,
  // so that a reader (repro --export pytest) can rebuild the one buffer they share.
  std::vector<const Storage*> storages;
  for (const auto& arg : a.problem.args) {
    const std::string ds = "inputs/" + arg.name;
    const Storage& st = *arg.tensor.storage();
    auto seen = std::find(storages.begin(), storages.end(), &st);
    if (seen == storages.end()) seen = storages.insert(storages.end(), &st);
    nlohmann::json layout = {{"shape", arg.tensor.shape()},
                             {"strides", arg.tensor.strides()},
                             {"offset", arg.tensor.offset()},
                             {"storage_bytes", st.bytes.size()},
                             {"storage", seen - storages.begin()}};
    if (st.sparse()) {
      // A large-offset storage (docs/abi.md "Sparse storages"): the host holds only its window,
      // so the bundle holds that window, flat, in storage order; the rest of the extent is NaN
      // poison the device writes, never data.
      const auto es = static_cast<int64_t>(arg.tensor.element_size());
      const auto first = static_cast<int64_t>(st.window_begin) / es;
      const auto count = static_cast<int64_t>(st.bytes.size()) / es;
      const auto all = static_cast<int64_t>(st.extent) / es;
      f.write_tensor(ds, Tensor::sparse(arg.tensor.dtype(), {all}, first, count)
                             .rebased(arg.tensor.storage())
                             .slice(0, first, first + count));
      layout["sparse"] = {{"extent_bytes", st.extent},
                          {"window_begin_bytes", st.window_begin},
                          {"held_elements", {first, first + count}},  // [begin, end)
                          {"note",
                           "the dataset is the host-held window of the storage, flat; the view's "
                           "offset and strides index the whole extent, whose other bytes are "
                           "poison on the device (the dtype's NaN code, 0xFF bytes for integer and "
                           "raw dtypes)"}};
    } else {
      f.write_tensor(ds, arg.tensor);
    }
    f.set_attr(ds, "role",
               arg.role == Role::input    ? "input"
               : arg.role == Role::output ? "output (initial contents)"
                                          : "inout (initial contents)");
    f.set_attr_json(ds, "layout", layout);
  }
  for (const auto& [name, t] : a.expected) f.write_tensor("expected/" + name, t);
  for (const auto& [name, t] : a.actual) f.write_tensor("actual/" + name, t);
  f.commit();
}

std::string check_repro_bundle(const std::string& path, double timeout_s) {
  return read_in_child(
      [&] {
        const H5File f = H5File::open(path);
        for (const char* name : {"id", "op", "kernel", "expect_refusal", "verdict", "mode",
                                 "message", "repro", "arch"})
          (void)f.attr_string("/", name);
        for (const char* name : {"params", "kernel_params", "checks", "meta"})
          (void)f.attr_json("/", name);
        for (const char* group : {"inputs", "expected", "actual"})
          for (const auto& name : f.children(group)) {
            const std::string ds = std::string(group) + "/" + name;
            (void)f.read_tensor(ds);
            if (std::string(group) == "inputs") {
              (void)f.attr_string(ds, "role");
              (void)f.attr_json(ds, "layout");
            }
          }
      },
      timeout_s);
}

std::vector<WorstElement> worst_elements(const Tensor& expected, const Tensor& actual,
                                         const Budget& b, size_t n) {
  std::vector<WorstElement> all;
  if (expected.shape() != actual.shape() || n == 0) return all;
  const double inf = std::numeric_limits<double>::infinity();
  if (b.kind == Budget::Kind::numeric) {
    expected.for_each_index([&](const Index& idx, int64_t) {
      const double e = expected.get(idx), a = actual.get(idx);
      double err, ratio;
      if (std::isnan(e) || std::isnan(a)) {
        err = ratio = inf;
      } else if (std::isinf(e) || std::isinf(a)) {
        err = ratio = e == a ? 0.0 : inf;
      } else {
        err = std::fabs(a - e);
        const double allow = b.atol + b.rtol * std::fabs(e);
        ratio = allow > 0 ? err / allow : (err > 0 ? inf : 0.0);
      }
      if (ratio > 0) all.push_back({idx, e, a, err, ratio});
    });
    const size_t k = std::min(n, all.size());
    std::partial_sort(
        all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end(),
        [](const WorstElement& x, const WorstElement& y) { return x.ratio > y.ratio; });
    all.resize(k);
    return all;
  }
  // Exact (and top-k index) outputs: the first elements whose bits differ.
  expected.for_each_index([&](const Index& idx, int64_t) {
    if (all.size() >= n) return;
    if (expected.dtype() == actual.dtype() && expected.get_bits(idx) == actual.get_bits(idx))
      return;
    const double e = expected.get(idx), a = actual.get(idx);
    if (expected.dtype() != actual.dtype() && e == a) return;
    all.push_back({idx, e, a, std::fabs(a - e), inf});
  });
  return all;
}

}  // namespace attncheck
