#include "device.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>

#include "core/numeric.h"
#include "run/partial.h"
#include "run/scheduling.h"

namespace attncheck {

namespace {
constexpr size_t kMsg = 2048;

// The bridge library: $ATTNCHECK_PYBRIDGE, else beside this executable's build tree
// (<build>/harness/cli/attncheck -> <build>/bridge/libattncheck_pybridge.so).
std::string python_bridge_path() {
  if (const char* env = std::getenv("ATTNCHECK_PYBRIDGE"); env && *env) return env;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto candidate =
      exe.parent_path().parent_path().parent_path() / "bridge" / "libattncheck_pybridge.so";
  if (ec || !std::filesystem::exists(candidate))
    throw std::runtime_error(
        "--kernels py:...: the Python bridge library was not found (looked for " +
        candidate.string() + "; build it, or set ATTNCHECK_PYBRIDGE; docs/bridge.md)");
  return candidate.string();
}

std::vector<std::string> split_csv(const char* s) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = s ? s : ""; *p; ++p) {
    if (*p == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else if (*p != ' ') {
      cur += *p;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Appends the UTF-8 sequence at s[i..n) to `out` when it is valid, else U+FFFD; the bytes taken.
size_t take_utf8(const unsigned char* s, size_t i, size_t n, std::string& out) {
  const unsigned char c = s[i];
  const size_t len = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
  bool ok = len > 0 && i + len <= n;
  for (size_t k = 1; ok && k < len; ++k) ok = (s[i + k] & 0xC0) == 0x80;
  if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
    uint32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) cp = cp << 6 | (s[i + k] & 0x3F);
    ok = cp >= (len == 2   ? 0x80u
                : len == 3 ? 0x800u
                           : 0x10000u) &&
         cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
  }
  if (!ok) {
    out += "\xEF\xBF\xBD";
    return 1;
  }
  out.append(reinterpret_cast<const char*>(s + i), len);
  return len;
}

std::string valid_utf8(const char* s, size_t n) {
  std::string out;
  out.reserve(n);
  const auto* u = reinterpret_cast<const unsigned char*>(s);
  for (size_t i = 0; i < n;) i += take_utf8(u, i, n, out);
  return out;
}

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f64:
      return {kDLFloat, 64, 1};
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    // DLPack 0.6 has no fp8 codes: fp8 travels as uint8 and its format is a named parameter.
    case DType::e4m3fn:
    case DType::e4m3fnuz:
    case DType::e5m2:
    case DType::e5m2fnuz:
    case DType::u8:
      return {kDLUInt, 8, 1};
    case DType::i8:
      return {kDLInt, 8, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
    case DType::i64:
      return {kDLInt, 64, 1};
  }
  return {kDLUInt, 8, 1};
}

// One device buffer per host storage, so views that share bytes on the host share them on the
// device.
struct DeviceStorage {
  std::shared_ptr<Storage> host;
  void* device = nullptr;
  size_t bytes = 0;         // storage bytes (guards excluded)
  size_t capacity = 0;      // the device block's bytes (guards and the block's spare tail included)
  bool cached = false;      // the block came from (and goes back to) the DeviceBlockCache
  DType dtype = DType::u8;  // of its first argument (a sparse storage's poison)
  std::vector<std::string> arg_names;
};

// An allocation or a fill that failed is tried again, with pauses growing to 1 s, for
// $ATTNCHECK_DEVICE_MEMORY_WAIT_S seconds (default 10, 0: never): the other worker processes on
// the GPU (each with a case's buffers and its kept blocks) may hold the memory for a moment, and
// a kernel loaded lazily needs some too. With one case per process, 16 processes on an H200
// failed 7 large-offset cases of the quick tier (8 GiB allocations, fills: out of memory) when
// each tried once. Only when the library's message says "out of memory", and not after a device
// error of the process: a broken context fails every call at once, and waiting on those cost a
// mutants run (about 20 faults) 6 to 10 s on an H200.

bool says_out_of_memory(const char* msg) {
  std::string text = abi_text(msg, kMsg);
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text.find("out of memory") != std::string::npos;
}

// `attempt` (which writes its failure into `msg`) until it succeeds, or fails otherwise than for
// memory, or the wait is over. Nothing on success, else the last failure's message (which may be
// empty) and how long it was waited for.
template <class Attempt>
std::optional<std::string> failure_after_memory_waits(const KernelLibrary& lib, const char* msg,
                                                      Attempt attempt) {
  if (attempt()) return std::nullopt;
  const auto start = std::chrono::steady_clock::now();
  double wait_s = 10;
  try {
    wait_s = device_memory_wait_s();
  } catch (const std::invalid_argument&) {  // refused at the run's start (cli/case_run.cpp)
  }
  const auto until = start + std::chrono::duration<double>(wait_s);
  auto pause = std::chrono::milliseconds(50);
  while (says_out_of_memory(msg) && !lib.device_error_seen() &&
         std::chrono::steady_clock::now() + pause < until) {
    std::this_thread::sleep_for(pause);
    if (attempt()) return std::nullopt;
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream os;
  os << abi_text(msg, kMsg);
  if (s > 0.01)
    os << std::fixed << std::setprecision(1) << " (still failing after " << s
       << " s of tries; other processes on the GPU may hold its memory: "
          "$ATTNCHECK_DEVICE_MEMORY_WAIT_S)";
  return os.str();
}
}  // namespace

// Device blocks kept between launches. A case makes a handful of allocations and every launch
// of it (relations, graph replay, stress) as many again; allocation and release are among the
// slowest device calls (a release synchronizes), and they dominated the per-case upload time of
// the quick tier on the GPU host (docs/results.md). A block is reused only for a storage of its
// size class, and every byte of it is uploaded again (guards, data, the spare tail in the guard
// pattern), so nothing of an earlier case can be read by the next one. Sizes are rounded up to
// eighths of a power of two; blocks over kLargest are not kept, nor more than kKept bytes in all.
// ATTNCHECK_DEVICE_BLOCK_CACHE=0 allocates and releases every block (the behaviour before).
class DeviceBlockCache {
 public:
  static constexpr size_t kLargest = size_t{128} << 20;
  static constexpr size_t kKept = size_t{512} << 20;

  explicit DeviceBlockCache(const KernelLibrary& lib) : lib_(lib), api_(lib.api()) {
    const char* env = std::getenv("ATTNCHECK_DEVICE_BLOCK_CACHE");
    enabled_ = !(env && std::string(env) == "0");
  }
  ~DeviceBlockCache() {
    const auto lock = lib_.exclusive();
    for (auto& [size, ptr] : free_) api_.release(ptr);
  }
  DeviceBlockCache(const DeviceBlockCache&) = delete;
  DeviceBlockCache& operator=(const DeviceBlockCache&) = delete;

