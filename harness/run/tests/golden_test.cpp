// Goldens: generate, verify, corruption and truncation, stale and missing cases, reference drift
// beyond the float32 storage bound, changed inputs, diff; SHA-256 against FIPS 180-4 vectors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "run/evaluate.h"
#include "run/golden.h"
#include "run/sha256.h"
#include "core/tests/test_util.h"

namespace attncheck {
namespace {

namespace fs = std::filesystem;

// Reference vs an in-memory golden, through the one evaluation path.
Result verify_against(const Case& c, const GoldenCase& g) {
  GoldenStore store("/nonexistent");
  store.put(c.op, g);
  EvalContext ctx;
  ctx.goldens = &store;
  return evaluate(c, ctx);
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // one million 'a', fed in uneven pieces
  const std::string chunk(977, 'a');
  size_t left = 1000000;
  while (left) {
    const size_t n = std::min(left, chunk.size());
    h.update(chunk.data(), n);
    left -= n;
  }
  EXPECT_EQ(h.hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The hashes come from OpenSSL's libcrypto (run/sha256.h), not from a hand-written SHA-256; a
// file's hash is the one `sha256sum` computes.
TEST(Sha256, IsOpenSslsAndAgreesWithSha256sum) {
  EXPECT_EQ(sha256_provider().rfind("OpenSSL ", 0), 0u) << sha256_provider();
  const fs::path file = fs::temp_directory_path() / ("attncheck_sha_" + std::to_string(::getpid()));
  std::string data;
  for (int i = 0; i < 200003; ++i) data += static_cast<char>((i * 131) ^ (i >> 7));
  std::ofstream(file, std::ios::binary) << data;
  FILE* p = ::popen(("sha256sum " + file.string()).c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[256] = {0};
  ASSERT_NE(std::fgets(line, sizeof line, p), nullptr);
  ::pclose(p);
  EXPECT_EQ(sha256_file(file.string()), std::string(line).substr(0, 64));
  EXPECT_EQ(sha256_hex(data), std::string(line).substr(0, 64));
  fs::remove(file);
}

class Goldens : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing_util::fresh_test_dir("golden");
    fs::create_directories(root_ / "cases");
    write_cases(kCases);
    opt_.dir = (root_ / "golden").string();
    opt_.root = root_.string();
  }
  void TearDown() override { fs::remove_all(root_); }
  void write_cases(const std::string& axpy) {
    std::ofstream(root_ / "cases" / "selftest_axpy.toml") << axpy;
    std::ofstream(root_ / "cases" / "page_indices.toml") << R"(
op = "page_indices"
[[group]]
name = "blocks"
tiers = { smoke = "pairwise", full = "cartesian" }
axes = { block_size = [1, 16, 64], table = ["contiguous", "strided"] }
)";
  }
  std::vector<CaseFile> files() const { return load_case_dir((root_ / "cases").string()); }
  int verify(std::string* text = nullptr) {
    std::ostringstream os;
    const int n = golden_verify(files(), opt_, os);
    if (text) *text = os.str();
    return n;
  }
  static constexpr const char* kCases = R"(
op = "selftest_axpy"
[[group]]
name = "all"
tiers = { smoke = "cartesian", quick = "pairwise" }
axes = { heads = [1, 3, 4], dtype = ["f32", "bf16"] }
)";
  fs::path root_;
  GoldenOptions opt_;
};

TEST_F(Goldens, GenerateThenVerify) {
  std::ostringstream log;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0) << log.str();
  EXPECT_NE(log.str().find("selftest_axpy"), std::string::npos);
  const auto manifest = read_manifest(opt_.dir);
  ASSERT_EQ(manifest.size(), 2u);
  EXPECT_EQ(manifest[0].file, "page_indices.h5");
  EXPECT_EQ(manifest[0].cases, 6);
  EXPECT_EQ(manifest[1].file, "selftest_axpy.h5");
  EXPECT_EQ(manifest[1].cases, 6);
  for (const auto& e : manifest) {
    EXPECT_EQ(e.sha256, sha256_file(opt_.dir + "/" + e.file));
    EXPECT_EQ(e.size, fs::file_size(opt_.dir + "/" + e.file));
  }
  std::string text;
  EXPECT_EQ(verify(&text), 0) << text;

