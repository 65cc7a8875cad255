// The silent-failure checks, proven on the CPU with the fake kernel library: each injected fault
// must come back as a failed case whose message says what happened; the clean library must pass.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <set>

#include "core/numeric.h"
#include "run/device.h"
#include "run/evaluate.h"
#include "run/prepared.h"

#ifndef ATTNCHECK_FAKE_KERNELS
#error "ATTNCHECK_FAKE_KERNELS (path of the fake kernel library) must be defined by the build"
#endif

namespace attncheck {
namespace {

class FakeKernels : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { lib_ = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS).release(); }
  void TearDown() override {
    ::unsetenv("ATTNCHECK_FAKE_FAULT");
    ::unsetenv("ATTNCHECK_FAKE_FAULT_WHEN");
    ::unsetenv("ATTNCHECK_FAKE_CONTRACT");
    ::unsetenv("ATTNCHECK_FAKE_FAULT_CONTRACT");
  }
  // A library object of its own per run: what an entry declares (contract, properties) is asked
  // once per entry and kept (run/device.h), and these tests change it through the environment.
  Result run(const std::string& op_name, const Params& given, const char* fault = nullptr,
             int repeat = 2, const std::string& arch = "fake-cpu",
             std::optional<KnownBug> bug = std::nullopt) {
    return run_on(*KernelLibrary::open(ATTNCHECK_FAKE_KERNELS), op_name, given, fault, repeat, arch,
                  bug);
  }
  static Result run_on(const KernelLibrary& lib, const std::string& op_name, const Params& given,
                       const char* fault, int repeat = 2, const std::string& arch = "fake-cpu",
                       std::optional<KnownBug> bug = std::nullopt) {
    if (fault)
      ::setenv("ATTNCHECK_FAKE_FAULT", fault, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_FAULT");
    const Op* op = find_op(op_name);
    EXPECT_NE(op, nullptr);
    Case c = op->make_case(given);
    c.known_bug = bug;
    DeviceRunner runner(lib, arch);
    EvalContext ctx;
    ctx.device = &runner;
    ctx.options.repeat = repeat;
    ctx.options.arch = arch;
    return evaluate(c, ctx);
  }
  static inline KernelLibrary* lib_ = nullptr;  // never closed (GPU runtimes dislike dlclose)
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A sparse storage reaches the device as its whole extent with the host window at its place (the
// fake library has no fill extension: the poison goes through copy_to_device) and passes; the
// window at a wrong offset would hand the kernel NaN poison instead of x.
TEST_F(FakeKernels, SparseStorageUploadsItsWindowInPlace) {
  const Result r = run("selftest_axpy", {{"layout", "sparse"}, {"heads", 4}});
  EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
  EXPECT_EQ(r.mode, Mode::kernel);
}

// Sparse blocks are kept between launches (run/device.cpp SparseBlockCache) but poisoned again:
// what one case's kernel wrote into the gap before its window is not what the next case reads.
TEST_F(FakeKernels, ASparseBlockKeptBetweenCasesIsPoisonedAgain) {
  const Params sparse{{"layout", "sparse"}, {"heads", 4}};
  for (int round = 0; round < 2; ++round) {
    const Result scribbled = run_on(*lib_, "selftest_axpy", sparse, "write_before_input");
    EXPECT_EQ(scribbled.verdict, Verdict::passed) << scribbled.message;
    const Result read = run_on(*lib_, "selftest_axpy", sparse, "read_before_input");
    EXPECT_EQ(read.verdict, Verdict::failed) << "the gap read back the earlier case's zero";
  }
}

// Several libraries over the same cases (mutants) share each case's problem and default budgets
// (run/prepared.h): a faulty library's launch does not change what the next library is given.
TEST_F(FakeKernels, PreparedCasesAreTheSameForEveryLibrary) {
  const Op* op = find_op("selftest_axpy");
  ASSERT_NE(op, nullptr);
  const Case c = op->make_case({{"heads", 4}});
  PreparedCases prepared;
  DeviceRunner runner(*lib_, "fake-cpu");
  EvalContext ctx;
  ctx.device = &runner;
  ctx.options.arch = "fake-cpu";
  ctx.prepared = &prepared;
  for (const char* fault : {"", "nan", "modify_input", "", "guard_after", ""}) {
    if (*fault)
      ::setenv("ATTNCHECK_FAKE_FAULT", fault, 1);
    else
      ::unsetenv("ATTNCHECK_FAKE_FAULT");
    const Result r = evaluate(c, ctx);
    EXPECT_EQ(r.verdict, *fault && std::string(fault) != "write_before_input" ? Verdict::failed
                                                                              : Verdict::passed)
        << fault << ": " << r.message;
  }
  EXPECT_EQ(prepared.kept_cases(), 1u);
}

// --stress: N more launches compared bitwise with the first; a kernel that flips a bit on every
// second launch is caught with its rate, a clean one passes with a zero rate; the record survives
// the worker's JSON.
TEST_F(FakeKernels, StressCountsLaunchesThatDifferFromTheFirst) {
  const Op* op = find_op("selftest_axpy");
  ASSERT_NE(op, nullptr);
  DeviceRunner runner(*lib_, "fake-cpu");
  EvalContext ctx;
  ctx.device = &runner;
  ctx.options.repeat = 1;  // no V12 repeats: the stress launches alone must find it
  ctx.options.stress = 10;
  ctx.options.arch = "fake-cpu";
  const Case c = op->make_case(Params::object());

  ::unsetenv("ATTNCHECK_FAKE_FAULT");
  const Result clean = evaluate(c, ctx);
  EXPECT_EQ(clean.verdict, Verdict::passed) << clean.message;
  ASSERT_TRUE(clean.stress);
  EXPECT_EQ(clean.stress->launches, 10);
  EXPECT_EQ(clean.stress->differing, 0);
  EXPECT_TRUE(contains(clean.stress->conditions, "no L2 flush"));  // the fake has no fill

  ::setenv("ATTNCHECK_FAKE_FAULT", "nondeterministic", 1);
  const Result flaky = evaluate(c, ctx);
  EXPECT_EQ(flaky.verdict, Verdict::failed);
  ASSERT_TRUE(flaky.stress);
  EXPECT_EQ(flaky.stress->launches, 10);
  EXPECT_GE(flaky.stress->differing, 4);
  EXPECT_LE(flaky.stress->differing, 6);
  EXPECT_TRUE(contains(flaky.message, "not deterministic under stress")) << flaky.message;
  const Result back = Result::from_json(flaky.to_json());
  ASSERT_TRUE(back.stress);
  EXPECT_EQ(back.stress->differing, flaky.stress->differing);
  EXPECT_DOUBLE_EQ(flaky.to_json()["stress"]["nondeterminism_rate"].get<double>(),
                   flaky.stress->rate());
  ctx.options.stress = 0;
  ::unsetenv("ATTNCHECK_FAKE_FAULT");
  const Result plain = evaluate(c, ctx);
  EXPECT_FALSE(plain.stress);
  EXPECT_FALSE(plain.to_json().contains("stress"));
}

// Arithmetic contracts (docs/verification.md): the default budgets first; the declared contract's
// only when they fail, named in the verdict and the result; on a failure, the known contract the
// error would fit. The fake library declares $ATTNCHECK_FAKE_CONTRACT and moves element 0 of the
// first output between (beyond_default) or past (beyond_contract) the two budgets.
TEST_F(FakeKernels, DeclaredContractIsAppliedOnlyWhenTheDefaultFails) {
  const std::string qk = "qk-products-in-input-type";
  for (const char* op : {"decode_attention", "mla_decode", "sparse_mla"}) {
    SCOPED_TRACE(op);
    ::setenv("ATTNCHECK_FAKE_CONTRACT", qk.c_str(), 1);
    const Result clean = run(op, Params::object());
    EXPECT_EQ(clean.verdict, Verdict::passed) << clean.message;
    EXPECT_EQ(clean.contract, "fp32-accumulate");  // the default budgets held
    // (decode_attention adds its graph-replay note: run/graph_replay.h)
    EXPECT_EQ(clean.message.rfind("all checks within budget", 0), 0u) << clean.message;

    const Result needed = run(op, Params::object(), "beyond_default");
    EXPECT_EQ(needed.verdict, Verdict::passed) << needed.message;
    EXPECT_EQ(needed.contract, qk);
    EXPECT_TRUE(contains(needed.message, "passed under declared contract " + qk)) << needed.message;
    EXPECT_TRUE(contains(needed.message, "the default fp32-accumulate budgets fail"))
        << needed.message;
    ASSERT_FALSE(needed.checks.empty());
    EXPECT_TRUE(contains(needed.checks[0].budget.why, "contract " + qk))
        << needed.checks[0].budget.why;
    const Result back = Result::from_json(needed.to_json());
    EXPECT_EQ(back.contract, qk);
    EXPECT_EQ(needed.to_json()["contract"], qk);

    const Result broken = run(op, Params::object(), "beyond_contract");
    EXPECT_EQ(broken.verdict, Verdict::failed) << broken.message;
    EXPECT_EQ(broken.contract, qk);
    EXPECT_TRUE(contains(broken.message, "fails its declared contract " + qk)) << broken.message;
    EXPECT_TRUE(contains(broken.message, "no known contract explains it")) << broken.message;

    // Declaring nothing (the default): the same error fails, with the contract it would fit.
    ::unsetenv("ATTNCHECK_FAKE_CONTRACT");
    ::setenv("ATTNCHECK_FAKE_FAULT_CONTRACT", qk.c_str(), 1);
    const Result undeclared = run(op, Params::object(), "beyond_default");
    EXPECT_EQ(undeclared.verdict, Verdict::failed) << undeclared.message;
    EXPECT_EQ(undeclared.contract, "fp32-accumulate");
    EXPECT_TRUE(
        contains(undeclared.message, "fails its declared contract fp32-accumulate (the default)"))
        << undeclared.message;
    EXPECT_TRUE(contains(undeclared.message, "the error would fit contract " + qk))
        << undeclared.message;
    const Result beyond = run(op, Params::object(), "beyond_contract");
    EXPECT_EQ(beyond.verdict, Verdict::failed) << beyond.message;
    EXPECT_TRUE(contains(beyond.message, "no known contract explains it")) << beyond.message;
    ::unsetenv("ATTNCHECK_FAKE_FAULT_CONTRACT");
  }
}

TEST_F(FakeKernels, ContractsAreIgnoredByExactOpsAndUnknownNamesAreErrors) {
  ::setenv("ATTNCHECK_FAKE_CONTRACT", "qk-products-in-input-type", 1);
  const Result exact = run("page_indices", Params::object());
  EXPECT_EQ(exact.verdict, Verdict::passed) << exact.message;
  EXPECT_EQ(exact.contract, "");
  EXPECT_FALSE(exact.to_json().contains("contract"));

  ::setenv("ATTNCHECK_FAKE_CONTRACT", "fp8-scores", 1);
  for (const char* op : {"decode_attention", "page_indices"}) {
    const Result bad = run(op, Params::object());
    EXPECT_EQ(bad.verdict, Verdict::error) << op;
    EXPECT_TRUE(contains(bad.message, "attncheck fake CPU kernels")) << bad.message;
    EXPECT_TRUE(contains(bad.message, "entry '" + std::string(op) + "'")) << bad.message;
    EXPECT_TRUE(contains(bad.message, "unknown arithmetic contract 'fp8-scores'")) << bad.message;
    EXPECT_TRUE(contains(bad.message, "known: fp32-accumulate")) << bad.message;
  }
  // A library without the extension's contract (the fake without $ATTNCHECK_FAKE_CONTRACT
  // returns NULL) is judged by the default.
  ::unsetenv("ATTNCHECK_FAKE_CONTRACT");
  EXPECT_EQ(KernelLibrary::open(ATTNCHECK_FAKE_KERNELS)->declared_contract("decode_attention"), "");
  const Result plain = run("decode_attention", Params::object());
  EXPECT_EQ(plain.verdict, Verdict::passed) << plain.message;
  EXPECT_EQ(plain.contract, "fp32-accumulate");
}

TEST(Sanitizer, FindingsAreTheReportLinesNotTheBanners) {
  const std::string report =
      "========= COMPUTE-SANITIZER\n"
      "========= Invalid __global__ read of size 2 bytes\n"
      "=========     at decode_stage1<16, 4>(Stage1Args)+0x1a90 in decode_attention.hip:101\n"
      "=========     by thread (3,0,0) in block (0,0,0)\n"
      "========= Error: Race reported between Write access at decode_stage1+0x10\n"
      "========= Uninitialized __global__ memory read of size 4 bytes\n"
      "========= Barrier error detected. Divergent thread(s) in warp\n"
      "========= ERROR SUMMARY: 4 errors\n"
      "========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n";
  const auto found = sanitizer_findings(report);
  ASSERT_EQ(found.size(), 4u);
  EXPECT_EQ(found[0], "Invalid __global__ read of size 2 bytes");
  EXPECT_TRUE(contains(found[1], "Race reported"));
  EXPECT_TRUE(sanitizer_findings("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
                  .empty());
}

TEST(SparsePoison, IsTheDtypesNanRepeated) {
  EXPECT_EQ(sparse_poison_pattern(DType::e4m3fn), 0x7F7F7F7Fu);
  EXPECT_EQ(sparse_poison_pattern(DType::e4m3fnuz), 0x80808080u);
  EXPECT_EQ(sparse_poison_pattern(DType::bf16), 0x7FC07FC0u);
  EXPECT_EQ(sparse_poison_pattern(DType::f32), static_cast<uint32_t>(nan_bits(DType::f32)));
  EXPECT_EQ(sparse_poison_pattern(DType::i32), 0xFFFFFFFFu);
}

TEST_F(FakeKernels, LibraryDescribesItself) {
  std::string why;
  const auto dev = lib_->device(&why);
  ASSERT_TRUE(dev) << why;
  EXPECT_EQ(dev->arch, "fake-cpu");
  EXPECT_TRUE(lib_->has_entry("page_indices"));
  EXPECT_TRUE(lib_->has_entry("selftest_axpy"));
  EXPECT_FALSE(lib_->has_entry("no_such_op"));
}

// The fake library lists kernel entries exactly as the real one does (`attncheck kernels --check`
// holds the real libraries to the same list in CI), so an op whose entries differ from its name
// (rope) cannot look runnable here and not there.
TEST_F(FakeKernels, ListsExactlyTheEntriesTheOpsAskFor) {
  std::set<std::string> asked;
  for (const Op* op : all_ops())
    for (const auto& e : op->kernel_entries()) asked.insert(e);
  const std::set<std::string> listed(lib_->entries().begin(), lib_->entries().end());
  EXPECT_EQ(listed, asked);
  EXPECT_FALSE(lib_->has_entry("rope"));  // the op's name is not an entry
}

// Regression: rope cases ran in reference mode on the GPU because the capability check asked the
// library for the op name. The check is by kernel entry, after the problem is made.
TEST_F(FakeKernels, RopeRunsItsKernelEntries) {
  for (const char* variant : {"inplace", "out_of_place"}) {
    const Result r = run("rope", {{"contract", variant}});
    EXPECT_EQ(r.mode, Mode::kernel) << r.message;
    EXPECT_EQ(r.verdict, Verdict::passed) << r.message;
    EXPECT_EQ(r.kernel_entry, std::string("rope_") + variant);
  }
}

// A library without the problem's entry: the case is not passed, and says which entry is missing.
TEST_F(FakeKernels, MissingEntryFailsNamingOpAndEntry) {
  ::setenv("ATTNCHECK_FAKE_OMIT", "rope_inplace", 1);
  const auto partial = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS);
  ::unsetenv("ATTNCHECK_FAKE_OMIT");
  ASSERT_FALSE(partial->has_entry("rope_inplace"));
  const Op* op = find_op("rope");
  DeviceRunner runner(*partial, "fake-cpu");
  EvalContext ctx;
  ctx.device = &runner;
  const Result r = evaluate(op->make_case({{"contract", "inplace"}}), ctx);
  EXPECT_EQ(r.verdict, Verdict::failed) << r.message;
  EXPECT_EQ(r.mode, Mode::none);
  EXPECT_TRUE(contains(r.message, "no entry 'rope_inplace' (op rope)")) << r.message;
}

// An exception in an entry's host code is the kernel's failure, not a device fault: the worker
// need not be replaced.
TEST_F(FakeKernels, HostErrorIsNotADeviceError) {
  const Result host = run("page_indices", Params::object(), "host_error");
  EXPECT_EQ(host.verdict, Verdict::failed);
  EXPECT_TRUE(contains(host.message, "kernel entry failed on the host")) << host.message;
  EXPECT_FALSE(host.device_error);
  const Result device = run("page_indices", Params::object(), "error");
  EXPECT_TRUE(device.device_error);
}

// A verdict is passed only when a kernel output was compared in kernel mode.
TEST_F(FakeKernels, PassedMeansAKernelOutputWasCompared) {
  const Result r = run("page_indices", {{"batch", 3}});
  EXPECT_EQ(r.verdict, Verdict::passed);
  EXPECT_EQ(r.mode, Mode::kernel);
  EXPECT_FALSE(r.checks.empty());
}

TEST_F(FakeKernels, CleanKernelsPass) {
  for (int bs : {1, 16, 64})
    for (const char* table : {"contiguous", "strided"}) {
      const Result r = run("page_indices", {{"block_size", bs}, {"table", table}, {"batch", 7}});
      EXPECT_EQ(r.verdict, Verdict::passed) << r.id << ": " << r.message;
    }
  for (const char* dt : {"f32", "bf16"})
    for (const char* layout : {"contiguous", "strided"}) {
      const Result r =
          run("selftest_axpy", {{"dtype", dt}, {"layout", layout}, {"heads", 4}}, nullptr, 3);
      EXPECT_EQ(r.verdict, Verdict::passed) << r.id << ": " << r.message;
      ASSERT_EQ(r.checks.size(), 1u);
      EXPECT_TRUE(r.checks[0].passed);
    }
}

TEST_F(FakeKernels, InvalidConfigurationRefused) {
  const Result r = run("selftest_axpy", {{"heads", 3}});
  EXPECT_EQ(r.verdict, Verdict::refused_as_expected) << r.message;
  EXPECT_TRUE(contains(r.message, "heads must be a power of two")) << r.message;
}

struct FaultCase {
  const char* fault;
  const char* op;
  Params params;
  const char* expect;  // part of the failure message
};

TEST_F(FakeKernels, EveryInjectedFaultIsReported) {
  const std::vector<FaultCase> faults = {
      // The fake writes the block's last G-th byte from the end: with the device block cache
      // (a block of the storage's size class) that is somewhere in the trailing guard, which
      // runs to the block's end; the exact offset is checked without the cache below.
      {"guard_after",
       "page_indices",
       {{"batch", 5}},
       "guard after buffer of 'page_indices' overwritten at byte +"},
      {"guard_before",
       "page_indices",
       {{"batch", 5}},
       "guard before buffer of 'page_indices' overwritten at byte -1"},
      {"past_view", "page_indices", {{"batch", 5}}, "(outside every argument's view)"},
      {"modify_input",
       "page_indices",
       {{"batch", 5}},
       "byte 0 of buffer 'block_table' changed (input 'block_table')"},
      {"unwritten",
       "page_indices",
       {{"batch", 5}},
       "elements of 'page_indices' were never written"},
      {"unwritten",
       "selftest_axpy",
       {{"heads", 2}},
       "1 of 128 elements of 'out' were never written (first at [1,63])"},
      {"nan", "selftest_axpy", {{"heads", 2}}, "NaN 1"},
      {"nondeterministic",
       "page_indices",
       {{"batch", 5}},
       "not deterministic: launch 2 of 'page_indices'"},
      {"refuse", "page_indices", Params::object(),
       "kernel refused a valid configuration: fake kernel refuses (injected)"},
      {"error", "page_indices", Params::object(), "kernel error: fake kernel error (injected)"},
      {"run_invalid",
       "selftest_axpy",
       {{"heads", 3}},
       "kernel ran an invalid configuration (heads must be a power of two)"},
  };
  for (const auto& f : faults) {
    const Result r = run(f.op, f.params, f.fault);
    EXPECT_EQ(r.verdict, Verdict::failed) << f.fault << " on " << r.id << ": " << r.message;
    EXPECT_TRUE(contains(r.message, f.expect))
        << f.fault << ": message lacks \"" << f.expect << "\":\n"
        << r.message;
    ::unsetenv("ATTNCHECK_FAKE_FAULT");
  }
}

// Uploads (run/device.cpp): a storage gets a block of its size class from the device block
// cache, reused from an earlier launch, whose trailing guard runs to the block's end; the
// storages are packed into one copy and spread with copy_within_device when the library has it,
// else copied one by one. Every way of uploading passes clean launches (the second launch and
// every case after the first reuse blocks) and reports the same faults. The fake's guard_after
// writes the block's last G-th byte from the end: with the cache that is somewhere in the
// trailing guard; without it, guard + data + guard, it is the first byte after the data.
TEST_F(FakeKernels, EveryWayOfUploadingReportsTheFaults) {
  ::setenv("ATTNCHECK_FAKE_EXT_SIZE", "before_copy_within", 1);
  KernelLibrary* per_storage = KernelLibrary::open(ATTNCHECK_FAKE_KERNELS).release();
  ::unsetenv("ATTNCHECK_FAKE_EXT_SIZE");
  for (KernelLibrary* lib : {lib_, per_storage})
    for (const char* cache : {"1", "0"}) {
      const std::string way =
          std::string(lib == lib_ ? "packed" : "per storage") + ", cache " + cache;
      ::setenv("ATTNCHECK_DEVICE_BLOCK_CACHE", cache, 1);
      for (int i = 0; i < 2; ++i) {
        const Result clean = run_on(*lib, "page_indices", {{"batch", 5}}, nullptr);
        EXPECT_EQ(clean.verdict, Verdict::passed) << way << ": " << clean.message;
      }
      const std::vector<std::pair<const char*, std::string>> faults = {
          {"guard_after",
           std::string("guard after buffer of 'page_indices' overwritten at byte +") +
               (cache == std::string("0") ? "0" : "")},
          {"guard_before", "guard before buffer of 'page_indices' overwritten at byte -1"},
          {"past_view", "(outside every argument's view)"},
          {"modify_input", "byte 0 of buffer 'block_table' changed (input 'block_table')"},
          {"unwritten", "elements of 'page_indices' were never written"}};
      for (const auto& [fault, expect] : faults) {
        const Result r = run_on(*lib, "page_indices", {{"batch", 5}}, fault);
        EXPECT_EQ(r.verdict, Verdict::failed) << way << ", " << fault << ": " << r.message;
        EXPECT_TRUE(contains(r.message, expect)) << way << ", " << fault << ": " << r.message;
      }
      ::unsetenv("ATTNCHECK_FAKE_FAULT");
    }
  ::unsetenv("ATTNCHECK_DEVICE_BLOCK_CACHE");
}

TEST_F(FakeKernels, UnwrittenElementsNeedTheSecondLaunch) {
  // With one launch, an unwritten element whose poison happens to be a plausible value would only
  // show as a value mismatch; the second launch from the complemented poison names it.
  const Result once = run("selftest_axpy", {{"heads", 2}}, "unwritten", 1);
  EXPECT_EQ(once.verdict, Verdict::failed);
  EXPECT_FALSE(contains(once.message, "never written")) << once.message;
  const Result twice = run("selftest_axpy", {{"heads", 2}}, "unwritten", 2);
  EXPECT_TRUE(contains(twice.message, "never written")) << twice.message;
}

TEST_F(FakeKernels, FaultSelectedByKernelParameters) {
  ::setenv("ATTNCHECK_FAKE_FAULT_WHEN", R"({"kernel_block_size": 16})", 1);
  EXPECT_EQ(run("page_indices", {{"block_size", 16}}, "error").verdict, Verdict::failed);
  EXPECT_EQ(run("page_indices", {{"block_size", 64}}, "error").verdict, Verdict::passed);
}

TEST_F(FakeKernels, KnownBugsAreScopedByArch) {
  const KnownBug bug{"upstream#7: wrong at block size 16", "fake-.*"};
  const Params p = {{"block_size", 16}};
  Result r = run("page_indices", p, "unwritten", 2, "fake-cpu", bug);
  EXPECT_EQ(r.verdict, Verdict::known_bug) << r.message;
  EXPECT_TRUE(contains(r.message, "known bug (upstream#7")) << r.message;
  r = run("page_indices", p, nullptr, 2, "fake-cpu", bug);
  EXPECT_EQ(r.verdict, Verdict::unexpected_pass) << r.message;
  r = run("page_indices", p, "unwritten", 2, "gfx950", bug);  // another arch: a plain failure
  EXPECT_EQ(r.verdict, Verdict::failed) << r.message;
}

TEST(FlippedPoison, ComplementsOnlyPureOutputs) {
  const Op* op = find_op("page_indices");
  ASSERT_NE(op, nullptr);
  const Problem p = op->problem(op->make_case({{"batch", 3}}));
  const Problem q = with_flipped_poison(p);
  ASSERT_EQ(p.args.size(), q.args.size());
  for (size_t i = 0; i < p.args.size(); ++i) {
    const Tensor& a = p.args[i].tensor;
    const Tensor& b = q.args[i].tensor;
    if (p.args[i].role == Role::output) {
      EXPECT_NE(a.storage(), b.storage());
      a.for_each_index([&](const Index& idx, int64_t) {
        EXPECT_EQ(b.get_bits(idx), ~a.get_bits(idx) & 0xFFFFFFFFu);
      });
      // Bytes outside the view (the tail sentinel) keep their value.
      const auto hi = static_cast<size_t>(a.extent().second * 4);
      EXPECT_EQ(a.storage()->bytes[hi], b.storage()->bytes[hi]);
    } else {
      EXPECT_EQ(a.storage(), b.storage());
    }
  }
}

TEST(ResultJson, NonFiniteNumbersAreStrings) {
  EXPECT_EQ(json_number(std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::quiet_NaN()), "nan");
  EXPECT_EQ(json_number(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(json_number(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(json_number(0.25), 0.25);
  Result r;
  CheckResult c;
  c.name = "out";
  c.metrics.max_abs = std::numeric_limits<double>::infinity();
  c.metrics.worst = {{1, 2}, 1.0, std::numeric_limits<double>::quiet_NaN(), 0, 0};
  r.checks.push_back(c);
  const auto j = r.to_json();
  EXPECT_EQ(j["checks"][0]["metrics"]["max_abs"], "inf");
  EXPECT_EQ(j["checks"][0]["metrics"]["worst"]["actual"], "nan");
  EXPECT_EQ(nlohmann::json::parse(j.dump()), j);
}

// The parent process and the report read Results back from their JSON: nothing is lost.
TEST(ResultJson, RoundTripsThroughJson) {
  Result r;
  r.id = "page_indices/bs16";
  r.op = "page_indices";
  r.params = {{"block_size", 16}};
  r.verdict = Verdict::known_bug;
  r.mode = Mode::kernel;
  r.message = "known bug (x): y";
  r.arch = "sm_90";
  r.repro = "attncheck repro 'page_indices/bs16'";
  r.kernel_entry = "page_indices";
  r.expected_from = "golden";
  r.bundle = "/tmp/b.h5";
  r.contract = "qk-products-in-input-type";
  r.device_error = true;
  r.timings = {1.5, 2.5, 3.5};
  CheckResult c;
  c.name = "out";
  c.passed = false;
  c.budget.atol = 1e-3;
  c.budget.why = "because";
  c.metrics.max_abs = std::numeric_limits<double>::infinity();
  c.metrics.worst = {{1, 2}, 1.0, std::numeric_limits<double>::quiet_NaN(), 0, 0};
  r.checks.push_back(c);
  const auto j = r.to_json();
  EXPECT_EQ(j["failing"], false);  // known bugs do not fail the gate
  EXPECT_EQ(j["contract"], "qk-products-in-input-type");
  EXPECT_EQ(Result::from_json(j).to_json(), j);
  EXPECT_THROW(Result::from_json({{"id", "x"}}), std::invalid_argument);
}

TEST(Verdicts, FailingIsFailedOrError) {
  for (Verdict v :
       {Verdict::passed, Verdict::failed, Verdict::refused_as_expected, Verdict::known_bug,
        Verdict::unexpected_pass, Verdict::unsupported, Verdict::skipped, Verdict::error}) {
    EXPECT_EQ(is_failing(v), v == Verdict::failed || v == Verdict::error) << verdict_name(v);
    EXPECT_EQ(parse_verdict(verdict_name(v)), v);
  }
}

}  // namespace
}  // namespace attncheck