  // The size class of a request (itself when blocks of that size are not kept).
  size_t capacity_for(size_t bytes) const {
    if (!enabled_ || bytes > kLargest) return bytes;
    size_t pow2 = 4096;
    while (pow2 < bytes) pow2 <<= 1;
    const size_t step = std::max<size_t>(pow2 / 8, 4096);
    return (bytes + step - 1) / step * step;
  }
  // A block of exactly `capacity` bytes (capacity_for's answer); false with `msg` on failure.
  bool acquire(size_t capacity, void** ptr, bool* cached, char* msg, size_t msg_len) {
    *cached = enabled_ && capacity <= kLargest;
    if (*cached) {
      if (auto it = free_.find(capacity); it != free_.end()) {
        *ptr = it->second;
        free_.erase(it);
        kept_ -= capacity;
        return true;
      }
    }
    return api_.alloc(capacity, ptr, msg, msg_len) == ATTNCHECK_OK;
  }
  void give_back(void* ptr, size_t capacity, bool cached) {
    if (!cached || kept_ + capacity > kKept) {
      const auto lock = lib_.exclusive();
      api_.release(ptr);
      return;
    }
    free_.emplace(capacity, ptr);
    kept_ += capacity;
  }

 private:
  const KernelLibrary& lib_;
  const attncheck_plugin_v1& api_;
  bool enabled_ = true;
  std::multimap<size_t, void*> free_;
  size_t kept_ = 0;
};

// Sparse storages' blocks (a large-offset case's gigabytes of extent) kept between launches, one
// set per process: allocating and releasing them cost a large-offset case more of its time under
// the launch lock than its kernel and its poison fill together. A block is reused only for a
// sparse storage of the same library that needs at least half of it, and every byte a launch can
// see is written again (guards, poison, window: upload_sparse), so nothing of an earlier case is
// read by the next one. At most kKept bytes in all (less when several processes share the GPU:
// see the constructor), the oldest released first; an allocation that
// fails releases every kept block and is tried once more. The cache lives in the process (the
// threads' runners and several libraries share one context), under the launch lock.
// ATTNCHECK_DEVICE_BLOCK_CACHE=0 keeps none.
class SparseBlockCache {
 public:
  static constexpr size_t kKept = kSparseBlockCacheMax;  // unless told otherwise (below)
  static constexpr size_t kGranule = size_t{64} << 20;

  static SparseBlockCache& process() {
    static SparseBlockCache cache;
    return cache;
  }
  static size_t capacity_for(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }
  // A block of at least `bytes` (capacity_for) for `lib`; false with `msg` on failure.
  bool acquire(const KernelLibrary& lib, size_t bytes, void** ptr, size_t* capacity, char* msg,
               size_t msg_len) {
    const auto lock = lib.exclusive();
    const size_t want = capacity_for(bytes);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it)
      if (it->api == &lib.api() && it->capacity >= want && it->capacity / 2 <= want &&
          (best == kept_.end() || it->capacity < best->capacity))
        best = it;
    if (best != kept_.end()) {
      *ptr = best->ptr;
      *capacity = best->capacity;
      bytes_ -= best->capacity;
      kept_.erase(best);
      return true;
    }
    *capacity = want;
    if (lib.api().alloc(want, ptr, msg, msg_len) == ATTNCHECK_OK) return true;
    if (kept_.empty()) return false;
    release_while([](size_t) { return true; });
    return lib.api().alloc(want, ptr, msg, msg_len) == ATTNCHECK_OK;
  }
  void give_back(const KernelLibrary& lib, void* ptr, size_t capacity) {
    const auto lock = lib.exclusive();
    if (!enabled_ || capacity > max_kept_) {
      lib.api().release(ptr);
      return;
    }
    release_while([&](size_t kept) { return kept + capacity > max_kept_; });
    kept_.push_back({&lib.api(), ptr, capacity});
    bytes_ += capacity;
  }

 private:
  // $ATTNCHECK_SPARSE_BLOCK_CACHE_BYTES: the pool's share of the GPU for this process
  // (PoolPlan::slot_env), since other processes on the same GPU keep theirs too.
  SparseBlockCache() {
    const char* env = std::getenv("ATTNCHECK_DEVICE_BLOCK_CACHE");
    enabled_ = !(env && std::string(env) == "0");
    if (const char* bytes = std::getenv("ATTNCHECK_SPARSE_BLOCK_CACHE_BYTES"); bytes && *bytes) {
      char* end = nullptr;
      const unsigned long long n = std::strtoull(bytes, &end, 10);
      if (end && *end == '\0') max_kept_ = std::min<unsigned long long>(n, kKept);
    }
  }
  // Releases the oldest kept blocks while `more(bytes kept)` says so.
  template <class More>
  void release_while(More more) {
    while (!kept_.empty() && more(bytes_)) {
      kept_.front().api->release(kept_.front().ptr);
      bytes_ -= kept_.front().capacity;
      kept_.pop_front();
    }
  }
  struct Block {
    const attncheck_plugin_v1* api;
    void* ptr;
    size_t capacity;
  };
  bool enabled_ = true;
  size_t max_kept_ = kKept;
  std::deque<Block> kept_;
  size_t bytes_ = 0;
};

// One page-locked host buffer per runner (the library's host_alloc, docs/abi.md), grown as a
// launch needs and kept: a launch's packed upload is written into it and its read-back lands in
// it, so both copies are DMA transfers and the launch holds the launch lock for less. Launches
// larger than kLargest, libraries without host_alloc, and ATTNCHECK_PINNED_STAGING=0 stage in
// ordinary memory (reserve() answers nullptr).
class PinnedStaging {
 public:
  static constexpr size_t kLargest = size_t{256} << 20;

  explicit PinnedStaging(const KernelLibrary& lib) : lib_(lib) {
    const char* env = std::getenv("ATTNCHECK_PINNED_STAGING");
    enabled_ = ATTNCHECK_EXT_HAS(lib.extension(), host_alloc) &&
               ATTNCHECK_EXT_HAS(lib.extension(), host_release) &&
               !(env && std::string(env) == "0");
  }
  ~PinnedStaging() { drop(); }
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;

  // At least `bytes` of the buffer, valid until the next reserve(); nullptr: use ordinary memory.
  std::byte* reserve(size_t bytes) {
    if (!enabled_ || bytes > kLargest) return nullptr;
    if (bytes <= capacity_) return static_cast<std::byte*>(ptr_);
    drop();
    const size_t want = std::min(kLargest, std::max(bytes, capacity_ * 2));
    char msg[kMsg] = {0};
    const auto lock = lib_.exclusive();  // a library call: one at a time (any_thread)
    if (lib_.extension()->host_alloc(want, &ptr_, msg, kMsg) != ATTNCHECK_OK) {
      ptr_ = nullptr;
      enabled_ = false;  // page-locked memory is scarce: ordinary memory from here on
      return nullptr;
    }
    capacity_ = want;
    return static_cast<std::byte*>(ptr_);
  }

