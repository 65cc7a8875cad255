#include "run/scheduling.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace attncheck {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// nvidia-smi's GPUs: index -> memory in bytes ("" when nvidia-smi is absent or fails).
std::map<std::string, uint64_t> nvidia_gpus() {
  std::map<std::string, uint64_t> out;
  FILE* p = ::popen(
      "nvidia-smi --query-gpu=index,uuid,memory.total --format=csv,noheader,nounits 2>/dev/null",
      "r");
  if (!p) return out;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    const auto fields = split_commas(line);
    if (fields.size() < 3) continue;
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t"));
      s.erase(s.find_last_not_of(" \t\r\n") + 1);
      return s;
    };
    const std::string index = trim(fields[0]), uuid = trim(fields[1]);
    const uint64_t mib = std::strtoull(trim(fields[2]).c_str(), nullptr, 10);
    if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) continue;
    out[index] = mib << 20;
    out[uuid] = mib << 20;
  }
  ::pclose(p);
  return out;
}

// AMD GPUs in KFD's topology, in enumeration order (what HIP_VISIBLE_DEVICES indexes): memory.
std::vector<uint64_t> amd_gpus() {
  std::vector<std::pair<int, uint64_t>> nodes;
  const fs::path topology = "/sys/class/kfd/kfd/topology/nodes";
  std::error_code ec;
  for (const auto& node : fs::directory_iterator(topology, ec)) {
    auto value = [](const fs::path& file, const std::string& key) -> uint64_t {
      std::ifstream in(file);
      std::string k;
      uint64_t v = 0;
      while (in >> k >> v)
        if (k == key) return v;
      return 0;
    };
    if (value(node.path() / "properties", "simd_count") == 0) continue;  // a CPU node
    const uint64_t memory = value(node.path() / "mem_banks" / "0" / "properties", "size_in_bytes");
    nodes.emplace_back(std::atoi(node.path().filename().c_str()), memory);
  }
  std::sort(nodes.begin(), nodes.end());
  std::vector<uint64_t> out;
  for (const auto& n : nodes) out.push_back(n.second);
  return out;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::vector<VisibleGpu> visible_gpus(std::string* variable) {
  std::vector<VisibleGpu> gpus;
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}) {
    const char* value = std::getenv(var);
    if (!value) continue;
    if (variable) *variable = var;
    const bool nvidia = std::string(var) == "CUDA_VISIBLE_DEVICES";
    const auto memory = nvidia ? nvidia_gpus() : std::map<std::string, uint64_t>{};
    const auto amd = nvidia ? std::vector<uint64_t>{} : amd_gpus();
    for (const auto& id : split_commas(value)) {
      if (id == "-1" || id == "none") return {};  // a runtime stops at the first invalid id
      VisibleGpu g{id, 0};
      if (const auto it = memory.find(id); it != memory.end()) g.memory_bytes = it->second;
      const auto index = static_cast<size_t>(std::strtoul(id.c_str(), nullptr, 10));
      if (!nvidia && index < amd.size()) g.memory_bytes = amd[index];
      gpus.push_back(g);
    }
    return gpus;
  }
  const auto nvidia = nvidia_gpus();
  for (const auto& [id, bytes] : nvidia)
    if (id.find_first_not_of("0123456789") == std::string::npos) gpus.push_back({id, bytes});
  std::sort(gpus.begin(), gpus.end(), [](const VisibleGpu& a, const VisibleGpu& b) {
    return std::stoi(a.id) < std::stoi(b.id);
  });
  if (!gpus.empty()) {
    if (variable) *variable = "CUDA_VISIBLE_DEVICES";
    return gpus;
  }
  const auto amd = amd_gpus();
  for (size_t i = 0; i < amd.size(); ++i) gpus.push_back({std::to_string(i), amd[i]});
  if (!gpus.empty() && variable) *variable = "HIP_VISIBLE_DEVICES";
  return gpus;
}

std::string gpu_variable() {
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})
    if (std::getenv(var)) return var;
  std::error_code ec;
  if (fs::exists("/dev/nvidiactl", ec)) return "CUDA_VISIBLE_DEVICES";
  return amd_gpus().empty() ? "CUDA_VISIBLE_DEVICES" : "HIP_VISIBLE_DEVICES";
}

