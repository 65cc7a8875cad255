// Crash and hang isolation: cases run in worker processes (`attncheck worker`, started by fork +
// exec of /proc/self/exe, so nothing of the parent's state — and never an initialized GPU
// runtime — is inherited). The parent writes one case id per line to a worker's stdin and reads one
// JSON result per line from its stdout. A worker that dies (segfault, abort, GPU fault) or exceeds
// the per-case time limit is killed if need be, the case is reported with what happened and the
// worker's last stderr lines, and a fresh worker takes the next case.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attncheck {

struct WorkerSpec {
  std::string exe = "/proc/self/exe";
  std::vector<std::string> args;  // after argv[0], e.g. {"worker", "--cases", "cases"}
  int jobs = 1;                   // workers running at once
  double case_timeout_s = 120;    // per case, from the moment its id is sent
  double start_timeout_s = 120;   // from exec to the worker's hello line
  std::string log_path;           // workers' stderr is appended here ("" = discarded)
  // A program the workers run under, with its arguments, e.g. {"/usr/local/cuda/bin/
  // compute-sanitizer", "--tool", "memcheck", ...}: the worker is exec'd as wrapper + exe + args.
  // "{worker}" in a wrapper argument becomes the worker's serial number (0, 1, ... per spawn).
  std::vector<std::string> wrapper;
  // Each worker runs one case and exits; its result is delivered only after it has exited,
  // through PoolCallbacks::on_worker_exit first (a wrapper's report is complete only then).
  bool one_case_per_worker = false;
};

struct PoolCallbacks {
  // A worker's first line: {"hello": {...}} (device, arch, library, ...).
  std::function<void(const nlohmann::json& hello)> on_hello;
  // The result of case `index` (the "result" member of the worker's line).
  std::function<void(size_t index, const nlohmann::json& result)> on_result;
  // Case `index` produced no result: `what` says why (signal, exit status, timeout) and ends with
  // the worker's last stderr lines.
  std::function<void(size_t index, const std::string& what)> on_lost;
  // one_case_per_worker: the worker with this serial ran case `index` and has exited; the
  // callback may amend its result before on_result receives it.
  std::function<void(int serial, size_t index, nlohmann::json& result)> on_worker_exit;
};

// Runs every id. Throws std::runtime_error when workers cannot start (exec failure, a worker that
// exits before its hello three times in a row: the message carries its stderr).
void run_in_workers(const WorkerSpec& spec, const std::vector<std::string>& ids,
                    const PoolCallbacks& cb);

// The worker side of the protocol: keeps the protocol stream on a private descriptor and points
// fd 1 at stderr, so stray prints (kernel printf, runtime logs) cannot corrupt it. Returns a FILE*
// for protocol lines.
FILE* claim_protocol_stdout();

// "SIGSEGV (segmentation fault)" for a wait status, or "exit status 3".
std::string describe_wait_status(int status);

}  // namespace attncheck