 private:
  void drop() {
    if (!ptr_) return;
    const auto lock = lib_.exclusive();
    lib_.extension()->host_release(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
  }
  const KernelLibrary& lib_;
  bool enabled_ = false;
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

namespace {
class DeviceBuffers {
 public:
  DeviceBuffers(const KernelLibrary& lib, DeviceBlockCache& blocks, PinnedStaging& pinned)
      : lib_(lib), api_(lib.api()), ext_(lib.extension()), blocks_(blocks), pinned_(pinned) {}
  ~DeviceBuffers() { give_back_all(); }
  // Every device buffer back to the block cache (or released): called under the launch lock
  // once the read-back is done, so that a process's threads hold one case's buffers on the GPU
  // at a time (what sizes the pools, run/scheduling.h); else at destruction.
  void give_back_all() {
    for (auto& s : storages_) {
      if (!s.device) continue;
      if (s.host->sparse())
        SparseBlockCache::process().give_back(lib_, std::exchange(s.device, nullptr), s.capacity);
      else
        blocks_.give_back(std::exchange(s.device, nullptr), s.capacity, s.cached);
    }
    if (staging_.device)
      blocks_.give_back(std::exchange(staging_.device, nullptr), staging_.capacity,
                        staging_.cached);
  }
  // The host half of an upload, outside the launch lock: every storage of the problem's
  // arguments, and the dense ones' images (guard, data, guard continued over the block's spare
  // tail) packed into one host buffer.
  void plan(const Problem& p) {
    const size_t G = DeviceRunner::kGuardBytes;
    for (const auto& a : p.args) {
      const auto& host = a.tensor.storage();
      if (DeviceStorage* known = find(host)) {
        known->arg_names.push_back(a.name);
        continue;
      }
      DeviceStorage s;
      s.host = host;
      s.bytes = host->bytes.size();
      s.arg_names.push_back(a.name);
      s.dtype = a.tensor.dtype();
      if (!host->sparse()) s.capacity = blocks_.capacity_for(s.bytes + 2 * G);
      storages_.push_back(std::move(s));
    }
    size_t total = 0;
    for (const auto& s : storages_)
      if (!s.host->sparse()) total += s.capacity;
    image_size_ = total;
    image_ = pinned_.reserve(total);
    if (!image_) {
      ordinary_image_.resize(total);
      image_ = ordinary_image_.data();
    }
    size_t at = 0;
    for (const auto& s : storages_) {
      if (s.host->sparse()) continue;
      std::byte* block = image_ + at;
      for (size_t k = 0; k < G; ++k) block[k] = guard_byte(k);
      std::memcpy(block + G, s.host->bytes.data(), s.bytes);
      for (size_t k = 0; G + s.bytes + k < s.capacity; ++k)
        block[G + s.bytes + k] = guard_byte(k + 1);
      at += s.capacity;
    }
  }
  // The device half, under the launch lock: blocks for the dense storages, the packed image
  // copied once into a staging block and spread with the library's copy_within_device (without
  // it, or for a single storage, one copy each); sparse storages as upload_sparse says.
  void send() {
    const size_t G = DeviceRunner::kGuardBytes;
    char msg[kMsg] = {0};
    std::vector<size_t> dense;  // indices into storages_
    for (size_t i = 0; i < storages_.size(); ++i) {
      DeviceStorage& s = storages_[i];
      if (s.host->sparse()) {
        upload_sparse(s);
        continue;
      }
      if (const auto why = failure_after_memory_waits(
              lib_, msg,
              [&] { return blocks_.acquire(s.capacity, &s.device, &s.cached, msg, kMsg); });
          why)
        throw std::runtime_error("device allocation of " + std::to_string(s.bytes + 2 * G) +
                                 " bytes for '" + s.arg_names.front() + "' failed: " + *why);
      dense.push_back(i);
    }
    const size_t total = image_size_;
    size_t at = 0;
    auto failed = [&](const DeviceStorage& s) {
      return std::runtime_error("copy to device for '" + s.arg_names.front() +
                                "' failed: " + abi_text(msg, kMsg));
    };
    if (dense.size() > 1 && ATTNCHECK_EXT_HAS(ext_, copy_within_device)) {
      staging_.capacity = blocks_.capacity_for(total);
      if (const auto why = failure_after_memory_waits(lib_, msg,
                                                      [&] {
                                                        return blocks_.acquire(
                                                            staging_.capacity, &staging_.device,
                                                            &staging_.cached, msg, kMsg);
                                                      });
          why)
        throw std::runtime_error("device allocation of " + std::to_string(total) +
                                 " staging bytes failed: " + *why);
      if (api_.copy_to_device(staging_.device, image_, total, msg, kMsg) != ATTNCHECK_OK)
        throw std::runtime_error(std::string("copy to device (staging) failed: ") +
                                 abi_text(msg, kMsg));
      at = 0;
      for (size_t i : dense) {
        const DeviceStorage& s = storages_[i];
        if (ext_->copy_within_device(s.device, static_cast<std::byte*>(staging_.device) + at,
                                     s.capacity, msg, kMsg) != ATTNCHECK_OK)
          throw failed(s);
        at += s.capacity;
      }
      return;
    }
    at = 0;
    for (size_t i : dense) {
      const DeviceStorage& s = storages_[i];
      if (api_.copy_to_device(s.device, image_ + at, s.capacity, msg, kMsg) != ATTNCHECK_OK)
        throw failed(s);
      at += s.capacity;
    }
  }
  DeviceStorage* find(const std::shared_ptr<Storage>& host) {
    for (auto& s : storages_)
      if (s.host == host) return &s;
    return nullptr;
  }
  // Guard before, the host-held bytes, guard after (for a sparse storage: its window only; the
  // poisoned rest is not read back); a dense storage's whole block (its trailing guard runs to
  // the block's end). read_back writes that many bytes at `staging`.
  static size_t read_back_size(const DeviceStorage& s) {
    return s.host->sparse() ? s.bytes + 2 * DeviceRunner::kGuardBytes : s.capacity;
  }
  void read_back(const DeviceStorage& s, std::span<std::byte> staging) const {
    const size_t G = DeviceRunner::kGuardBytes;
    char msg[kMsg] = {0};
    auto* dev = static_cast<std::byte*>(s.device);
    const bool ok =
        s.host->sparse()
            ? api_.copy_to_host(staging.data(), dev, G, msg, kMsg) == ATTNCHECK_OK &&
                  api_.copy_to_host(staging.data() + G, dev + G + s.host->window_begin, s.bytes,
                                    msg, kMsg) == ATTNCHECK_OK &&
                  api_.copy_to_host(staging.data() + G + s.bytes, dev + G + s.host->extent, G, msg,
                                    kMsg) == ATTNCHECK_OK
            : api_.copy_to_host(staging.data(), dev, staging.size(), msg, kMsg) == ATTNCHECK_OK;
    if (!ok) throw std::runtime_error(std::string("copy to host failed: ") + abi_text(msg, kMsg));
  }
  std::vector<DeviceStorage>& all() { return storages_; }
  // Where a launch's read-back goes: the page-locked buffer (the upload image is no longer
  // needed), else ordinary memory.
  std::span<std::byte> read_back_space(size_t bytes) {
    std::byte* at = pinned_.reserve(bytes);
    if (at) return {at, bytes};
    ordinary_image_.resize(bytes);
    return {ordinary_image_.data(), bytes};
  }
  // Graph replay: the device buffers of `from`'s storages get the bytes of `to`'s (the same
  // arguments' storages, same sizes; shared ones again, since the capture's warm-up launch wrote
  // outputs and inouts) and stand for them from here on. Guards stay as they are.
  void replace_contents(const Problem& from, const Problem& to) {
    std::map<const Storage*, std::shared_ptr<Storage>> next;
    for (size_t i = 0; i < from.args.size(); ++i) {
      const auto& old = from.args[i].tensor.storage();
      const auto& now = to.args.at(i).tensor.storage();
      const auto [it, fresh] = next.emplace(old.get(), now);
      if (!fresh && it->second != now)
        throw std::runtime_error("graph replay: argument '" + to.args[i].name +
                                 "' does not share storage as in the captured problem");
    }
    char msg[kMsg] = {0};
    for (auto& s : storages_) {
      const auto it = next.find(s.host.get());
      if (it == next.end()) continue;  // every storage: the capture's warm-up wrote outputs
      const Storage& host = *it->second;
      if (host.bytes.size() != s.bytes || host.window_begin != s.host->window_begin ||
          host.extent != s.host->extent)
        throw std::runtime_error("graph replay: the storage of " + s.arg_names.front() +
                                 " differs in size from the captured problem's");
      auto* dev = static_cast<std::byte*>(s.device) + DeviceRunner::kGuardBytes + host.window_begin;
      if (s.bytes &&
          api_.copy_to_device(dev, host.bytes.data(), s.bytes, msg, kMsg) != ATTNCHECK_OK)
        throw std::runtime_error("copy to device for '" + s.arg_names.front() +
                                 "' failed: " + abi_text(msg, kMsg));
      s.host = it->second;
    }
  }

 private:
  // A sparse storage: the whole extent on the device, guards around it, the host window uploaded
  // at its place and everything else poisoned on the device (the library's fill, else uploads of
  // a poison chunk), so gigabytes of cache never exist on the host.
  void upload_sparse(DeviceStorage& s) {
    const size_t G = DeviceRunner::kGuardBytes;
    const uint64_t extent = s.host->extent, begin = s.host->window_begin;
    const size_t total = extent + 2 * G;
    s.cached = false;  // gigabytes of extent: kept by the process's SparseBlockCache instead
    char msg[kMsg] = {0};
    const std::string& arg = s.arg_names.front();
    if (const auto why = failure_after_memory_waits(lib_, msg,
                                                    [&] {
                                                      return SparseBlockCache::process().acquire(
                                                          lib_, total, &s.device, &s.capacity, msg,
                                                          kMsg);
                                                    });
        why) {
      s.device = nullptr;
      throw std::runtime_error("device allocation of " + std::to_string(total) +
                               " bytes for sparse '" + arg + "' failed: " + *why);
    }
    auto* dev = static_cast<std::byte*>(s.device);
    auto upload = [&](std::byte* dst, const void* src, size_t n) {
      if (n && api_.copy_to_device(dst, src, n, msg, kMsg) != ATTNCHECK_OK)
        throw std::runtime_error("copy to device for '" + arg + "' failed: " + abi_text(msg, kMsg));
    };
    const uint32_t pattern = sparse_poison_pattern(s.dtype);
    auto poison = [&](std::byte* dst, size_t n) {
      if (n == 0) return;
      if (ATTNCHECK_EXT_HAS(ext_, fill)) {
        if (const auto why = failure_after_memory_waits(
                lib_, msg, [&] { return ext_->fill(dst, n, pattern, msg, kMsg) == ATTNCHECK_OK; });
            why)
          throw std::runtime_error("device fill for '" + arg + "' failed: " + *why);
        return;
      }
      std::vector<std::byte> chunk(std::min<size_t>(n, size_t{64} << 20));
      for (size_t i = 0; i < chunk.size(); ++i)
        chunk[i] = static_cast<std::byte>(pattern >> (8 * (i % 4)));
      for (size_t done = 0; done < n; done += chunk.size())
        upload(dst + done, chunk.data(), std::min(chunk.size(), n - done));
    };
    std::vector<std::byte> guards(G);
    for (size_t i = 0; i < G; ++i) guards[i] = guard_byte(i);
    upload(dev, guards.data(), G);
    for (size_t i = 0; i < G; ++i) guards[i] = guard_byte(i + 1);
    upload(dev + G + extent, guards.data(), G);
    // The fill is byte-phased from its start: begin poison regions at the extent's start so the
    // pattern stays aligned with elements on both sides of the window.
    poison(dev + G, begin);
    const uint64_t end = begin + s.bytes;
    const uint64_t tail = end - end % 4;  // restart the pattern at a 4-byte boundary
    poison(dev + G + tail, extent - tail);
    upload(dev + G + begin, s.host->bytes.data(), s.bytes);
  }

  const KernelLibrary& lib_;
  const attncheck_plugin_v1& api_;
  const attncheck_plugin_ext_v1* ext_;
  DeviceBlockCache& blocks_;
  PinnedStaging& pinned_;
  std::vector<DeviceStorage> storages_;
  DeviceStorage staging_;  // the packed upload's block (no host storage)
  // plan(): the dense storages' blocks, packed, in the page-locked buffer or in ordinary_image_
  // (which also holds a read-back that does not fit the page-locked buffer).
  std::byte* image_ = nullptr;
  size_t image_size_ = 0;
  std::vector<std::byte> ordinary_image_;
};

struct Marshalled {
  std::vector<attncheck_arg> args;
  std::vector<std::vector<int64_t>> shapes, strides;  // keep DLTensor arrays alive
};

Marshalled marshal(const Problem& p, DeviceBuffers& bufs, bool rocm) {
  Marshalled m;
  m.args.reserve(p.args.size());
  m.shapes.reserve(p.args.size());
  m.strides.reserve(p.args.size());
  for (const auto& a : p.args) {
    const DeviceStorage& s = *bufs.find(a.tensor.storage());
    m.shapes.push_back(a.tensor.shape());
    m.strides.push_back(a.tensor.strides());
    attncheck_arg arg{};
    arg.name = a.name.c_str();
    arg.tensor.data = static_cast<std::byte*>(s.device) + DeviceRunner::kGuardBytes;
    arg.tensor.device = {rocm ? kDLROCM : kDLCUDA, 0};
    arg.tensor.ndim = static_cast<int32_t>(a.tensor.ndim());
    arg.tensor.dtype = dl_dtype(a.tensor.dtype());
    arg.tensor.shape = m.shapes.back().data();
    arg.tensor.strides = m.strides.back().data();
    arg.tensor.byte_offset = static_cast<uint64_t>(a.tensor.offset()) * a.tensor.element_size();
    m.args.push_back(arg);
  }
  return m;
}
}  // namespace

uint32_t sparse_poison_pattern(DType dtype) {
  const size_t es = dtype_size(dtype);
  if (!is_floating(dtype) || es > 4) return 0xFFFFFFFFu;
  const auto bits = static_cast<uint32_t>(nan_bits(dtype));
  return es == 4 ? bits : es == 2 ? bits | bits << 16 : bits * 0x01010101u;
}

std::byte guard_byte(size_t i) {
  return static_cast<std::byte>((0xA5u ^ (i * 0x3Bu) ^ (i >> 8)) & 0xFFu);
}

std::string abi_text(const char* buf, size_t size) {
  if (!buf) return "";
  return valid_utf8(buf, ::strnlen(buf, size));
}

std::string abi_returned_text(const char* s, size_t max, bool* terminated) {
  if (terminated) *terminated = true;
  if (!s) return "";
  const size_t n = ::strnlen(s, max);
  std::string text = valid_utf8(s, n);
  if (n == max) {
    if (terminated) *terminated = false;
    text += " ... (not NUL-terminated within " + std::to_string(max) + " bytes)";
  }
  return text;
}

namespace {
// Bounds on the strings a library returns (abi_returned_text).
constexpr size_t kMaxName = 1024, kMaxEntryList = size_t{1} << 20, kMaxDeclared = 4096;

// Every function of the v1 table is called by some command: a NULL one is refused at load, not
// met as a crash later.
void check_table(const attncheck_plugin_v1& api, const std::string& path) {
  const std::pair<const char*, bool> fields[] = {{"ops", api.ops != nullptr},
                                                 {"device_info", api.device_info != nullptr},
                                                 {"alloc", api.alloc != nullptr},
                                                 {"release", api.release != nullptr},
                                                 {"copy_to_device", api.copy_to_device != nullptr},
                                                 {"copy_to_host", api.copy_to_host != nullptr},
                                                 {"run", api.run != nullptr},
                                                 {"time", api.time != nullptr},
                                                 {"roofline", api.roofline != nullptr}};
  std::string missing;
  for (const auto& [name, present] : fields)
    if (!present) missing += (missing.empty() ? "" : ", ") + std::string(name);
  if (!missing.empty())
    throw std::runtime_error("kernel library '" + path + "': its table (attncheck_plugin_v1) " +
                             "has NULL function pointers: " + missing);
}
}  // namespace

std::unique_ptr<KernelLibrary> KernelLibrary::open(const std::string& spec) {
  std::unique_ptr<KernelLibrary> lib(new KernelLibrary());
  lib->path_ = spec;
  std::string path = spec;
  if (spec.rfind("py:", 0) == 0) {
    // The Python bridge is a plugin like any other; the adapter module travels in the
    // environment so that worker processes started later load the same one.
    const std::string module = spec.substr(3);
    if (module.empty()) throw std::runtime_error("--kernels py: names no adapter module");
    ::setenv("ATTNCHECK_PY_ADAPTER", module.c_str(), 1);
    path = python_bridge_path();
  }
  lib->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle_)
    throw std::runtime_error("cannot load kernel library '" + path + "': " + dlerror());
  auto get =
      reinterpret_cast<attncheck_plugin_v1_get_fn>(dlsym(lib->handle_, "attncheck_plugin_v1_get"));
  if (!get)
    throw std::runtime_error("kernel library '" + path + "' has no symbol attncheck_plugin_v1_get");
  lib->api_ = get();
  if (!lib->api_ || lib->api_->abi_version != ATTNCHECK_ABI_VERSION)
    throw std::runtime_error("kernel library '" + path + "' speaks ABI version " +
                             (lib->api_ ? std::to_string(lib->api_->abi_version) : "?") +
                             ", harness " + std::to_string(ATTNCHECK_ABI_VERSION));
  check_table(*lib->api_, path);
  lib->name_ = lib->api_->library ? abi_returned_text(lib->api_->library, kMaxName) : "?";
  bool listed = true;
  const std::string entries = abi_returned_text(lib->api_->ops(), kMaxEntryList, &listed);
  if (!listed)
    throw std::runtime_error("kernel library '" + path + "': its entry list (ops) is not " +
                             "NUL-terminated within " + std::to_string(kMaxEntryList) + " bytes");
  lib->entries_ = split_csv(entries.c_str());
  // Optional: libraries built before the extension simply lack the symbol.
  if (auto get_ext = reinterpret_cast<attncheck_plugin_ext_v1_get_fn>(
          dlsym(lib->handle_, "attncheck_plugin_ext_v1_get")))
    lib->ext_ = get_ext();
  return lib;
}

KernelLibrary::~KernelLibrary() {
  // Never dlclose: GPU runtimes register atexit handlers inside the library.
}

std::string KernelLibrary::declared_contract(const std::string& entry) const {
  if (!ATTNCHECK_EXT_HAS(ext_, contract)) return "";
  return declared(contracts_, entry, [&] { return ext_->contract(entry.c_str()); });
}

std::vector<std::string> KernelLibrary::declared_properties(const std::string& entry) const {
  std::vector<std::string> out;
  if (!ATTNCHECK_EXT_HAS(ext_, properties)) return out;
  const std::string list =
      declared(properties_, entry, [&] { return ext_->properties(entry.c_str()); });
  std::string item;
  for (const char* c = list.c_str();; ++c) {
    if (*c == ',' || *c == '\0') {
      const auto b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
      if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
      item.clear();
      if (*c == '\0') break;
    } else {
      item += *c;
    }
  }
  return out;
}

std::string KernelLibrary::declared_partial(const std::string& entry) const {
  if (!ATTNCHECK_EXT_HAS(ext_, partial)) return "";
  return declared(partials_, entry, [&] { return ext_->partial(entry.c_str()); });
}

std::string KernelLibrary::declared(std::map<std::string, std::string>& asked,
                                    const std::string& entry,
                                    const std::function<const char*()>& ask) const {
  {
    const std::lock_guard<std::mutex> lock(declared_mutex_);
    if (const auto it = asked.find(entry); it != asked.end()) return it->second;
  }
  std::string answer;
  {
    // One library call at a time (any_thread), and the answer copied before another call may
    // change it.
    const auto lock = exclusive();
    answer = abi_returned_text(ask(), kMaxDeclared);
  }
  const std::lock_guard<std::mutex> lock(declared_mutex_);
  return asked.emplace(entry, answer).first->second;
}

bool KernelLibrary::has_entry(const std::string& entry) const {
  return std::find(entries_.begin(), entries_.end(), entry) != entries_.end();
}

bool KernelLibrary::any_thread() const {
  return ext_ && ext_->size >= offsetof(attncheck_plugin_ext_v1, any_thread) + sizeof(uint32_t) &&
         ext_->any_thread == 1;
}

std::recursive_mutex& KernelLibrary::launch_mutex() {
  static std::recursive_mutex m;
  return m;
}

std::optional<std::thread::id> KernelLibrary::first_device_error_;

void KernelLibrary::note_device_error() const {
  const auto lock = exclusive();
  if (!first_device_error_) first_device_error_ = std::this_thread::get_id();
}

bool KernelLibrary::first_device_error_was_mine() const {
  const auto lock = exclusive();
  return first_device_error_ == std::this_thread::get_id();
}

double device_memory_wait_s() {
  const char* env = std::getenv("ATTNCHECK_DEVICE_MEMORY_WAIT_S");
  if (!env || !*env) return 10;
  char* end = nullptr;
  const double s = std::strtod(env, &end);
  if (*end != '\0' || !std::isfinite(s) || s < 0 || s > 3600)
    throw std::invalid_argument(std::string("ATTNCHECK_DEVICE_MEMORY_WAIT_S='") + env +
                                "': expected seconds, >= 0 and <= 3600");
  return s;
}

bool KernelLibrary::device_error_seen() const {
  const auto lock = exclusive();
  return first_device_error_.has_value();
}

std::optional<DeviceInfo> KernelLibrary::device(std::string* why) const {
  char name[256] = {0}, arch[64] = {0}, msg[kMsg] = {0};
  if (api_->device_info(name, sizeof name, arch, sizeof arch, msg, kMsg) != ATTNCHECK_OK) {
    if (why) *why = abi_text(msg);
    return std::nullopt;
  }
  return DeviceInfo{abi_text(name), abi_text(arch)};
}

DeviceRunner::DeviceRunner(const KernelLibrary& lib, std::string arch)
    : lib_(lib),
      arch_(std::move(arch)),
      blocks_(std::make_unique<DeviceBlockCache>(lib)),
      pinned_(std::make_unique<PinnedStaging>(lib)) {}

DeviceRunner::~DeviceRunner() {
  const auto lock = lib_.exclusive();
  if (l2_scratch_) lib_.api().release(l2_scratch_);
}

namespace {
constexpr size_t kL2ScratchBytes = size_t{512} << 20;  // > every L2 / Infinity Cache here (256 MiB)
}  // namespace

bool DeviceRunner::can_flush_l2() const {
  return ATTNCHECK_EXT_HAS(lib_.extension(), fill);
}

bool DeviceRunner::can_run_background() const {
  // Field by field: the table grew (contract) after background was added.
  return ATTNCHECK_EXT_HAS(lib_.extension(), background);
}

// Between the uploads and the launch: evict L2, start concurrent work. Throws on device errors.
void DeviceRunner::prepare_launch(const LaunchConditions& when) const {
  char msg[kMsg] = {0};
  if (when.flush_l2 && can_flush_l2()) {
    if (!l2_scratch_ &&
        lib_.api().alloc(kL2ScratchBytes, &l2_scratch_, msg, kMsg) != ATTNCHECK_OK) {
      l2_scratch_ = nullptr;
      throw std::runtime_error(std::string("L2 flush buffer: ") + abi_text(msg, kMsg));
    }
    if (lib_.extension()->fill(l2_scratch_, kL2ScratchBytes, 0x5A5A5A5Au, msg, kMsg) !=
        ATTNCHECK_OK)
      throw std::runtime_error(std::string("L2 flush: ") + abi_text(msg, kMsg));
  }
  if (when.background_us > 0 && can_run_background() &&
      lib_.extension()->background(when.background_us, msg, kMsg) != ATTNCHECK_OK)
    throw std::runtime_error(std::string("background work: ") + abi_text(msg, kMsg));
}

DeviceOutcome DeviceRunner::run(const Problem& p, const LaunchConditions& when) const {
  try {
    return run_unguarded(p, when);
  } catch (const std::exception& e) {
    DeviceOutcome out;
    out.status = ATTNCHECK_ERROR;
    out.message = std::string("device I/O failed: ") + e.what();
    return out;
  }
}

namespace {
// One launch's device calls under the library's launch lock (KernelLibrary::exclusive). A section
// left by an exception (a failed allocation or copy: the launch's device error) or marked
// failed() records the device error while still holding the lock, so that the first launch to
// fail is the one recorded even when other threads' launches fail after it.
class LaunchSection {
 public:
  // `held_ms` (may be null) gets the time the lock was held.
  explicit LaunchSection(const KernelLibrary& lib, double* held_ms = nullptr)
      : lib_(lib),
        lock_(lib.exclusive()),
        exceptions_(std::uncaught_exceptions()),
        held_ms_(held_ms),
        acquired_(std::chrono::steady_clock::now()) {}
  ~LaunchSection() {
    if (lock_.owns_lock() && (failed_ || std::uncaught_exceptions() > exceptions_))
      lib_.note_device_error();
    if (lock_.owns_lock()) count_held();
  }
  LaunchSection(const LaunchSection&) = delete;
  LaunchSection& operator=(const LaunchSection&) = delete;
  void failed() { failed_ = true; }
  // The device calls are done; the host work after them runs unlocked.
  void release() {
    if (failed_) lib_.note_device_error();
    count_held();
    lock_.unlock();
  }