void use_ctest_gpu() {
  const char* spec = std::getenv("CTEST_RESOURCE_GROUP_0_GPUS");
  if (!spec) return;
  const std::string s = spec;
  const auto id = s.find("id:");
  if (id == std::string::npos) return;
  const std::string gpu = s.substr(id + 3, s.find(',', id) - id - 3);
  ::setenv("HIP_VISIBLE_DEVICES", gpu.c_str(), 1);
  ::setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1);
}

int cases_fitting(uint64_t memory_bytes, int threads) {
  threads = std::max(threads, 1);
  const uint64_t per_process =
      kGpuMemoryPerWorker + static_cast<uint64_t>(threads - 1) * kGpuMemoryPerThread;
  const uint64_t processes = memory_bytes / per_process;
  if (processes == 0)
    return static_cast<int>(std::max<uint64_t>(1, memory_bytes / kGpuMemoryPerWorker));
  return static_cast<int>(std::min<uint64_t>(processes * static_cast<uint64_t>(threads), 1 << 20));
}

PoolPlan plan_pools(const std::vector<VisibleGpu>& gpus, int cores, int jobs, int jobs_per_gpu,
                    int threads) {
  PoolPlan plan;
  cores = std::max(cores, 1);
  const int asked = threads > 0 ? threads : gpus.empty() ? 1 : kThreadsPerWorker;
  if (gpus.empty()) {
    plan.jobs = jobs > 0 ? jobs : cores;
    plan.why = jobs > 0 ? "--jobs" : "no GPU: one worker per core";
  } else {
    const int n = static_cast<int>(gpus.size());
    for (int i = 0; i < n; ++i) {
      GpuPool pool{gpus[static_cast<size_t>(i)], 0};
      if (jobs > 0) {
        pool.jobs = jobs / n + (i < jobs % n ? 1 : 0);
      } else if (jobs_per_gpu > 0) {
        pool.jobs = jobs_per_gpu;
      } else {
        pool.jobs = std::max(1, cores / n);
        if (pool.gpu.memory_bytes > 0)
          pool.jobs =
              std::min(pool.jobs, cases_fitting(pool.gpu.memory_bytes, std::min(asked, pool.jobs)));
      }
      if (pool.jobs > 0) plan.pools.push_back(pool);
    }
    plan.jobs = 0;
    for (const auto& p : plan.pools) plan.jobs += p.jobs;
    plan.why = jobs > 0 ? "--jobs spread over the GPUs"
               : jobs_per_gpu > 0
                   ? "--jobs-per-gpu"
                   : "per GPU: the cores shared by the GPUs, within its memory (" +
                         std::to_string(kGpuMemoryPerWorker >> 30) + " GiB per worker process, " +
                         std::to_string(kGpuMemoryPerThread >> 20) + " MiB per further thread)";
  }
  plan.cpu_threads = std::max(1, cores / std::max(plan.jobs, 1));
  int widest = 1;  // the largest pool's cases at once
  for (const auto& p : plan.pools) widest = std::max(widest, p.jobs);
  if (plan.pools.empty()) widest = plan.jobs;
  const int per_pool = (widest + asked - 1) / asked;  // processes of the largest pool
  plan.threads = std::max(1, (widest + per_pool - 1) / per_pool);
  return plan;
}

int PoolPlan::processes() const {
  auto of = [&](int cases) { return (cases + threads - 1) / std::max(threads, 1); };
  if (pools.empty()) return of(jobs);
  int n = 0;
  for (const auto& p : pools) n += of(p.jobs);
  return n;
}

uint64_t sparse_block_cache_share(uint64_t memory_bytes, int processes) {
  if (memory_bytes == 0) return processes > 1 ? 0 : kSparseBlockCacheMax;
  return std::min(kSparseBlockCacheMax, memory_bytes / 4 / static_cast<uint64_t>(processes));
}

