// `attncheck mutants`: several kernel libraries (the mutant libraries of a build) over their cases
// in one pool, a results directory per library. One worker process per GPU opens every library
// beside the others (run/worker.h "Several libraries"), so a GPU has one context, and the
// selection, the golden checks and the workers' start are done once, not once per library
// (docs/cli.md, docs/results.md).
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "cli/case_run.h"
#include "cli/run_parts.h"
#include "run/results.h"

namespace attncheck::cli {

namespace fs = std::filesystem;

namespace {

// --library LIB[=op,op...]: the path and its ops. Throws std::invalid_argument.
LibraryRun parse_library(const std::string& spec) {
  LibraryRun lib;
  const auto eq = spec.find('=');
  lib.path = spec.substr(0, eq);
  if (lib.path.empty()) throw std::invalid_argument("--library '" + spec + "': no path");
  if (lib.path.rfind("py:", 0) == 0)
    throw std::invalid_argument("--library '" + spec +
                                "': a py: adapter runs in a process of its own (attncheck run)");
  if (!fs::is_regular_file(lib.path))
    throw std::invalid_argument("--library '" + spec + "': '" + lib.path + "' is not a file");
  lib.path = fs::absolute(lib.path).string();
  if (eq != std::string::npos) {
    std::istringstream in(spec.substr(eq + 1));
    for (std::string op; std::getline(in, op, ',');) {
      if (op.empty()) continue;
      if (!find_op(op))
        throw std::invalid_argument("--library '" + spec + "': unknown op '" + op + "'");
      lib.ops.insert(op);
    }
    if (lib.ops.empty()) throw std::invalid_argument("--library '" + spec + "': no op after '='");
  }
  // libattncheck_kernels_mutant_<name>.so -> <name>; any other library by its file's stem.
  std::string stem = fs::path(lib.path).stem().string();
  if (const auto m = stem.find("_mutant_"); m != std::string::npos) stem = stem.substr(m + 8);
  // A directory under --out: one plain name ("..", "", or "a b" would not be one).
  const bool plain = !stem.empty() && stem != "." && stem != ".." &&
                     std::all_of(stem.begin(), stem.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
                              c == '.' || c == '+';
                     });
  if (!plain)
    throw std::invalid_argument("--library '" + spec + "': its name '" + stem +
                                "' cannot name a results directory (letters, digits, _ - . +)");
  lib.name = stem;
  return lib;
}

}  // namespace

namespace {

// --first NAME=REGEX: the cases of library NAME (its results directory's name) to send first.
bool parse_first(const MutantsArgs& m, std::vector<LibraryRun>& libs) {
  try {
    for (const auto& spec : m.first) {
      const auto eq = spec.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
        throw std::invalid_argument("--first '" + spec + "': expected NAME=REGEX");
      const std::string name = spec.substr(0, eq);
      const auto lib = std::find_if(libs.begin(), libs.end(),
                                    [&](const LibraryRun& l) { return l.name == name; });
      if (lib == libs.end())
        throw std::invalid_argument("--first '" + spec + "': no --library named '" + name + "'");
      if (lib->first)
        throw std::invalid_argument("--first '" + spec + "': a second --first for '" + name + "'");
      lib->first.emplace(spec.substr(eq + 1), "--first " + name);
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return false;
  }
  return true;
}

// The libraries of --library, each once by name (their results directories would clash).
bool parse_libraries(const MutantsArgs& m, std::vector<LibraryRun>& libs) {
  try {
    std::set<std::string> names;
    for (const auto& spec : m.libraries) {
      libs.push_back(parse_library(spec));
      if (!names.insert(libs.back().name).second)
        throw std::invalid_argument("--library '" + spec + "': a second library named '" +
                                    libs.back().name + "' (their results directories would clash)");
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "attncheck: " << e.what() << "\n";
    return false;
  }
  if (libs.empty()) {
    std::cerr << "attncheck: mutants: no --library given\n";
    return false;
  }
  if (!parse_first(m, libs)) return false;
  if (m.run.out.empty()) {
    std::cerr << "attncheck: mutants: --out is required (a results directory per library)\n";
    return false;
  }
  return true;
}

// Per library: its set-aside cases, run.json, junit.xml and a row of the table.
int finish_mutants(CaseRun& run) {
  const RunArgs& a = run.args;
  int status = 0;
  std::cout << "\n  library                                  cases  compared  failing  skipped\n";
  for (size_t k = 0; k < run.libs.size(); ++k) {
    const LibraryRun& l = run.libs[k];
    try {
      run.record_set_aside(k);
      run.write_outputs(k, false, &l.summary);
    } catch (const std::exception& e) {
      std::cerr << "attncheck: " << e.what() << "\n";
      status = 2;
    }
    int64_t skipped = 0;
    for (const auto& [op, verdicts] : l.summary.per_op)
      if (const auto it = verdicts.find(Verdict::skipped); it != verdicts.end())
        skipped += it->second;
    std::cout << "  " << std::left << std::setw(40) << l.name << std::right << std::setw(6)
              << l.cases.size() << std::setw(10) << l.summary.compared << std::setw(9)
              << l.summary.failures << std::setw(9) << skipped << "\n";
    l.summary.print_not_provided(std::cout);  // a Python adapter's ops it lacks, once
  }
  if (a.profile)
    print_profile(run.all, run.wall_s, run.parent_s, run.pool_use, run.plan.jobs,
                  run.plan.processes());
  std::cout << "wall time " << std::fixed << std::setprecision(1) << run.wall_s
            << " s\nresults: " << fs::absolute(a.out).string() << "/<library>\n";
  // Failing cases are what a mutant is for: the report judges them (mutation analysis). Only a
  // run that compared nothing at all is a failed gate here.
  const bool compared = std::any_of(run.libs.begin(), run.libs.end(),
                                    [](const LibraryRun& l) { return l.summary.compared > 0; });
  if (status == 0 && !compared) {
    std::cout << "NOTHING COMPARED: no library compared a kernel output\n";
    status = 1;
  }
  return status;
}

}  // namespace

int cmd_mutants(const Paths& paths, const MutantsArgs& m) {
  std::vector<LibraryRun> libs;
  if (!parse_libraries(m, libs)) return 2;
  CaseRun run(paths, m.run, std::move(libs), true);
  if (const int status = run.prepare()) return status;
  if (const int status = run.execute()) return status;
  return finish_mutants(run);
}

}  // namespace attncheck::cli