 private:
  void count_held() {
    if (held_ms_)
      *held_ms_ +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - acquired_)
              .count();
  }
  const KernelLibrary& lib_;
  std::unique_lock<std::recursive_mutex> lock_;
  int exceptions_;
  double* held_ms_;
  std::chrono::steady_clock::time_point acquired_;
  bool failed_ = false;
};

// The ABI's case_context, when the library wants it: false (msg filled) when it fails.
bool send_case_context(const KernelLibrary& lib, const Problem& p, char* msg) {
  // A problem made by hand (tests) has none: "null" then, so no earlier case's context lingers.
  if (!ATTNCHECK_EXT_HAS(lib.extension(), case_context)) return true;
  const std::string context = p.case_context.dump();
  return lib.extension()->case_context(context.c_str(), msg, kMsg) == ATTNCHECK_OK;
}

// The library reads $ATTNCHECK_SMEM_POISON at every launch (docs/abi.md): a launch's own setting
// holds for that launch only.
class SmemPoisonFor {
 public:
  explicit SmemPoisonFor(const std::string& value) : set_(!value.empty()) {
    if (!set_) return;
    if (const char* v = std::getenv(kName)) old_ = v;
    ::setenv(kName, value.c_str(), 1);
  }
  ~SmemPoisonFor() {
    if (!set_) return;
    if (old_)
      ::setenv(kName, old_->c_str(), 1);
    else
      ::unsetenv(kName);
  }
  SmemPoisonFor(const SmemPoisonFor&) = delete;
  SmemPoisonFor& operator=(const SmemPoisonFor&) = delete;

