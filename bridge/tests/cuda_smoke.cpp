// The bridge's cuda path on a GPU host, without the rest of attncheck: loads
// libattncheck_pybridge.so with bridge/tests/adapters/torch_cuda.py and drives the ABI table the
// way attncheck does (torch-allocated buffers with guard bytes, copies, launches, copies back).
//
//   PYTHONPATH=bridge/tests/adapters ATTNCHECK_PY_ADAPTER=torch_cuda pybridge_cuda_smoke
//   <bridge.so>
//
// Prints one line per check and exits non-zero when one fails; not a ctest (CI has no GPU).
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "attncheck_abi.h"

namespace {

constexpr size_t kMsg = 2048;
constexpr size_t kGuard = 4096;
int g_failed = 0;

void check(bool ok, const std::string& what, const std::string& detail = "") {
  std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", what.c_str(), detail.empty() ? "" : ": ",
              detail.c_str());
  if (!ok) ++g_failed;
}

unsigned char guard_byte(size_t i) {
  return static_cast<unsigned char>((0xA5u ^ (i * 0x3Bu) ^ (i >> 8)) & 0xFFu);
}

struct Buffer {
  const attncheck_plugin_v1* api;
  void* dev = nullptr;
  size_t n;
  Buffer(const attncheck_plugin_v1* a, const void* bytes, size_t bytes_n) : api(a), n(bytes_n) {
    char msg[kMsg] = {0};
    const int s = api->alloc(n + 2 * kGuard, &dev, msg, kMsg);
    check(s == ATTNCHECK_OK && dev, "alloc " + std::to_string(n + 2 * kGuard) + " bytes", msg);
    std::vector<unsigned char> staging(n + 2 * kGuard);
    for (size_t i = 0; i < kGuard; ++i) {
      staging[i] = guard_byte(i);
      staging[kGuard + n + i] = guard_byte(i + 1);
    }
    std::memcpy(staging.data() + kGuard, bytes, n);
    const int c = api->copy_to_device(dev, staging.data(), staging.size(), msg, kMsg);
    if (c != ATTNCHECK_OK) check(false, "copy_to_device", msg);
  }
  ~Buffer() { api->release(dev); }
  void* data() const { return static_cast<unsigned char*>(dev) + kGuard; }
  template <class T>
  std::vector<T> read(const std::string& what) const {
    std::vector<unsigned char> staging(n + 2 * kGuard);
    char msg[kMsg] = {0};
    if (api->copy_to_host(staging.data(), dev, staging.size(), msg, kMsg) != ATTNCHECK_OK)
      check(false, "copy_to_host " + what, msg);
    bool guards = true;
    for (size_t i = 0; i < kGuard; ++i)
      guards =
          guards && staging[i] == guard_byte(i) && staging[kGuard + n + i] == guard_byte(i + 1);
    if (!guards) check(false, "guards of " + what);
    std::vector<T> v(n / sizeof(T));
    std::memcpy(v.data(), staging.data() + kGuard, v.size() * sizeof(T));
    return v;
  }
};

struct View {
  const char* name;
  const Buffer* buf;
  DLDataType dtype;
  std::vector<int64_t> shape, strides;
  int64_t offset;
};

std::vector<attncheck_arg> args_of(std::vector<View>& views) {
  std::vector<attncheck_arg> out;
  for (auto& v : views) {
    attncheck_arg a{};
    a.name = v.name;
    a.tensor.data = v.buf->data();
    a.tensor.device = {kDLCUDA, 0};
    a.tensor.ndim = static_cast<int32_t>(v.shape.size());
    a.tensor.dtype = v.dtype;
    a.tensor.shape = v.shape.data();
    a.tensor.strides = v.strides.data();
    a.tensor.byte_offset = static_cast<uint64_t>(v.offset) * (v.dtype.bits / 8u);
    out.push_back(a);
  }
  return out;
}

int run(const attncheck_plugin_v1* api, const char* op, const char* params,
        std::vector<View>& views, std::string* msg) {
  auto a = args_of(views);
  char m[kMsg] = {0};
  const int s = api->run(op, params, a.data(), static_cast<int>(a.size()), m, kMsg);
  *msg = m;
  return s;
}

constexpr DLDataType kI32{kDLInt, 32, 1};

}  // namespace