std::vector<std::vector<std::string>> PoolPlan::slot_env() const {
  std::vector<std::vector<std::string>> out;
  const std::string omp = "OMP_NUM_THREADS=" + std::to_string(cpu_threads);
  if (pools.empty()) {
    out.push_back({omp});
    return out;
  }
  std::vector<int> left;  // processes per pool
  for (const auto& p : pools) left.push_back((p.jobs + threads - 1) / std::max(threads, 1));
  std::vector<std::string> sparse_cache;
  for (size_t i = 0; i < pools.size(); ++i)
    sparse_cache.push_back(
        "ATTNCHECK_SPARSE_BLOCK_CACHE_BYTES=" +
        std::to_string(sparse_block_cache_share(pools[i].gpu.memory_bytes, std::max(left[i], 1))));
  for (bool any = true; any;) {
    any = false;
    for (size_t i = 0; i < pools.size(); ++i) {
      if (left[i] == 0) continue;
      --left[i];
      any = true;
      out.push_back({variable + "=" + pools[i].gpu.id, omp, sparse_cache[i]});
    }
  }
  return out;
}

CaseDurations CaseDurations::from_map(std::map<std::string, double> ms) {
  CaseDurations d;
  d.ms_ = std::move(ms);
  std::map<std::string, std::vector<double>> per_op;
  std::vector<double> all;
  for (const auto& [id, v] : d.ms_) {
    per_op[id.substr(0, id.find('/'))].push_back(v);
    all.push_back(v);
  }
  for (auto& [op, v] : per_op) d.op_median_[op] = median_of(v);
  if (!all.empty()) d.median_ = median_of(all);
  return d;
}

CaseDurations CaseDurations::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot be opened");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("cases") || !j["cases"].is_object())
    throw std::runtime_error(path + ": expected an object with \"cases\": {id: milliseconds}");
  std::map<std::string, double> ms;
  for (const auto& [id, v] : j["cases"].items()) {
    if (!v.is_number() || !(v.get<double>() >= 0))
      throw std::runtime_error(path + ": cases.\"" + id + "\": expected milliseconds >= 0, got " +
                               v.dump());
    ms[id] = v.get<double>();
  }
  return from_map(std::move(ms));
}

double CaseDurations::estimate_ms(const std::string& id) const {
  if (const auto it = ms_.find(id); it != ms_.end()) return it->second;
  if (const auto it = op_median_.find(id.substr(0, id.find('/'))); it != op_median_.end())
    return it->second;
  return median_;
}

std::vector<size_t> longest_first(const std::vector<std::string>& ids,
                                  const CaseDurations& durations) {
  std::vector<double> est;
  for (const auto& id : ids) est.push_back(durations.estimate_ms(id));
  std::vector<size_t> order(ids.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return est[a] > est[b]; });
  return order;
}

std::vector<int> balanced_shards(const std::vector<std::string>& ids, int count,
                                 const CaseDurations& durations) {
  std::vector<int> shard(ids.size(), 0);
  if (count <= 1) return shard;
  std::vector<double> load(static_cast<size_t>(count), 0);
  for (size_t i : longest_first(ids, durations)) {
    const auto lightest =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    shard[i] = static_cast<int>(lightest);
    load[lightest] += durations.estimate_ms(ids[i]);
  }
  return shard;
}

std::vector<std::pair<size_t, size_t>> interleave_in_lanes(
    const std::vector<std::vector<size_t>>& cases_per_library, size_t lanes) {
  constexpr size_t kNone = static_cast<size_t>(-1);
  size_t next = 0;
  auto next_library = [&] {
    while (next < cases_per_library.size())
      if (!cases_per_library[next++].empty()) return next - 1;
    return kNone;
  };
  std::vector<size_t> lane(std::max<size_t>(lanes, 1), kNone);
  for (auto& l : lane) l = next_library();
  std::vector<size_t> given(cases_per_library.size(), 0);
  std::vector<std::pair<size_t, size_t>> order;
  for (bool any = true; any;) {
    any = false;
    for (auto& l : lane) {
      if (l == kNone) continue;
      any = true;
      order.emplace_back(l, cases_per_library[l][given[l]++]);
      if (given[l] == cases_per_library[l].size()) l = next_library();
    }
  }
  return order;
}

}  // namespace attncheck
