// The write side of a run (run/results.h) and golden transactions (run/golden.h): bundle names
// from hostile ids, writers that refuse non-regular targets and report failed writes, and golden
// files whose bytes do not depend on the checkout they were generated in.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "run/golden.h"
#include "run/results.h"
#include "run/sha256.h"
#include "core/tests/test_util.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

fs::path scratch() {
  return testing_util::fresh_test_dir("results_io");
}

// Regression: '/' was the only byte rewritten, so an id could name "..", hold a newline, or be
// longer than a file name may be.
TEST(BundleNames, AreOnePlainFileNameWhateverTheIdHolds) {
  EXPECT_EQ(id_to_filename("mla_decode/h8-bs16-q3-bf16"), "mla_decode__h8-bs16-q3-bf16");
  const std::string hostile[] = {"../../etc/passwd",
                                 "op/..",
                                 "..",
                                 "/abs/path",
                                 "op/a\nb\\c",
                                 "op/-rf",
                                 std::string("op/a\0b", 6),
                                 "op/" + std::string(600, 'x'),
                                 "op/ünïcode/../x",
                                 ""};
  for (const auto& id : hostile) {
    const std::string name = id_to_filename(id);
    SCOPED_TRACE(name);
    EXPECT_FALSE(name.empty());
    EXPECT_LE(name.size(), 180u);
    EXPECT_NE(name[0], '.');
    EXPECT_NE(name[0], '-');
    for (const char c : name)
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._+=-", c))
          << "byte " << static_cast<int>(static_cast<unsigned char>(c));
    // Joined to a directory, it stays there.
    const fs::path joined = fs::path("/out/repro") / (name + ".h5");
    EXPECT_EQ(joined.lexically_normal().parent_path(), fs::path("/out/repro"));
  }
  // Long ids stay distinct.
  EXPECT_NE(id_to_filename("op/" + std::string(600, 'x') + "a"),
            id_to_filename("op/" + std::string(600, 'x') + "b"));
}

TEST(Writers, RefuseToReplaceWhatIsNotARegularFile) {
  const fs::path d = scratch();
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  fs::create_directories(d / "dir");
  fs::create_symlink(d / "target", d / "link");
  for (const char* name : {"fifo", "dir", "link"}) {
    const std::string path = (d / name).string();
    try {
      write_file_atomic(path, "x");
      ADD_FAILURE() << name << " was replaced";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("refusing to replace '" + path + "'"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(JsonlWriter{path}, std::runtime_error) << name;
  }
  EXPECT_FALSE(fs::exists(d / "target"));
  struct stat st {};
  ASSERT_EQ(::lstat((d / "fifo").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  // Nothing temporary is left behind, and a regular file is replaced.
  write_file_atomic((d / "file").string(), "one");
  write_file_atomic((d / "file").string(), "two");
  std::ifstream in(d / "file");
  std::string text;
  in >> text;
  EXPECT_EQ(text, "two");
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 4);
  fs::remove_all(d);
}

// Regression: results.jsonl was written through an unchecked ofstream: a full disk lost results
// silently. The file-size limit makes the write fail the way ENOSPC does.
TEST(Writers, AFailedWriteThrowsNamingTheFile) {
  const fs::path d = scratch();
  const std::string path = (d / "results.jsonl").string();
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string what;
  try {
    JsonlWriter w(path);
    for (int i = 0; i < 100; ++i) w.append(std::string(100, 'x'));
  } catch (const std::runtime_error& e) {
    what = e.what();
  }
  try {
    write_file_atomic((d / "run.json").string(), std::string(10000, 'y'));
  } catch (const std::runtime_error& e) {
    what += std::string("\n") + e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(what.find("cannot write '" + path + "': write: File too large"), std::string::npos)
      << what;
  EXPECT_NE(what.find("cannot write '" + (d / "run.json").string() + "': write: "),
            std::string::npos)
      << what;
  EXPECT_FALSE(fs::exists(d / "run.json"));  // the temporary file is removed, nothing renamed
  fs::remove_all(d);
}

// Regression: goldens recorded the revision (with "+dirty") they were generated at, so a clean
// checkout regenerated different bytes for every file.
TEST(GoldenBytes, DoNotDependOnTheCheckout) {
  const fs::path d = scratch();
  fs::create_directories(d / "cases");
  std::ofstream(d / "cases" / "page_indices.toml") << R"(op = "page_indices"
[[group]]
name = "blocks"
tiers = { smoke = "pairwise" }
axes = { block_size = [1, 16], table = ["contiguous", "strided"] }
)";
  const auto files = load_case_dir((d / "cases").string());
  // Two checkouts: a clean git repository, and the same with a local change.
  auto sha_of_generate = [&](const std::string& name) {
    GoldenOptions opt;
    opt.root = (d / name).string();
    opt.dir = (d / name / "golden").string();
    std::ostringstream log;
    EXPECT_EQ(golden_generate(files, opt, log), 0) << log.str();
    return sha256_file(opt.dir + "/page_indices.h5") + " " + sha256_file(opt.dir + "/MANIFEST");
  };
  const std::string git = "git -c user.name=t -c user.email=t@t -c init.defaultBranch=main ";
  for (const char* name : {"clean", "dirty"}) {
    fs::create_directories(d / name / "reference");
    std::ofstream(d / name / "reference" / "x.cpp") << "int x;\n";
    ASSERT_EQ(std::system((git + "-C " + (d / name).string() + " init -q && " + git + "-C " +
                           (d / name).string() + " add -A && " + git + "-C " + (d / name).string() +
                           " commit -qm " + name)
                              .c_str()),
              0);
  }
  std::ofstream(d / "dirty" / "reference" / "x.cpp") << "int y;\n";
  EXPECT_EQ(sha_of_generate("clean"), sha_of_generate("dirty"));
  fs::remove_all(d);
}

}  // namespace
}  // namespace attncheck