int main(int argc, char** argv) {
  const char* lib = argc > 1 ? argv[1] : "libattncheck_pybridge.so";
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("FAIL dlopen %s: %s\n", lib, dlerror());
    return 1;
  }
  auto get = reinterpret_cast<attncheck_plugin_v1_get_fn>(dlsym(h, "attncheck_plugin_v1_get"));
  const attncheck_plugin_v1* api = get();
  std::printf("library: %s\nops: %s\n", api->library, api->ops());
  char name[256] = {0}, arch[64] = {0}, msg[kMsg] = {0};
  const int d = api->device_info(name, sizeof name, arch, sizeof arch, msg, kMsg);
  check(d == ATTNCHECK_OK, std::string("device_info: ") + name + " / " + arch, msg);
  if (d != ATTNCHECK_OK) return 1;
  check(std::strncmp(arch, "sm_", 3) == 0 || std::strncmp(arch, "gfx", 3) == 0, "arch format");

  std::string m;
  {  // page_indices by hand (the docs/bridge.md example adapter): table [3, 3], row stride 5.
    std::vector<int32_t> table(15, -7), lens{5, 0, 9}, cu{0, 5, 5, 14}, out(17, -1);
    table[0] = 7, table[1] = 2, table[10] = 4, table[11] = 0, table[12] = 9;
    Buffer bt(api, table.data(), 60), bl(api, lens.data(), 12), bc(api, cu.data(), 16),
        bo(api, out.data(), 68);
    std::vector<View> v{{"block_table", &bt, kI32, {3, 3}, {5, 1}, 0},
                        {"seq_lens", &bl, kI32, {3}, {1}, 0},
                        {"cu_seq_lens", &bc, kI32, {4}, {1}, 0},
                        {"page_indices", &bo, kI32, {14}, {1}, 0}};
    const int s = run(api, "page_indices", R"({"kernel_block_size":4})", v, &m);
    check(s == ATTNCHECK_OK, "page_indices runs", m);
    const std::vector<int32_t> want{28, 29, 30, 31, 8, 16, 17, 18, 19, 0, 1, 2, 3, 36, -1, -1, -1};
    check(bo.read<int32_t>("page_indices") == want, "page_indices answer and untouched tail");
    check(bt.read<int32_t>("block_table") == table, "block_table unchanged");
    check(run(api, "page_indices", R"({"kernel_block_size":0})", v, &m) == ATTNCHECK_REFUSED &&
              m.find("kernel_block_size") != std::string::npos,
          "Refuse -> ATTNCHECK_REFUSED", m);
    double ms = -1;
    auto a = args_of(v);
    char tm[kMsg] = {0};
    const int t = api->time("page_indices", R"({"kernel_block_size":4})", a.data(),
                            static_cast<int>(a.size()), 2, 10, &ms, tm, kMsg);
    check(t == ATTNCHECK_OK && ms > 0, "time: " + std::to_string(ms) + " ms", tm);
  }
  {  // DLPack: strided views with offsets, int32 and bf16, seen by torch.from_dlpack.
    std::vector<int32_t> xs(16), outs(8, -1);
    for (int i = 0; i < 16; ++i) xs[static_cast<size_t>(i)] = 100 + i;
    std::vector<uint16_t> hs(12, 0x3F80);  // bf16 1.0
    Buffer bx(api, xs.data(), 64), bo(api, outs.data(), 32), bh(api, hs.data(), 24);
    std::vector<View> v{{"x", &bx, kI32, {3, 2}, {4, 2}, 3},
                        {"out", &bo, kI32, {3, 2}, {2, 1}, 1},
                        {"h", &bh, DLDataType{kDLBfloat, 16, 1}, {2, 2}, {1, 4}, 2}};
    const int s = run(api, "probe", "{}", v, &m);
    check(s == ATTNCHECK_OK, "torch.from_dlpack of strided, offset views", m);
    const std::vector<int32_t> want{-1, 206, 210, 214, 218, 222, 226, -1};
    check(bo.read<int32_t>("out") == want, "out = 2 x through the views");
    std::vector<uint16_t> hwant(12, 0x3F80);
    for (size_t i : {2u, 3u, 6u, 7u}) hwant[i] = 0x4000;  // [2,2] at offset 2, strides (1, 4)
    check(bh.read<uint16_t>("h") == hwant, "bf16 view doubled in place, nothing else");
  }
  {                                                      // fp8 as uint8 reinterpreted by as_torch.
    std::vector<uint8_t> codes{0x38, 0x40, 0x7E, 0xB8};  // e4m3fn 1, 2, 448, -1
    std::vector<float> outs(4, 0);
    Buffer bc(api, codes.data(), 4), bo(api, outs.data(), 16);
    std::vector<View> v{{"codes", &bc, DLDataType{kDLUInt, 8, 1}, {4}, {1}, 0},
                        {"out", &bo, DLDataType{kDLFloat, 32, 1}, {4}, {1}, 0}};
    const int s = run(api, "fp8_view", R"({"fp8_format":"e4m3fn"})", v, &m);
    check(s == ATTNCHECK_OK && bo.read<float>("out") == std::vector<float>{1, 2, 448, -1},
          "fp8 codes through as_torch(t, 'e4m3fn')", m);
  }
  std::vector<View> none;
  check(run(api, "raise", "{}", none, &m) == ATTNCHECK_HOST_ERROR &&
            m.find("py adapter 'torch_cuda'") != std::string::npos,
        "exception -> ATTNCHECK_HOST_ERROR naming the adapter", m.substr(0, 200));
  double gbps = 0, tflops = 0;
  const int r = api->roofline(&gbps, &tflops, msg, kMsg);
  check(r == ATTNCHECK_OK && gbps > 0 && tflops > 0,
        "roofline: " + std::to_string(gbps) + " GB/s, " + std::to_string(tflops) + " TFLOP/s", msg);
  // Last: a device-side assert poisons the CUDA context.
  const int e = run(api, "device_assert", "{}", none, &m);
  check(e == ATTNCHECK_ERROR,
        "device-side assert -> ATTNCHECK_ERROR (status " + std::to_string(e) + ")",
        m.substr(0, 300));
  std::printf("%s: %d failed\n", g_failed ? "FAILED" : "PASSED", g_failed);
  return g_failed ? 1 : 0;
}