  // Stored forms: float64 reference -> float32; invalid configurations hold no outputs.
  GoldenStore store(opt_.dir);
  const auto g = store.load("selftest_axpy", "selftest_axpy/h2-n64-f32-contiguous-s0");
  EXPECT_FALSE(g) << "h2 is not a case of this file";
  const auto g1 = store.load("selftest_axpy", "selftest_axpy/h1-n64-bf16-contiguous-s0");
  ASSERT_TRUE(g1);
  EXPECT_EQ(g1->stored_dtypes.at("out"), DType::f32);
  EXPECT_EQ(g1->outputs.at("out").dtype(), DType::f64);
  const auto g3 = store.load("selftest_axpy", "selftest_axpy/h3-n64-f32-contiguous-s0");
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->expect_refusal.value_or(""), "heads must be a power of two");
  EXPECT_TRUE(g3->outputs.empty());
  const auto gp = store.load("page_indices", "page_indices/bs16-b4-ctx300-strided-s0");
  ASSERT_TRUE(gp);
  EXPECT_EQ(gp->stored_dtypes.at("page_indices"), DType::i32);
  // A case read again comes from what the store kept: the same outputs, not a second read.
  const auto again = store.load("selftest_axpy", "selftest_axpy/h1-n64-bf16-contiguous-s0");
  ASSERT_TRUE(again);
  EXPECT_EQ(again->outputs.at("out").storage(), g1->outputs.at("out").storage());
  EXPECT_EQ(again->input_digests, g1->input_digests);

  // Regenerating gives the same bytes (no timestamps in HDF5 objects, same provenance).
  const std::string before = manifest[1].sha256;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0);
  EXPECT_EQ(read_manifest(opt_.dir)[1].sha256, before);
}

TEST_F(Goldens, CorruptedOrTruncatedFilesAreNamed) {
  std::ostringstream log;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0);
  const std::string path = opt_.dir + "/selftest_axpy.h5";
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(path) / 2));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  std::string text;
  EXPECT_GE(verify(&text), 1);
  EXPECT_NE(text.find(path + ": sha256 "), std::string::npos) << text;
  EXPECT_NE(text.find("does not match MANIFEST"), std::string::npos) << text;

  fs::resize_file(path, fs::file_size(path) / 3);
  EXPECT_GE(verify(&text), 2);
  EXPECT_NE(text.find(path + ": " + std::to_string(fs::file_size(path)) + " bytes, MANIFEST says "),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("not parsed: the file does not match MANIFEST"), std::string::npos) << text;

  fs::remove(opt_.dir + "/MANIFEST");
  EXPECT_GE(verify(&text), 1);
  EXPECT_NE(text.find(opt_.dir + "/MANIFEST: missing"), std::string::npos) << text;
}

TEST_F(Goldens, MissingAndStaleCasesAreReported) {
  std::ostringstream log;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0);
  write_cases(R"(
op = "selftest_axpy"
[[group]]
name = "all"
tiers = { smoke = "cartesian", quick = "pairwise" }
axes = { heads = [1, 2, 3], dtype = ["f32", "bf16"] }
)");
  std::string text;
  EXPECT_EQ(verify(&text), 4) << text;  // h2 x2 missing, h4 x2 stale
  EXPECT_NE(text.find("selftest_axpy/h2-n64-f32-contiguous-s0 (" + (root_ / "cases").string() +
                      "/selftest_axpy.toml:3): no golden"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("holds 'selftest_axpy/h4-n64-bf16-contiguous-s0', which is no longer a "
                      "smoke/quick case"),
            std::string::npos)
      << text;
  std::ostringstream diff;
  EXPECT_EQ(golden_diff(files(), opt_, diff), 4);
  EXPECT_NE(diff.str().find("added   selftest_axpy/h2-n64-f32-contiguous-s0"), std::string::npos)
      << diff.str();
  EXPECT_NE(diff.str().find("removed selftest_axpy/h4-n64-f32-contiguous-s0"), std::string::npos)
      << diff.str();
}

