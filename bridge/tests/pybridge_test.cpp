// The Python bridge through its ABI table, the way attncheck drives a plugin: dlopen, alloc with
// guard bytes, copy, run, copy back, compare with answers computed by hand. Each test loads the
// bridge in a child process (the adapter is chosen once per process by $ATTNCHECK_PY_ADAPTER);
// failures inside the child are printed there and turn its exit status non-zero.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "attncheck_abi.h"

namespace {

constexpr size_t kMsg = 2048;
constexpr size_t kGuard = 4096;

using Env = std::vector<std::pair<std::string, std::string>>;
using Body = std::function<void(const attncheck_plugin_v1&)>;

// Loads the bridge in a child with ATTNCHECK_PY_ADAPTER=adapter and runs body there.
void in_child(const std::string& adapter, const Body& body, const Env& env = {}) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("ATTNCHECK_PY_ADAPTER", adapter.c_str(), 1);
    ::setenv("PYTHONPATH", ATTNCHECK_BRIDGE_TEST_ADAPTERS, 1);
    ::setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    void* h = ::dlopen(ATTNCHECK_PYBRIDGE_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      ADD_FAILURE() << "dlopen " << ATTNCHECK_PYBRIDGE_LIB << ": " << ::dlerror();
    } else {
      auto get =
          reinterpret_cast<attncheck_plugin_v1_get_fn>(::dlsym(h, "attncheck_plugin_v1_get"));
      if (!get) {
        ADD_FAILURE() << "no attncheck_plugin_v1_get";
      } else {
        const attncheck_plugin_v1* api = get();
        if (!api || api->abi_version != ATTNCHECK_ABI_VERSION)
          ADD_FAILURE() << "bad table";
        else
          body(*api);
      }
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died with signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's failures are printed above";
}

std::byte guard_byte(size_t i) {
  return static_cast<std::byte>((0xA5u ^ (i * 0x3Bu) ^ (i >> 8)) & 0xFFu);
}

// One "device" buffer the way attncheck makes it: guards on both sides of the bytes.
class Buffer {
 public:
  Buffer(const attncheck_plugin_v1& api, const void* bytes, size_t n) : api_(api), n_(n) {
    char msg[kMsg] = {0};
    EXPECT_EQ(api.alloc(n + 2 * kGuard, &dev_, msg, kMsg), ATTNCHECK_OK) << msg;
    std::vector<std::byte> staging(n + 2 * kGuard);
    for (size_t i = 0; i < kGuard; ++i) {
      staging[i] = guard_byte(i);
      staging[kGuard + n + i] = guard_byte(i + 1);
    }
    std::memcpy(staging.data() + kGuard, bytes, n);
    EXPECT_EQ(api.copy_to_device(dev_, staging.data(), staging.size(), msg, kMsg), ATTNCHECK_OK)
        << msg;
  }
  ~Buffer() { api_.release(dev_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return static_cast<std::byte*>(dev_) + kGuard; }
  // The bytes after a launch; guard damage is a test failure.
  std::vector<std::byte> read() const {
    std::vector<std::byte> staging(n_ + 2 * kGuard);
    char msg[kMsg] = {0};
    EXPECT_EQ(api_.copy_to_host(staging.data(), dev_, staging.size(), msg, kMsg), ATTNCHECK_OK)
        << msg;
    for (size_t i = 0; i < kGuard; ++i) {
      EXPECT_EQ(staging[i], guard_byte(i)) << "leading guard byte " << i;
      EXPECT_EQ(staging[kGuard + n_ + i], guard_byte(i + 1)) << "trailing guard byte " << i;
    }
    return {staging.begin() + kGuard, staging.begin() + static_cast<std::ptrdiff_t>(kGuard + n_)};
  }
  template <class T>
  std::vector<T> read_as() const {
    const auto b = read();
    std::vector<T> v(b.size() / sizeof(T));
    std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  const attncheck_plugin_v1& api_;
  void* dev_ = nullptr;
  size_t n_;
};

// A named view: shape/strides in elements, offset in elements. The device is kDLCUDA, as the
// harness passes it for a non-gfx arch: the bridge must export its own (kDLCPU for cpu adapters).
struct View {
  std::string name;
  const Buffer* buf;
  DLDataType dtype;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
};

class Args {
 public:
  explicit Args(std::vector<View> views) : views_(std::move(views)) {
    for (auto& v : views_) {
      attncheck_arg a{};
      a.name = v.name.c_str();
      a.tensor.data = v.buf->data();
      a.tensor.device = {kDLCUDA, 0};
      a.tensor.ndim = static_cast<int32_t>(v.shape.size());
      a.tensor.dtype = v.dtype;
      a.tensor.shape = v.shape.data();
      a.tensor.strides = v.strides.data();
      a.tensor.byte_offset = static_cast<uint64_t>(v.offset) * (v.dtype.bits / 8u);
      args_.push_back(a);
    }
  }
  const attncheck_arg* data() const { return args_.data(); }
  int size() const { return static_cast<int>(args_.size()); }

 private:
  std::vector<View> views_;
  std::vector<attncheck_arg> args_;
};

constexpr DLDataType kI32{kDLInt, 32, 1};
constexpr DLDataType kI64{kDLInt, 64, 1};
constexpr DLDataType kBf16{kDLBfloat, 16, 1};
constexpr DLDataType kU8{kDLUInt, 8, 1};

int run(const attncheck_plugin_v1& api, const char* op, const std::string& params, const Args& a,
        std::string* message) {
  char msg[kMsg] = {0};
  const int status = api.run(op, params.c_str(), a.data(), a.size(), msg, kMsg);
  if (message) *message = msg;
  return status;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ----------------------------------------------------------------------------------------------
// page_indices by hand through numpy_reference.
//
// K = 4; requests of 5, 0 and 9 tokens; the table is [3, 3] with row stride 5 (entries past a
// request's blocks hold -7); the output view has 14 slots of a 17-slot buffer poisoned with -1.
struct PageIndicesProblem {
  std::vector<int32_t> table = std::vector<int32_t>(15, -7);
  std::vector<int32_t> lens{5, 0, 9};
  std::vector<int32_t> cu{0, 5, 5, 14};
  std::vector<int32_t> out = std::vector<int32_t>(17, -1);
  PageIndicesProblem() {
    table[0] = 7;
    table[1] = 2;
    table[10] = 4;
    table[11] = 0;
    table[12] = 9;
  }
  static std::vector<int32_t> expected() {
    return {28, 29, 30, 31, 8, 16, 17, 18, 19, 0, 1, 2, 3, 36, -1, -1, -1};
  }
};

void page_indices_by_hand(const attncheck_plugin_v1& api, int64_t out_len, int K, int expect_status,
                          const std::string& expect_in_message) {
  PageIndicesProblem p;
  Buffer table(api, p.table.data(), p.table.size() * 4), lens(api, p.lens.data(), 12),
      cu(api, p.cu.data(), 16), out(api, p.out.data(), p.out.size() * 4);
  Args args({{"block_table", &table, kI32, {3, 3}, {5, 1}},
             {"seq_lens", &lens, kI32, {3}, {1}},
             {"cu_seq_lens", &cu, kI32, {4}, {1}},
             {"page_indices", &out, kI32, {out_len}, {1}}});
  std::string msg;
  const int status =
      run(api, "page_indices", "{\"kernel_block_size\":" + std::to_string(K) + "}", args, &msg);
  EXPECT_EQ(status, expect_status) << msg;
  if (!expect_in_message.empty()) {
    EXPECT_TRUE(contains(msg, expect_in_message)) << msg;
  }
  // Inputs unchanged, guards intact, and (when it ran) the hand-computed answer.
  EXPECT_EQ(table.read_as<int32_t>(), p.table);
  EXPECT_EQ(lens.read_as<int32_t>(), p.lens);
  EXPECT_EQ(cu.read_as<int32_t>(), p.cu);
  EXPECT_EQ(out.read_as<int32_t>(),
            status == ATTNCHECK_OK ? PageIndicesProblem::expected() : p.out);
}

#define REQUIRE_NUMPY()                                               \
  if (!ATTNCHECK_BRIDGE_HAS_NUMPY)                                    \
  GTEST_SKIP() << "the embedded Python has no numpy (configure with " \
                  "-DPython3_EXECUTABLE=<an interpreter with numpy>)"

TEST(PyBridge, NumpyReferenceDescribesItself) {
  REQUIRE_NUMPY();
  in_child("numpy_reference", [](const attncheck_plugin_v1& api) {
    EXPECT_STREQ(api.library, "attncheck-pybridge (numpy_reference, contract fp32-accumulate)");
    EXPECT_STREQ(api.ops(),
                 "page_indices,kv_gather,rope_inplace,rope_out_of_place,decode_attention");
    char name[256] = {0}, arch[64] = {0}, msg[kMsg] = {0};
    EXPECT_EQ(api.device_info(name, sizeof name, arch, sizeof arch, msg, kMsg), ATTNCHECK_OK)
        << msg;
    EXPECT_STREQ(name, "host (py adapter numpy_reference)");
    EXPECT_STREQ(arch, "cpu");
  });
}

TEST(PyBridge, PageIndicesByHand) {
  REQUIRE_NUMPY();
  in_child("numpy_reference", [](const attncheck_plugin_v1& api) {
    page_indices_by_hand(api, 14, 4, ATTNCHECK_OK, "");
  });
}

TEST(PyBridge, RefusalIsARefusal) {
  REQUIRE_NUMPY();
  in_child("numpy_reference", [](const attncheck_plugin_v1& api) {
    page_indices_by_hand(api, 14, 0, ATTNCHECK_REFUSED, "kernel_block_size must be >= 1");
  });
}

TEST(PyBridge, UnsupportedIsARefusalNamedUnsupported) {
  REQUIRE_NUMPY();
  in_child("numpy_reference", [](const attncheck_plugin_v1& api) {
    // A view that does not match the requests' tokens: not an invalid configuration in the docs,
    // just one the adapter does not implement.
    page_indices_by_hand(api, 13, 4, ATTNCHECK_UNSUPPORTED, "unsupported by numpy_reference: ");
  });
}

TEST(PyBridge, BrokenAdapterRaisesHostError) {
  REQUIRE_NUMPY();
  in_child("numpy_broken",
           [](const attncheck_plugin_v1& api) {
             page_indices_by_hand(api, 14, 4, ATTNCHECK_HOST_ERROR, "py adapter 'numpy_broken'");
           },
           {{"ATTNCHECK_BROKEN", "page_indices=raise"}});
}

TEST(PyBridge, BrokenAdapterDefaultBugGivesAWrongAnswer) {
  REQUIRE_NUMPY();
  in_child("numpy_broken", [](const attncheck_plugin_v1& api) {
    PageIndicesProblem p;
    Buffer table(api, p.table.data(), 60), lens(api, p.lens.data(), 12), cu(api, p.cu.data(), 16),
        out(api, p.out.data(), 68);
    Args args({{"block_table", &table, kI32, {3, 3}, {5, 1}},
               {"seq_lens", &lens, kI32, {3}, {1}},
               {"cu_seq_lens", &cu, kI32, {4}, {1}},
               {"page_indices", &out, kI32, {14}, {1}}});
    std::string msg;
    ASSERT_EQ(run(api, "page_indices", R"({"kernel_block_size":4})", args, &msg), ATTNCHECK_OK)
        << msg;
    auto want = PageIndicesProblem::expected();
    want[13] += 1;  // wrong_element: the last element off by one
    EXPECT_EQ(out.read_as<int32_t>(), want);
  });
}

TEST(PyBridge, DlpackCapsulesMatchStridedViews) {
  REQUIRE_NUMPY();
  in_child("dlpack_probe", [](const attncheck_plugin_v1& api) {
    // x: a [3, 2] view with strides (4, 2) and a 3-element offset into 16 int32; out: [3, 2]
    // contiguous at offset 1 of 8.
    std::vector<int32_t> xs(16), outs(8, -1);
    for (int i = 0; i < 16; ++i) xs[static_cast<size_t>(i)] = 100 + i;
    std::vector<double> f64(6, 0.5);
    Buffer x(api, xs.data(), 64), out(api, outs.data(), 32), d(api, f64.data(), 48);
    Args args({{"x", &x, kI32, {3, 2}, {4, 2}, 3},
               {"out", &out, kI32, {3, 2}, {2, 1}, 1},
               {"d", &d, DLDataType{kDLFloat, 64, 1}, {2, 3}, {1, 2}, 0}});
    std::string msg;
    ASSERT_EQ(run(api, "probe", "{}", args, &msg), ATTNCHECK_OK) << msg;
    const std::vector<int32_t> want{-1, 206, 210, 214, 218, 222, 226, -1};
    EXPECT_EQ(out.read_as<int32_t>(), want);
    EXPECT_EQ(x.read_as<int32_t>(), xs);

    const int s = run(api, "write_through_dlpack", "{}", args, &msg);
    if (s == ATTNCHECK_OK) {
      const std::vector<int32_t> sevens{-1, 7, 7, 7, 7, 7, 7, -1};
      EXPECT_EQ(out.read_as<int32_t>(), sevens);
    } else {
      EXPECT_EQ(s, ATTNCHECK_UNSUPPORTED) << msg;
      EXPECT_TRUE(contains(msg, "unsupported by dlpack_probe")) << msg;
    }
  });
}

TEST(PyBridge, AdapterByPathAndTimingAndRoofline) {
  REQUIRE_NUMPY();
  in_child(std::string(ATTNCHECK_BRIDGE_TEST_ADAPTERS) + "/dlpack_probe.py",
           [](const attncheck_plugin_v1& api) {
             EXPECT_STREQ(api.ops(), "probe,write_through_dlpack");
             std::vector<int32_t> xs{1, 2, 3}, outs(3, 0);
             Buffer x(api, xs.data(), 12), out(api, outs.data(), 12);
             Args args({{"x", &x, kI32, {3}, {1}}, {"out", &out, kI32, {3}, {1}}});
             double ms = -1;
             char msg[kMsg] = {0};
             EXPECT_EQ(api.time("probe", "{}", args.data(), args.size(), 2, 5, &ms, msg, kMsg),
                       ATTNCHECK_OK)
                 << msg;
             EXPECT_GT(ms, 0.0);
             EXPECT_EQ(out.read_as<int32_t>(), (std::vector<int32_t>{2, 4, 6}));
             double gbps = 0, tflops = 0;
             EXPECT_EQ(api.roofline(&gbps, &tflops, msg, kMsg), ATTNCHECK_OK) << msg;
             EXPECT_GT(gbps, 0.0);
             EXPECT_GT(tflops, 0.0);
           });
}

// Each entry's declared arithmetic contract through the extension table (docs/abi.md); NULL for an
// entry the adapter lacks. `expect`: entry -> contract.
void expect_contracts(const Env& expect) {
  void* h = ::dlopen(ATTNCHECK_PYBRIDGE_LIB, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(h, nullptr);
  auto get_ext =
      reinterpret_cast<attncheck_plugin_ext_v1_get_fn>(::dlsym(h, "attncheck_plugin_ext_v1_get"));
  ASSERT_NE(get_ext, nullptr);
  const attncheck_plugin_ext_v1* ext = get_ext();
  ASSERT_TRUE(ATTNCHECK_EXT_HAS(ext, contract));
  EXPECT_FALSE(ATTNCHECK_EXT_HAS(ext, fill));  // the harness uploads poison instead
  EXPECT_FALSE(ATTNCHECK_EXT_HAS(ext, background));
  for (const auto& [entry, contract] : expect)
    EXPECT_STREQ(ext->contract(entry.c_str()), contract.c_str()) << entry;
  EXPECT_EQ(ext->contract("no_such_entry"), nullptr);
  EXPECT_EQ(ext->contract(nullptr), nullptr);
}

TEST(PyBridge, NumpyReferenceDeclaresItsContracts) {
  REQUIRE_NUMPY();
  in_child("numpy_reference", [](const attncheck_plugin_v1&) {
    expect_contracts(
        {{"decode_attention", "qk-products-in-input-type"}, {"page_indices", "fp32-accumulate"}});
  });
}

// ----------------------------------------------------------------------------------------------
// Without NumPy: metadata, error paths, stdout.

// Graph capture through the extension table (docs/bridge.md "Graph replay"): an entry that did not
// declare itself graph-capturable is unsupported (the harness skips the step), not a failure; an
// unknown entry is unknown; a replay of no captured graph is the bridge's error.
TEST(PyBridge, GraphCaptureOfAnUndeclaredEntryIsUnsupported) {
  in_child("pure_python", [](const attncheck_plugin_v1&) {
    void* h = ::dlopen(ATTNCHECK_PYBRIDGE_LIB, RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(h, nullptr);
    auto get_ext =
        reinterpret_cast<attncheck_plugin_ext_v1_get_fn>(::dlsym(h, "attncheck_plugin_ext_v1_get"));
    ASSERT_NE(get_ext, nullptr);
    const attncheck_plugin_ext_v1* ext = get_ext();
    ASSERT_TRUE(ATTNCHECK_EXT_HAS(ext, graph_capture));
    ASSERT_TRUE(ATTNCHECK_EXT_HAS(ext, graph_replay));
    ASSERT_TRUE(ATTNCHECK_EXT_HAS(ext, graph_release));
    char msg[kMsg] = {0};
    void* graph = reinterpret_cast<void*>(1);
    EXPECT_EQ(ext->graph_capture("check_meta", "{}", nullptr, 0, &graph, msg, kMsg),
              ATTNCHECK_UNSUPPORTED)
        << msg;
    EXPECT_EQ(graph, nullptr);
    EXPECT_TRUE(contains(msg, "does not declare itself graph-capturable")) << msg;
    EXPECT_EQ(ext->graph_capture("no_such_entry", "{}", nullptr, 0, &graph, msg, kMsg),
              ATTNCHECK_UNKNOWN_OP)
        << msg;
    EXPECT_EQ(ext->graph_replay(reinterpret_cast<void*>(12345), msg, kMsg), ATTNCHECK_HOST_ERROR);
    EXPECT_TRUE(contains(msg, "no captured graph 12345")) << msg;
    ext->graph_release(nullptr);
    ext->graph_release(reinterpret_cast<void*>(12345));
  });
}

TEST(PyBridge, EntriesInheritTheAdaptersContract) {
  in_child("pure_python", [](const attncheck_plugin_v1&) {
    expect_contracts({{"check_meta", "p-in-input-type"}});
  });
}

TEST(PyBridge, TensorsCarryNamesDtypesShapesStridesOffsets) {
  in_child("pure_python", [](const attncheck_plugin_v1& api) {
    EXPECT_STREQ(api.library, "attncheck-pybridge (pure_python, contract p-in-input-type)");
    std::vector<std::byte> bytes(256);
    Buffer b(api, bytes.data(), bytes.size()), c(api, bytes.data(), 64);
    Args args({{"q", &b, kBf16, {2, 3, 4}, {24, 4, 1}, 8},
               {"positions", &c, kI64, {5}, {1}},
               {"codes", &b, kU8, {7, 2}, {1, 9}, 3}});
    const std::string params =
        R"({"q": "bf16|2,3,4|24,4,1|16", "positions": "i64|5|1|0", "codes": "u8|7,2|1,9|3"})";
    std::string msg;
    EXPECT_EQ(run(api, "check_meta", params, args, &msg), ATTNCHECK_OK) << msg;
    // Strided writes through the pointers land in place.
    std::vector<int32_t> outs(9, -1);
    Buffer o(api, outs.data(), 36);
    Args fill({{"out", &o, kI32, {3}, {3}, 1}});
    EXPECT_EQ(run(api, "fill", R"({"base": 40})", fill, &msg), ATTNCHECK_OK) << msg;
    EXPECT_EQ(o.read_as<int32_t>(), (std::vector<int32_t>{-1, 40, -1, -1, 41, -1, -1, 42, -1}));
  });
}

TEST(PyBridge, RaisingEntryIsAHostErrorNamingTheAdapter) {
  in_child("pure_python", [](const attncheck_plugin_v1& api) {
    Args none({});
    std::string msg;
    EXPECT_EQ(run(api, "raise", "{}", none, &msg), ATTNCHECK_HOST_ERROR);
    EXPECT_TRUE(contains(msg, "py adapter 'pure_python'")) << msg;
    EXPECT_TRUE(contains(msg, "entry 'raise' raised KeyError")) << msg;
    EXPECT_TRUE(contains(msg, "deliberate failure inside the adapter")) << msg;
    EXPECT_TRUE(contains(msg, "in inner")) << "the traceback's last frames: " << msg;
    // sys.exit in an entry is a failure of the entry, not of the process.
    EXPECT_EQ(run(api, "exit", "{}", none, &msg), ATTNCHECK_HOST_ERROR);
    EXPECT_TRUE(contains(msg, "SystemExit")) << msg;
    // The bridge is still usable afterwards.
    EXPECT_EQ(run(api, "unsupported", "{}", none, &msg), ATTNCHECK_UNSUPPORTED);
    EXPECT_EQ(msg, "unsupported by pure_python: this adapter does not implement that");
    EXPECT_EQ(run(api, "refuse", "{}", none, &msg), ATTNCHECK_REFUSED);
    EXPECT_EQ(msg, "kernel_block_size must be >= 1, got 0");
    EXPECT_EQ(run(api, "no_such_entry", "{}", none, &msg), ATTNCHECK_UNKNOWN_OP);
    EXPECT_TRUE(contains(msg, "has no entry 'no_such_entry'")) << msg;
    EXPECT_EQ(run(api, "raise", "not json", none, &msg), ATTNCHECK_HOST_ERROR);
    EXPECT_TRUE(contains(msg, "params_json is not JSON")) << msg;
  });
}

TEST(PyBridge, AdapterPrintsGoToStderrNotStdout) {
  in_child("pure_python", [](const attncheck_plugin_v1& api) {
    char out_path[] = "/tmp/pybridge_stdout_XXXXXX";
    char err_path[] = "/tmp/pybridge_stderr_XXXXXX";
    const int out_fd = ::mkstemp(out_path), err_fd = ::mkstemp(err_path);
    ASSERT_GE(out_fd, 0);
    ASSERT_GE(err_fd, 0);
    std::fflush(stdout);
    std::fflush(stderr);
    const int saved_out = ::dup(1), saved_err = ::dup(2);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    Args none({});
    std::string msg;
    const int status = run(api, "print", "{}", none, &msg);
    std::fflush(stdout);
    std::fflush(stderr);
    ::dup2(saved_out, 1);
    ::dup2(saved_err, 2);
    EXPECT_EQ(status, ATTNCHECK_OK) << msg;
    std::ifstream o(out_path), e(err_path);
    std::stringstream so, se;
    so << o.rdbuf();
    se << e.rdbuf();
    EXPECT_EQ(so.str(), "") << "stdout is the worker protocol channel";
    EXPECT_TRUE(contains(se.str(), "PRINTED-BY-ADAPTER")) << se.str();
    ::unlink(out_path);
    ::unlink(err_path);
  });
}

void expect_load_failure(const attncheck_plugin_v1& api, const std::string& adapter,
                         const std::string& why) {
  const std::string who = "py adapter '" + adapter + "'";
  EXPECT_TRUE(contains(api.library, "failed to load")) << api.library;
  EXPECT_STREQ(api.ops(), "");
  char name[256] = {0}, arch[64] = {0}, msg[kMsg] = {0};
  EXPECT_NE(api.device_info(name, sizeof name, arch, sizeof arch, msg, kMsg), ATTNCHECK_OK);
  EXPECT_TRUE(contains(msg, who)) << msg;
  EXPECT_TRUE(contains(msg, why)) << msg;
  Args none({});
  std::string rmsg;
  EXPECT_EQ(run(api, "page_indices", "{}", none, &rmsg), ATTNCHECK_HOST_ERROR);
  EXPECT_EQ(rmsg, msg);
  void* p = nullptr;
  EXPECT_EQ(api.alloc(16, &p, msg, kMsg), ATTNCHECK_ERROR);
}

TEST(PyBridge, MissingModule) {
  in_child("no_such_adapter_module", [](const attncheck_plugin_v1& api) {
    expect_load_failure(api, "no_such_adapter_module", "module not found");
  });
}

TEST(PyBridge, MissingFile) {
  in_child("/nonexistent/dir/adapter.py", [](const attncheck_plugin_v1& api) {
    expect_load_failure(api, "/nonexistent/dir/adapter.py", "no such file");
  });
}

TEST(PyBridge, ImportRaises) {
  in_child("raises_on_import", [](const attncheck_plugin_v1& api) {
    expect_load_failure(api, "raises_on_import", "deliberate import-time failure");
  });
}

TEST(PyBridge, NoRegistry) {
  in_child("no_registry", [](const attncheck_plugin_v1& api) {
    expect_load_failure(api, "no_registry", "has no ADAPTER");
  });
}

TEST(PyBridge, NoAdapterNamed) {
  in_child("", [](const attncheck_plugin_v1& api) {
    char name[256] = {0}, arch[64] = {0}, msg[kMsg] = {0};
    EXPECT_EQ(api.device_info(name, sizeof name, arch, sizeof arch, msg, kMsg), ATTNCHECK_ERROR);
    EXPECT_TRUE(contains(msg, "ATTNCHECK_PY_ADAPTER is not set")) << msg;
  });
}

}  // namespace