 private:
  static constexpr const char* kName = "ATTNCHECK_SMEM_POISON";
  bool set_;
  std::optional<std::string> old_;
};
}  // namespace

namespace {
double ms_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

namespace {
// After a launch, under the launch lock: every storage read back (bytes in the order of
// bufs.all()).
std::vector<std::span<const std::byte>> read_back_all(DeviceBuffers& bufs, LaunchTimings& timings) {
  const auto read_start = std::chrono::steady_clock::now();
  size_t total = 0;
  for (const auto& s : bufs.all()) total += DeviceBuffers::read_back_size(s);
  const std::span<std::byte> space = bufs.read_back_space(total);
  std::vector<std::span<const std::byte>> images;
  size_t at = 0;
  for (const auto& s : bufs.all()) {
    const std::span<std::byte> image = space.subspan(at, DeviceBuffers::read_back_size(s));
    bufs.read_back(s, image);
    images.push_back(image);
    at += image.size();
  }
  timings.download_ms += ms_between(read_start, std::chrono::steady_clock::now());
  return images;
}

// After read_back_all, still under the launch lock: `release_first` (a graph's release), then the
// device blocks given back, counted as download.
template <class Release>
void give_back_timed(DeviceBuffers& bufs, Release release_first, LaunchTimings& timings) {
  const auto start = std::chrono::steady_clock::now();
  release_first();
  bufs.give_back_all();
  timings.download_ms += ms_between(start, std::chrono::steady_clock::now());
}

// The first byte where `a` and `b` differ, or n: large equal runs compared by memcmp.
size_t first_difference(const std::byte* a, const std::byte* b, size_t n) {
  constexpr size_t kRun = 4096;
  size_t at = 0;
  while (at + kRun <= n && std::memcmp(a + at, b + at, kRun) == 0) at += kRun;
  for (; at < n; ++at)
    if (a[at] != b[at]) return at;
  return n;
}

// 0xFF for each byte of storage `s` that an output or inout view of `p` may write, else 0
// (host-window relative; a sparse output counts over its held rows).
std::vector<uint8_t> writable_bytes(const Problem& p, const DeviceStorage& s) {
  std::vector<uint8_t> writable(s.bytes, 0);
  for (const auto& a : p.args) {
    if (a.tensor.storage() != s.host || a.role == Role::input) continue;
    const size_t es = a.tensor.element_size();
    const Tensor held = a.tensor.held_rows();
    const auto [lo, hi] = held.extent();
    if (held.numel() == 0 || lo < 0) continue;
    auto mark = [&](size_t first_byte, size_t n) {  // clipped to the window
      if (first_byte >= s.bytes) return;
      std::fill_n(writable.begin() + static_cast<std::ptrdiff_t>(first_byte),
                  std::min(n, s.bytes - first_byte), uint8_t{0xFF});
    };
    const auto window = static_cast<int64_t>(s.host->window_begin);
    if (held.is_contiguous())
      mark(static_cast<size_t>(lo * static_cast<int64_t>(es) - window),
           static_cast<size_t>((hi - lo) * static_cast<int64_t>(es)));
    else
      held.for_each_offset([&](int64_t off, int64_t) {
        mark(static_cast<size_t>(off * static_cast<int64_t>(es) - window), es);
      });
  }
  return writable;
}

// The first byte from `from` on that changed outside `writable` (empty: nothing is writable),
// or n. Eight bytes at a time: a change shows as a set bit of (now ^ before) where the mask is 0.
size_t first_unwritable_change(const std::byte* now, const std::byte* before,
                               const std::vector<uint8_t>& writable, size_t from, size_t n) {
  if (writable.empty()) return from;  // `from` changed and nothing may
  size_t b = from;
  for (; b % 8 != 0 && b < n; ++b)
    if (now[b] != before[b] && writable[b] == 0) return b;
  for (; b + 8 <= n; b += 8) {
    uint64_t x, y, w;
    std::memcpy(&x, now + b, 8);
    std::memcpy(&y, before + b, 8);
    std::memcpy(&w, writable.data() + b, 8);
    if (((x ^ y) & ~w) == 0) continue;
    for (size_t k = b; k < b + 8; ++k)
      if (now[k] != before[k] && writable[k] == 0) return k;
  }
  for (; b < n; ++b)
    if (now[b] != before[b] && writable[b] == 0) return b;
  return n;
}

// Then, outside the lock: each storage's guards and the bytes no output may write checked
// (violations), the output and inout views rebuilt over the bytes that came back.
void check_read_back(const Problem& p, DeviceBuffers& bufs,
                     const std::vector<std::span<const std::byte>>& images, DeviceOutcome& out,
                     LaunchTimings& timings) {
  for (size_t storage = 0; storage < bufs.all().size(); ++storage) {
    const DeviceStorage& s = bufs.all()[storage];
    const std::span<const std::byte> back = images[storage];
    const auto checks_start = std::chrono::steady_clock::now();
    struct GuardClock {  // every exit of this iteration
      LaunchTimings& t;
      std::chrono::steady_clock::time_point since;
      ~GuardClock() { t.guards_ms += ms_between(since, std::chrono::steady_clock::now()); }
    } guard_clock{timings, checks_start};
    const size_t G = DeviceRunner::kGuardBytes;
    std::string who;
    for (const auto& n : s.arg_names) who += (who.empty() ? "'" : ", '") + n + "'";
    for (size_t i = 0; i < G; ++i) {
      if (back[i] != guard_byte(i)) {
        out.violations.push_back("guard before buffer of " + who + " overwritten at byte -" +
                                 std::to_string(G - i));
        break;
      }
    }
    for (size_t i = 0; G + s.bytes + i < back.size(); ++i) {
      if (back[G + s.bytes + i] != guard_byte(i + 1)) {
        out.violations.push_back("guard after buffer of " + who + " overwritten at byte +" +
                                 std::to_string(i));
        break;
      }
    }
    const std::byte* now = back.data() + G;
    const std::byte* before = s.host->bytes.data();
    bool has_outputs = false;
    for (const auto& a : p.args)
      has_outputs = has_outputs || (a.tensor.storage() == s.host && a.role != Role::input);
    // Most storages come back unchanged (every input), most of an output's bytes changed: the
    // writable mask is built only when a byte changed, and the bytes are compared a word at a
    // time against it (the loop below), not byte by byte.
    const size_t first_change = first_difference(now, before, s.bytes);
    if (first_change < s.bytes) {
      // 0xFF where the kernel may write: the elements of the output and inout views here.
      std::vector<uint8_t> writable;
      if (has_outputs) writable = writable_bytes(p, s);
      const size_t b = first_unwritable_change(now, before, writable, first_change, s.bytes);
      if (b < s.bytes) {
        // Name the argument whose element this byte belongs to, if any.
        std::string owner = "outside every argument's view";
        for (const auto& a : p.args) {
          if (a.tensor.storage() != s.host) continue;
          const auto [lo, hi] = a.tensor.extent();
          const auto es = static_cast<int64_t>(a.tensor.element_size());
          const auto bb = static_cast<int64_t>(b + s.host->window_begin);
          if (bb >= lo * es && bb < hi * es) {
            owner = (a.role == Role::input ? "input '" : "gap inside view of '") + a.name + "'";
            break;
          }
        }
        out.violations.push_back("byte " + std::to_string(b + s.host->window_begin) +
                                 " of buffer " + who + " changed (" + owner +
                                 "): the kernel must not write there");
      }
    }
    // The outputs are views over a copy of what came back (the read-back space is reused); a
    // storage of inputs only needs none.
    if (!has_outputs) continue;
    auto restored = std::make_shared<Storage>();
    restored->bytes.assign(now, now + s.bytes);
    restored->window_begin = s.host->window_begin;  // a sparse storage: its window came back
    restored->extent = s.host->extent;
    for (const auto& a : p.args) {
      if (a.tensor.storage() != s.host || a.role == Role::input) continue;
      out.outputs[a.name] = a.tensor.held_rows().rebased(restored);
    }
  }
}
}  // namespace

DeviceOutcome DeviceRunner::run_unguarded(const Problem& p, const LaunchConditions& when) const {
  const auto& api = lib_.api();
  DeviceOutcome out;
  // Declared before the buffers: their release (in ~DeviceBuffers) counts as download time.
  struct DownloadClock {
    // A constructor, not an aggregate: clang 14 (the fuzz preset) has no parenthesized
    // aggregate initialization for optional::emplace.
    explicit DownloadClock(LaunchTimings& timings) : t(timings) {}
    DownloadClock(const DownloadClock&) = delete;
    DownloadClock& operator=(const DownloadClock&) = delete;
    ~DownloadClock() { t.download_ms += ms_between(since, std::chrono::steady_clock::now()); }
    LaunchTimings& t;
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  };
  std::optional<DownloadClock> release_clock;
  const auto upload_start = std::chrono::steady_clock::now();
  DeviceBuffers bufs(lib_, *blocks_, *pinned_);
  bufs.plan(p);
  const std::string params = p.kernel_params.dump();
  const std::string kernel = p.kernel;
  char msg[kMsg] = {0};
  std::vector<std::span<const std::byte>> images;
  {
    LaunchSection section(lib_, &timings_.locked_ms);
    bufs.send();
    Marshalled m = marshal(p, bufs, arch_.rfind("gfx", 0) == 0);
    prepare_launch(when);
    if (!send_case_context(lib_, p, msg)) {
      out.status = ATTNCHECK_HOST_ERROR;
      out.message =
          std::string("the library did not take the case context: ") + abi_text(msg, kMsg);
      return out;
    }
    const SmemPoisonFor poison(when.smem_poison);
    // Every locked step counts in a device phase (upload until the call, download after it), so
    // that the lock's hold (`locked_ms`) stays within the device phases.
    timings_.upload_ms += ms_between(upload_start, std::chrono::steady_clock::now());
    const auto t0 = std::chrono::steady_clock::now();
    out.status = api.run(kernel.c_str(), params.c_str(), m.args.data(),
                         static_cast<int>(m.args.size()), msg, kMsg);
    out.wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    timings_.launch_ms += out.wall_ms;
    ++timings_.launches;
    out.message = abi_text(msg, kMsg);
    if (out.status == ATTNCHECK_ERROR) section.failed();
    if (out.status != ATTNCHECK_OK && out.status != ATTNCHECK_REFUSED &&
        out.status != ATTNCHECK_UNSUPPORTED)
      return out;
    images = read_back_all(bufs, timings_);
    give_back_timed(
        bufs, [] {}, timings_);
  }
  check_read_back(p, bufs, images, out, timings_);
  settle_launch(lib_, p, out);  // the entry's partial contract (run/partial.h)
  release_clock.emplace(timings_);
  return out;
}

bool DeviceRunner::can_capture_graphs() const {
  const auto* ext = lib_.extension();
  return ATTNCHECK_EXT_HAS(ext, graph_capture) && ATTNCHECK_EXT_HAS(ext, graph_replay) &&
         ATTNCHECK_EXT_HAS(ext, graph_release);
}

DeviceOutcome DeviceRunner::replay(const Problem& captured, const Problem& replayed) const {
  DeviceOutcome out;
  if (!can_capture_graphs()) {
    out.status = ATTNCHECK_UNSUPPORTED;
    out.message = "the kernel library " + lib_.library() + " offers no graph capture";
    return out;
  }
  try {
    const auto* ext = lib_.extension();
    const auto upload_start = std::chrono::steady_clock::now();
    DeviceBuffers bufs(lib_, *blocks_, *pinned_);
    bufs.plan(captured);
    LaunchSection section(lib_, &timings_.locked_ms);
    bufs.send();
    Marshalled m = marshal(captured, bufs, arch_.rfind("gfx", 0) == 0);
    const std::string params = captured.kernel_params.dump();
    char msg[kMsg] = {0};
    if (!send_case_context(lib_, captured, msg)) {
      out.status = ATTNCHECK_HOST_ERROR;
      out.message =
          std::string("the library did not take the case context: ") + abi_text(msg, kMsg);
      return out;
    }
    void* graph = nullptr;
    timings_.upload_ms += ms_between(upload_start, std::chrono::steady_clock::now());
    const auto t0 = std::chrono::steady_clock::now();
    out.status = ext->graph_capture(captured.kernel.c_str(), params.c_str(), m.args.data(),
                                    static_cast<int>(m.args.size()), &graph, msg, kMsg);
    std::unique_ptr<void, void (*)(void*)> owned(graph, ext->graph_release);
    if (out.status == ATTNCHECK_ERROR) section.failed();
    if (out.status != ATTNCHECK_OK) {
      // Unsupported: the library's reason as it stands (the step is skipped with it).
      out.message =
          (out.status == ATTNCHECK_UNSUPPORTED ? "" : "graph capture: ") + abi_text(msg, kMsg);
      return out;
    }
    bufs.replace_contents(captured, replayed);
    out.status = ext->graph_replay(graph, msg, kMsg);
    out.wall_ms = ms_between(t0, std::chrono::steady_clock::now());
    timings_.launch_ms += out.wall_ms;
    timings_.launches += 2;
    if (out.status == ATTNCHECK_ERROR) section.failed();
    if (out.status != ATTNCHECK_OK) {
      out.message = std::string("graph replay: ") + abi_text(msg, kMsg);
      return out;
    }
    const auto images = read_back_all(bufs, timings_);
    // graph_release is a library call too: under the lock.
    give_back_timed(
        bufs, [&owned] { owned.reset(); }, timings_);
    section.release();
    check_read_back(replayed, bufs, images, out, timings_);
    settle_launch(lib_, replayed, out);
  } catch (const std::exception& e) {
    out.status = ATTNCHECK_ERROR;
    out.message = std::string("device I/O failed: ") + e.what();
  }
  return out;
}

double DeviceRunner::time(const Problem& p, int warmup, int iters, std::string* err) const {
  const auto& api = lib_.api();
  DeviceBuffers bufs(lib_, *blocks_, *pinned_);
  bufs.plan(p);
  LaunchSection section(lib_);
  bufs.send();
  Marshalled m = marshal(p, bufs, arch_.rfind("gfx", 0) == 0);
  const std::string params = p.kernel_params.dump();
  char msg[kMsg] = {0};
  double ms = -1;
  if (!send_case_context(lib_, p, msg)) {
    if (err)
      *err = std::string("the library did not take the case context: ") + abi_text(msg, kMsg);
    return -1;
  }
  if (api.time(p.kernel.c_str(), params.c_str(), m.args.data(), static_cast<int>(m.args.size()),
               warmup, iters, &ms, msg, kMsg) != ATTNCHECK_OK) {
    if (err) *err = abi_text(msg, kMsg);
    return -1;
  }
  return ms;
}

}  // namespace attncheck