TEST_F(Goldens, DriftBeyondTheStorageBoundFails) {
  std::ostringstream log;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0);
  GoldenStore store(opt_.dir);
  const auto cases = files()[1].tiers.at("smoke");
  const Case& c = cases.front();
  auto g = *store.load("selftest_axpy", c.id);
  EXPECT_EQ(verify_against(c, g).verdict, Verdict::passed);

  // One element off by 2^-22 relative: four times the float32 rounding bound.
  Tensor& out = g.outputs.at("out");
  const double v = out.get({0, 5});
  out.set({0, 5}, v * (1 + std::ldexp(1.0, -22)));
  const Result r = verify_against(c, g);
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_NE(r.message.find("reference drift: out: "), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("worst at [0,5]"), std::string::npos) << r.message;

  // Within half an ulp of the stored float32: accepted (that is the storage rounding itself).
  out.set({0, 5}, v * (1 + std::ldexp(1.0, -26)));
  EXPECT_EQ(verify_against(c, g).verdict, Verdict::passed);

  // Changed inputs are a failure of their own, naming the argument.
  g.input_digests["args"]["x"] = std::string(64, '0');
  const Result d = verify_against(c, g);
  EXPECT_EQ(d.verdict, Verdict::failed);
  EXPECT_NE(d.message.find("inputs differ from those the golden was computed from (argument 'x' "),
            std::string::npos)
      << d.message;
}

TEST_F(Goldens, ExactOutputsAllowNoDrift) {
  std::ostringstream log;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0);
  GoldenStore store(opt_.dir);
  const auto all = files();
  const Case& c = all[0].tiers.at("smoke").front();
  auto g = *store.load("page_indices", c.id);
  Tensor& out = g.outputs.at("page_indices");
  out.set({3}, out.get({3}) + 1);
  const Result r = verify_against(c, g);
  EXPECT_EQ(r.verdict, Verdict::failed);
  EXPECT_NE(r.message.find("1 of"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("differ bitwise"), std::string::npos) << r.message;
}

TEST_F(Goldens, DiffAgainstAnotherDirectory) {
  std::ostringstream log;
  ASSERT_EQ(golden_generate(files(), opt_, log), 0);
  GoldenOptions other = opt_;
  other.dir = (root_ / "golden2").string();
  ASSERT_EQ(golden_generate(files(), other, log), 0);
  GoldenOptions d = opt_;
  d.against = other.dir;
  std::ostringstream same;
  EXPECT_EQ(golden_diff(files(), d, same), 0) << same.str();
  // A second golden set with an extra case.
  write_cases(R"(
op = "selftest_axpy"
[[group]]
name = "all"
tiers = { smoke = "cartesian", quick = "pairwise" }
axes = { heads = [1, 2, 3, 4], dtype = ["f32", "bf16"] }
)");
  ASSERT_EQ(golden_generate(files(), other, log), 0);
  std::ostringstream diff;
  EXPECT_EQ(golden_diff(files(), d, diff), 2) << diff.str();
  EXPECT_NE(diff.str().find("only in " + other.dir + "  selftest_axpy/h2-n64-f32-contiguous-s0"),
            std::string::npos)
      << diff.str();
}

// A smoke or quick case whose golden is missing is an error in reference mode, never a silent pass;
// reference-vs-nothing must be asked for, and is then `skipped` with mode none.
TEST(GoldenPolicy, MissingGoldenIsAnErrorUnlessAllowed) {
  const Op& op = *find_op("page_indices");
  Case c = op.make_case({{"batch", 2}}, {"smoke", "quick", "full"});
  GoldenStore empty(fs::temp_directory_path().string());
  EvalContext ctx;
  ctx.goldens = &empty;
  Result r = evaluate(c, ctx);
  EXPECT_EQ(r.verdict, Verdict::error) << r.message;
  EXPECT_NE(r.message.find("no golden for this case"), std::string::npos) << r.message;
  ctx.require_goldens = false;
  r = evaluate(c, ctx);
  EXPECT_EQ(r.verdict, Verdict::skipped) << r.message;
  EXPECT_EQ(r.mode, Mode::none);
  c.tiers = {"full"};  // goldens cover smoke and quick only: a full case has none by design
  ctx.require_goldens = true;
  r = evaluate(c, ctx);
  EXPECT_EQ(r.verdict, Verdict::skipped) << r.message;
}

}  // namespace
}  // namespace attncheck
