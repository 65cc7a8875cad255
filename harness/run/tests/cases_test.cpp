// Case files: expansion counts, pairwise coverage (proven pair by pair), exclusion, known-bug
// marks, selection and sharding, pinned ids, and the error for every kind of malformed file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "ops/op.h"
#include "run/cases.h"
#include "run/covering.h"
#include "run/provenance.h"
#include "core/tests/test_util.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

class CaseFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing_util::fresh_test_dir("cases"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  // The CaseFileError message of loading `text`, or "" when it loads.
  std::string error_of(const std::string& text) {
    const auto p = write("bad.toml", text);
    try {
      (void)load_case_file(p);
    } catch (const CaseFileError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

std::vector<std::string> ids(const std::vector<Case>& cs) {
  std::vector<std::string> v;
  for (const auto& c : cs) v.push_back(c.id);
  return v;
}

TEST_F(CaseFiles, CartesianCountsAndExcludes) {
  const auto f = load_case_file(write("a.toml", R"(
op = "selftest_axpy"
[[group]]
name = "all"
tiers = { smoke = "cartesian" }
axes = { heads = [1, 2, 4], dtype = ["f32", "bf16"], n = [8, 9] }
exclude = [ { heads = 4, dtype = "bf16" }, { n = 9, heads = [1, 2], dtype = "f32" } ]
)"));
  // 12 combinations, minus 2 (heads 4 bf16, both n), minus 2 (n 9 f32 heads 1|2).
  ASSERT_EQ(f.tiers.at("smoke").size(), 8u);
  for (const auto& c : f.tiers.at("smoke")) {
    EXPECT_FALSE(c.params["heads"] == 4 && c.params["dtype"] == "bf16") << c.id;
    EXPECT_FALSE(c.params["n"] == 9 && c.params["dtype"] == "f32" && c.params["heads"] != 4)
        << c.id;
    EXPECT_EQ(c.source, (dir_ / "a.toml").string() + ":3");
  }
}

TEST_F(CaseFiles, IdsOfAFixedFileArePinned) {
  // Changing expansion order or the covering generator changes these: goldens and CI history key
  // on ids, so such a change must be deliberate.
  const auto f = load_case_file(write("pinned.toml", R"(
op = "selftest_axpy"
[defaults]
n = 16
[[group]]
name = "pairs"
tiers = { smoke = "pairwise", full = "cartesian" }
axes = { dtype = ["f32", "bf16"], heads = [1, 2, 4], layout = ["contiguous", "strided"] }
[[group]]
name = "seed bug"
tiers = { smoke = "list" }
cases = [ { heads = 3 }, { heads = 4, seed = 7, n = 5 } ]
)"));
  EXPECT_EQ(
      ids(f.tiers.at("smoke")),
      (std::vector<std::string>{
          "selftest_axpy/h1-n16-f32-contiguous-s0", "selftest_axpy/h1-n16-bf16-strided-s0",
          "selftest_axpy/h2-n16-f32-strided-s0", "selftest_axpy/h2-n16-bf16-contiguous-s0",
          "selftest_axpy/h4-n16-f32-contiguous-s0", "selftest_axpy/h4-n16-bf16-strided-s0",
          "selftest_axpy/h3-n16-f32-contiguous-s0", "selftest_axpy/h4-n5-f32-contiguous-s7"}));
  // full: its 12 own cases, then the 2 smoke cases it lacks (tiers nest).
  EXPECT_EQ(f.tiers.at("full").size(), 14u);
  EXPECT_EQ(ids(f.tiers.at("quick")), ids(f.tiers.at("smoke")));
  // Tier membership is recorded on every case.
  EXPECT_EQ(f.tiers.at("smoke")[0].tiers, (std::vector<std::string>{"smoke", "quick", "full"}));
  EXPECT_EQ(f.tiers.at("full").back().id, "selftest_axpy/h4-n5-f32-contiguous-s7");
}

TEST_F(CaseFiles, TiersNestSmokeQuickFull) {
  const auto f = load_case_file(write("a.toml", R"(
op = "selftest_axpy"
[[group]]
name = "tiny"
tiers = { smoke = "list" }
cases = [ { heads = 1 }, { heads = 2 } ]
[[group]]
name = "wide"
tiers = { quick = "list", full = "list" }
cases = [ { heads = 4 }, { heads = 2 } ]
)"));
  EXPECT_EQ(ids(f.tiers.at("quick")),
            (std::vector<std::string>{"selftest_axpy/h4-n64-f32-contiguous-s0",
                                      "selftest_axpy/h2-n64-f32-contiguous-s0",
                                      "selftest_axpy/h1-n64-f32-contiguous-s0"}));
  EXPECT_EQ(ids(f.tiers.at("full")), ids(f.tiers.at("quick")));
  for (const auto& c : f.tiers.at("full"))
    EXPECT_TRUE(c.in_tier("full") && c.in_tier("quick")) << c.id;
  EXPECT_TRUE(f.tiers.at("quick").back().in_tier("smoke"));
}

// The repository's own case files: smoke within quick within full, for every op.
TEST(RepositoryCases, SmokeWithinQuickWithinFull) {
  for (const auto& f : load_case_dir((fs::path(default_root()) / "cases").string())) {
    auto id_set = [&](const char* tier) {
      std::set<std::string> s;
      if (f.tiers.count(tier))
        for (const auto& c : f.tiers.at(tier)) s.insert(c.id);
      return s;
    };
    const auto smoke = id_set("smoke"), quick = id_set("quick"), full = id_set("full");
    for (const auto& id : smoke) EXPECT_TRUE(quick.count(id)) << id << " is smoke, not quick";
    for (const auto& id : quick) EXPECT_TRUE(full.count(id)) << id << " is quick, not full";
  }
}

// Every quick case's problem launches an entry its op declares (Op::problem checks), so the entry
// list that `attncheck kernels --check` holds the libraries to is complete.
TEST(RepositoryCases, QuickProblemsUseDeclaredEntries) {
  for (const auto& f : load_case_dir((fs::path(default_root()) / "cases").string())) {
    if (!f.tiers.count("quick")) continue;
    const Op* op = find_op(f.op);
    ASSERT_NE(op, nullptr) << f.op;
    std::set<std::string> used;
    for (const auto& c : f.tiers.at("quick")) {
      try {
        used.insert(op->problem(c).kernel);
      } catch (const std::logic_error& e) {
        ADD_FAILURE() << c.id << ": " << e.what();
      }
    }
    for (const auto& e : op->kernel_entries())
      EXPECT_TRUE(used.count(e)) << f.op << ": no quick case launches entry '" << e << "'";
  }
}

TEST(Covering, EveryPairCoveredForManyShapes) {
  const std::vector<std::vector<int>> shapes = {
      {2, 2},          {3, 3, 3},    {4, 3, 3},    {2, 2, 2, 2, 2, 2, 2},
      {5, 4, 3, 2, 2}, {3, 3, 3, 3}, {1, 4, 1, 3}, {6, 2, 5, 3, 4, 2},
      {10, 10, 2}};
  for (const auto& counts : shapes) {
    const auto rows = pairwise_rows(counts);
    EXPECT_TRUE(uncovered_pairs(rows, counts).empty()) << "shape of " << counts.size() << " axes";
    // Never more rows than the cartesian product; never fewer than the two largest axes' product.
    std::vector<int> sorted = counts;
    std::sort(sorted.rbegin(), sorted.rend());
    size_t all = 1;
    for (int c : counts) all *= static_cast<size_t>(c);
    EXPECT_GE(rows.size(), static_cast<size_t>(sorted[0] * sorted[1]));
    EXPECT_LE(rows.size(), all);
    // Deterministic.
    EXPECT_EQ(rows, pairwise_rows(counts));
  }
  // Known optimum 9 for 3^4 (an orthogonal array); greedy stays close.
  EXPECT_LE(pairwise_rows({3, 3, 3, 3}).size(), 11u);
  // 2^7 needs 6 or more; greedy should not be far off.
  EXPECT_LE(pairwise_rows({2, 2, 2, 2, 2, 2, 2}).size(), 9u);
}

TEST(Covering, ConstraintsAreRespectedAndAllowedPairsCovered) {
  const std::vector<int> counts = {4, 3, 3, 2};
  // Forbid (a0=3, a1=0), (a1=2, a2=2, a3=1), and value 1 of axis 2 entirely.
  const std::vector<CoverConstraint> cons = {{{0, 3}, {1, 0}}, {{1, 2}, {2, 2}, {3, 1}}, {{2, 1}}};
  const auto rows = pairwise_rows(counts, cons);
  EXPECT_TRUE(uncovered_pairs(rows, counts, cons).empty());
  for (const auto& r : rows) {
    EXPECT_FALSE(r[0] == 3 && r[1] == 0);
    EXPECT_FALSE(r[1] == 2 && r[2] == 2 && r[3] == 1);
    EXPECT_NE(r[2], 1);
  }
  // The checker itself can fail: dropping a row leaves a pair uncovered.
  auto fewer = rows;
  fewer.pop_back();
  EXPECT_FALSE(uncovered_pairs(fewer, counts, cons).empty());
  // Cartesian with the same constraints: 72 - 6 (a0=3,a1=0) - ... counted by brute force.
  size_t expect = 0;
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 3; ++c)
        for (int d = 0; d < 2; ++d)
          if (!(a == 3 && b == 0) && !(b == 2 && c == 2 && d == 1) && c != 1) ++expect;
  EXPECT_EQ(cartesian_rows(counts, cons).size(), expect);
}

TEST_F(CaseFiles, PairwiseGroupCoversEveryValuePairOfTheFile) {
  const auto f = load_case_file(write("p.toml", R"(
op = "selftest_axpy"
[[group]]
name = "pairs"
tiers = { quick = "pairwise" }
axes = { heads = [1, 2, 4], n = [1, 15, 16, 17], dtype = ["f32", "bf16"], layout = ["contiguous", "strided"], seed = [0, 1, 2] }
exclude = [ { heads = 4, n = 1 } ]
)"));
  const auto& cs = f.tiers.at("quick");
  const std::vector<std::string> axes = {"heads", "n", "dtype", "layout", "seed"};
  std::set<std::string> held;
  for (const auto& c : cs) {
    EXPECT_FALSE(c.params["heads"] == 4 && c.params["n"] == 1);
    for (size_t a = 0; a < axes.size(); ++a)
      for (size_t b = a + 1; b < axes.size(); ++b)
        held.insert(axes[a] + "=" + c.params[axes[a]].dump() + "," + axes[b] + "=" +
                    c.params[axes[b]].dump());
  }
  const std::map<std::string, std::vector<std::string>> values = {
      {"heads", {"1", "2", "4"}},
      {"n", {"1", "15", "16", "17"}},
      {"dtype", {"\"f32\"", "\"bf16\""}},
      {"layout", {"\"contiguous\"", "\"strided\""}},
      {"seed", {"0", "1", "2"}}};
  for (size_t a = 0; a < axes.size(); ++a)
    for (size_t b = a + 1; b < axes.size(); ++b)
      for (const auto& x : values.at(axes[a]))
        for (const auto& y : values.at(axes[b])) {
          if (axes[a] == "heads" && axes[b] == "n" && x == "4" && y == "1") continue;
          EXPECT_TRUE(held.count(axes[a] + "=" + x + "," + axes[b] + "=" + y))
              << axes[a] << "=" << x << " with " << axes[b] << "=" << y << " never together";
        }
  EXPECT_LT(cs.size(), 3u * 4 * 2 * 2 * 3 / 4);  // much smaller than the cartesian product (144)
}

TEST_F(CaseFiles, KnownBugMarksAndArchScope) {
  const auto f = load_case_file(write("kb.toml", R"(
op = "selftest_axpy"
[[group]]
name = "g"
tiers = { smoke = "cartesian" }
axes = { heads = [1, 2], dtype = ["f32", "bf16"] }
[[known_bug]]
id = "h2-.*bf16"
arch = "gfx942"
reason = "upstream#1: bf16 two heads"
[[known_bug]]
id = "h1-n64-f32"
reason = "upstream#2: everywhere"
)"));
  int marked = 0;
  for (const auto& c : f.tiers.at("smoke")) {
    if (c.id == "selftest_axpy/h2-n64-bf16-contiguous-s0") {
      ASSERT_TRUE(c.known_bug);
      EXPECT_EQ(c.known_bug->arch, "gfx942");
      EXPECT_NE(c.known_bug->reason.find("upstream#1"), std::string::npos);
      ++marked;
    } else if (c.id == "selftest_axpy/h1-n64-f32-contiguous-s0") {
      ASSERT_TRUE(c.known_bug);
      EXPECT_EQ(c.known_bug->arch, "");
      ++marked;
    } else {
      EXPECT_FALSE(c.known_bug) << c.id;
    }
  }
  EXPECT_EQ(marked, 2);
}

TEST_F(CaseFiles, SeveralKnownBugsOnOneCaseKeepEachArch) {
  const auto f = load_case_file(write("kb2.toml", R"(
op = "selftest_axpy"
[[group]]
name = "g"
tiers = { smoke = "list" }
cases = [ { heads = 2 } ]
[[known_bug]]
id = "h2"
arch = "gfx942"
reason = "a#1"
[[known_bug]]
id = "f32"
arch = "gfx950"
reason = "b#2"
)"));
  const Case& c = f.tiers.at("smoke").at(0);
  ASSERT_TRUE(c.known_bug);
  EXPECT_EQ(c.known_bug->reason, "a#1 [arch gfx942]; b#2 [arch gfx950]");
  EXPECT_EQ(c.known_bug->arch, "(?:gfx942)|(?:gfx950)");
}

TEST_F(CaseFiles, SelectionFilterOpAndShards) {
  write("a.toml", R"(
op = "selftest_axpy"
[[group]]
name = "g"
tiers = { smoke = "cartesian", quick = "cartesian" }
axes = { heads = [1, 2, 4], dtype = ["f32", "bf16"], seed = [0, 1, 2] }
)");
  write("b.toml", R"(
op = "page_indices"
[[group]]
name = "g"
tiers = { smoke = "list" }
cases = [ { block_size = 1 }, { block_size = 16 }, { block_size = 64 } ]
)");
  const auto files = load_case_dir(dir_.string());
  ASSERT_EQ(files.size(), 2u);
  Selection all;
  const auto every = select_cases(files, all);
  ASSERT_EQ(every.size(), 21u);
  EXPECT_EQ(every.front().op, "selftest_axpy");  // a.toml sorts first

  Selection by_op;
  by_op.ops = {"page_indices"};
  EXPECT_EQ(select_cases(files, by_op).size(), 3u);
  Selection by_filter;
  by_filter.filter = "bf16-.*-s[12]$";
  EXPECT_EQ(select_cases(files, by_filter).size(), 6u);

  // Shards partition the tier, and a case's shard does not depend on the filter.
  std::multiset<std::string> seen;
  for (int i = 0; i < 4; ++i) {
    Selection s;
    s.shard = {i, 4};
    const auto part = select_cases(files, s);
    EXPECT_GE(part.size(), 5u);
    EXPECT_LE(part.size(), 6u);
    for (const auto& c : part) seen.insert(c.id);
    Selection filtered = s;
    filtered.filter = "bf16";
    for (const auto& c : select_cases(files, filtered))
      EXPECT_TRUE(
          std::any_of(part.begin(), part.end(), [&](const Case& x) { return x.id == c.id; }));
  }
  EXPECT_EQ(seen.size(), 21u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 21u);

  Selection quick;
  quick.tier = "quick";
  EXPECT_EQ(select_cases(files, quick).size(), 21u);  // 18 own + the 3 smoke-only cases
  Selection any;
  any.tier = "all";
  EXPECT_EQ(select_cases(files, any).size(), 21u);  // unique ids across tiers
  ASSERT_TRUE(find_case(files, "page_indices/bs64-b4-ctx300-contiguous-s0"));
  EXPECT_FALSE(find_case(files, "page_indices/bs2-b4-ctx300-contiguous-s0"));
}

TEST(Selection, BadArgumentsNameTheProblem) {
  std::vector<CaseFile> none;
  Selection s;
  s.tier = "nightly";
  EXPECT_THROW(
      {
        try {
          select_cases(none, s);
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "unknown tier 'nightly' (tiers: smoke, quick, full, bench, all)");
          throw;
        }
      },
      std::invalid_argument);
  s.tier = "smoke";
  s.ops = {"mla_decodee"};
  try {
    select_cases(none, s);
    ADD_FAILURE() << "unknown op accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown op 'mla_decodee' (registered: "),
              std::string::npos);
  }
  s.ops.clear();
  s.filter = "h(1";
  try {
    select_cases(none, s);
    ADD_FAILURE() << "bad regex accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bad --filter regex 'h(1'"), std::string::npos);
  }
  EXPECT_EQ(parse_shard("2/5").index, 2);
  EXPECT_EQ(parse_shard("2/5").count, 5);
  for (const char* bad : {"5/5", "1", "-1/2", "a/b", "1/0", "1/2/3"}) {
    try {
      (void)parse_shard(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("shard '") + bad + "'"), std::string::npos);
    }
  }
}

// Every malformed file names the file, the line and column, and the field.
TEST_F(CaseFiles, MalformedFilesGiveLocatedErrors) {
  const std::string p = (dir_ / "bad.toml").string();
  struct Bad {
    const char* text;
    std::string expect;
  };
  const std::vector<Bad> bad = {
      {"op = \"selftest_axpy\"\n[[group]\nname = 1\n", p + ":2:9: TOML syntax error: "},
      {"op = \"mla_decod\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\ncases=[{}]\n",
       p + ":1:6: op: unknown op 'mla_decod' (registered: "},
      {"[[group]]\nname=\"g\"\n", p + ":1:1: missing 'op = \"<op name>\"'"},
      {"op = "
       "\"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\naxes={heads=[1],"
       "hedas=[2]}\n",
       p + ":5:23: group 'g' axis 'hedas': unknown axis of op 'selftest_axpy' (axes: heads, n, "
           "dtype, layout, seed)"},
      {"op = "
       "\"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\naxes={heads=[1, "
       "5]}\n",
       p + ":5:17: group 'g' axis 'heads': selftest_axpy: axis 'heads' value 5 is not one of 1, 2, "
           "3, 4"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\naxes={dtype=["
       "\"f32\", 16]}\n",
       p + ":5:21: group 'g' axis 'dtype': selftest_axpy: axis 'dtype' expects a string, got 16"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={nightly=\"cartesian\"}\naxes={heads=["
       "1]}\n",
       p + ":4:16: group 'g' tiers: unknown tier 'nightly' (tiers: smoke, quick, full, bench)"},
      {"op = "
       "\"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"random\"}\naxes={heads=[1]}\n",
       p + ":4:14: group 'g' tiers.smoke: unknown expansion 'random' (expansions: cartesian, "
           "pairwise, list)"},
      {"op = "
       "\"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\naxes={heads=[1, "
       "2]}\nexclude=[{heads=[1,2]}]\n",
       p + ":2: group 'g' tier 'smoke' (cartesian) expands to no case: every combination is "
           "excluded"},
      {"op = "
       "\"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\naxes={heads=[1, "
       "2]}\nexclude=[{heads=4}]\n",
       p + ":6:10: group 'g' exclude: the rule matches no case of the group (heads takes none of "
           "the listed values in this group)"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\naxes={heads=[]}"
       "\n",
       p + ":5:13: group 'g' axis 'heads': empty list of values"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\n",
       p + ":2:1: group 'g': a tier uses 'list' but the group has no 'cases'"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\ncases=[{heads=1},{"
       "heads=1}]\n",
       p +
           ":5: duplicate case id 'selftest_axpy/h1-n64-f32-contiguous-s0' in tier 'smoke', also "
           "produced at " +
           p + ":5 (drop one, or exclude it from one group)"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\ncases=[{heads=1}]\n"
       "[[group]]\nname=\"h\"\ntiers={smoke=\"cartesian\"}\naxes={heads=[1]}\n",
       p +
           ":6: duplicate case id 'selftest_axpy/h1-n64-f32-contiguous-s0' in tier 'smoke', also "
           "produced at " +
           p + ":5 (drop one, or exclude it from one group)"},
      {"op = \"selftest_axpy\"\n[defaults]\nsead = 1\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}"
       "\ncases=[{}]\n",
       p + ":3:8: [defaults] sead: selftest_axpy: unknown axis 'sead'"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntier={smoke=\"list\"}\n",
       p + ":4:6: [[group]]: unknown field 'tier' (allowed: name, tiers, axes, exclude, cases, "
           "note)"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\ncases=[{heads=1}]\n"
       "[[known_bug]]\nid=\"h(\"\nreason=\"x\"\n",
       p + ":7:4: bad [[known_bug]] id regex 'h(': "},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\ncases=[{heads=1}]\n"
       "[[known_bug]]\nid=\"h4\"\nreason=\"x\"\n",
       p + ":6: [[known_bug]] id regex 'h4' matches no case of this file"},
      {"op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"pairwise\"}\ncases=[{heads=1}"
       "]\n",
       p + ":2:1: group 'g': a tier expands 'cartesian' or 'pairwise' but the group has no 'axes'"},
  };
  for (const auto& b : bad) {
    const std::string msg = error_of(b.text);
    EXPECT_EQ(msg.substr(0, b.expect.size()), b.expect) << "file:\n" << b.text;
  }
}

// A value outside its axis' bounds is judged by the op's one validator (Fields<P>::check) and
// named like any other bad value: file, line, column, group or [defaults], axis.
TEST_F(CaseFiles, OutOfBoundsValuesNameTheirGroupAndAxis) {
  const std::string p = (dir_ / "bad.toml").string();
  EXPECT_EQ(error_of("op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={smoke=\"cartesian\"}\n"
                     "axes={n=[64, 1000000000]}\n"),
            p + ":5:14: group 'g' axis 'n': selftest_axpy: axis 'n' = 1000000000 is outside op "
                "'selftest_axpy''s bounds [-131072, 131072]");
  EXPECT_EQ(error_of("op = \"selftest_axpy\"\n[defaults]\nn = -200000\n"
                     "[[group]]\nname=\"g\"\ntiers={smoke=\"list\"}\ncases=[{}]\n"),
            p + ":3:5: [defaults] n: selftest_axpy: axis 'n' = -200000 is outside op "
                "'selftest_axpy''s bounds [-131072, 131072]");
}

TEST_F(CaseFiles, DuplicateIdsAcrossFilesNameBothSources) {
  write(
      "a.toml",
      "op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={quick=\"list\"}\ncases=[{heads=2}]\n");
  write(
      "b.toml",
      "op = \"selftest_axpy\"\n[[group]]\nname=\"g\"\ntiers={quick=\"list\"}\ncases=[{heads=2}]\n");
  try {
    (void)load_case_dir(dir_.string());
    ADD_FAILURE() << "duplicate accepted";
  } catch (const CaseFileError& e) {
    EXPECT_EQ(std::string(e.what()),
              (dir_ / "b.toml").string() +
                  ":5: duplicate case id "
                  "'selftest_axpy/h2-n64-f32-contiguous-s0' in tier 'quick', "
                  "also produced at " +
                  (dir_ / "a.toml").string() + ":5 (drop one, or exclude it from one group)");
  }
  try {
    (void)load_case_dir((dir_ / "missing").string());
    ADD_FAILURE();
  } catch (const CaseFileError& e) {
    EXPECT_EQ(std::string(e.what()), (dir_ / "missing").string() + ": case directory not found");
  }
}

}  // namespace
}  // namespace attncheck
