// Crash and hang isolation: cases run in worker processes (`attncheck worker`, started by fork +
// exec of /proc/self/exe, so nothing of the parent's state — and never an initialized GPU
// runtime — is inherited). Each worker leads its own session and process group and is a child
// subreaper, and the parent is one too, so a timeout, a memory overrun or the end of the run kills
// it together with every process its kernels or adapters started, whatever group or session they
// moved to (setsid, double forks): the worker's tree is stopped and killed, and what outlived a
// worker, reparented to the parent, is killed and reaped there.
//
// Protocol (docs/verification.md "Worker isolation"): the parent writes one request per line,
// {"seq": n, "id": "<case id>", "case": <Case JSON>}, and reads one answer per line,
// {"seq": n, "id": "<case id>", "result": <Result JSON>, "retire": bool}, or, from a worker that
// runs several cases at once, {"seq", "id", "requeue": why, "isolate": bool, "blameless": bool}
// (blameless: it says nothing of the case: never started, or its launch failed only after another
// case's device error); before any request
// the worker says {"hello": {...}} once, or {"fatal": "..."} when it cannot start. The channel
// reaches the worker on its stdin/stdout, and the worker moves it at once to private close-on-exec
// descriptors that a forked child loses too (WorkerChannel): what adapters print, on stdout or
// stderr, goes to the worker log. An answer whose seq or id is not the request's, or any line the
// parent did not ask for, is rejected: the case fails naming the line and the worker is killed.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attncheck {

struct WorkerSpec {
  std::string exe = "/proc/self/exe";
  std::vector<std::string> args;  // after argv[0], e.g. {"worker", "--kernels", "x.so"}
  int jobs = 1;                   // workers running at once
  double case_timeout_s = 120;    // per case, from the moment its request is sent
  // From exec to the hello line. The worker enforces its own, shorter import limit and names
  // what hung (worker.h); this is the backstop for a worker that cannot even say that.
  double start_timeout_s = 180;
  std::string log_path;  // workers' stdout and stderr are appended here ("" = discarded)
  // A program the workers run under, with its arguments, e.g. {"/usr/local/cuda/bin/
  // compute-sanitizer", "--tool", "memcheck", ...}: the worker is exec'd as wrapper + exe + args.
  // "{worker}" in a wrapper argument becomes the worker's serial number (0, 1, ... per spawn).
  std::vector<std::string> wrapper;
  // Each worker runs one case and exits; its result is delivered only after it has exited,
  // through PoolCallbacks::on_worker_exit first (a wrapper's report is complete only then).
  bool one_case_per_worker = false;
  // Resident memory (bytes) one worker's process group may hold, the worker and every process it
  // started together; 0 = no limit. Measured from /proc every 250 ms: over it, the group is
  // killed and the case fails naming the limit (why RSS and not an rlimit: docs/verification.md).
  uint64_t memory_limit = 0;
  std::string memory_limit_flag = "--worker-memory";  // named in that message
  // Environment settings per worker slot (slot k gets slot_env[k % size], on top of the parent's
  // environment), e.g. {"CUDA_VISIBLE_DEVICES=1", "OMP_NUM_THREADS=2"}: one pool per GPU is the
  // slots of that GPU. Empty: the parent's environment as it is.
  std::vector<std::vector<std::string>> slot_env;
  // Cases each worker may run at once: it says in its hello how many it does (`threads`, at most
  // this; run/worker.h). A worker that runs fewer than asked leaves room for more workers: the
  // pool spawns further slots (their environments continue slot_env's cycle) until jobs x
  // threads cases can run at once. A worker lost with several cases in flight (a crash, a hang,
  // a memory overrun, a rejected line) pins nothing on any of them: each runs again alone, where
  // what happens is its own, in a solo worker (one of up to `jobs` further processes, started
  // when such a case waits, that run those cases one at a time beside the pool's workers).
  int threads = 1;
  // Requests a worker running several cases at once is sent beyond its threads: they wait in its
  // queue, where a thread takes the oldest for its own library first (run/worker.h, several
  // libraries). The case timeout counts from the request, queueing included.
  int queued_per_worker = 0;
};

// One case for a worker: its id (checked against the answer), the request's "case" payload, and
// further request members (an object; e.g. "kernels", run/worker.h).
struct PoolTask {
  std::string id;
  nlohmann::json payload;
  nlohmann::json request = nlohmann::json::object();
};

struct PoolCallbacks {
  // A worker's first line: {"hello": {...}} (device, arch, library, ...).
  std::function<void(const nlohmann::json& hello)> on_hello;
  // The result of task `index` (the "result" member of the worker's answer), whose id is the
  // task's: checked before this is called.
  std::function<void(size_t index, const nlohmann::json& result)> on_result;
  // Milliseconds from the request of task `index` being written to its answer being read (the
  // worker's time on the case plus the pipes and queueing), and the slot of the worker that ran
  // it (WorkerSpec::slot_env); called just before on_result.
  std::function<void(size_t index, size_t slot, double round_trip_ms)> on_round_trip;
  // A worker said its hello: its slot (WorkerSpec::slot_env) and the seconds from its spawn to
  // the hello (its GPU context and library load; a worker replacing one that retired costs
  // its slot that long).
  std::function<void(size_t slot, double start_s)> on_worker_started;
  // Task `index` produced no acceptable result: `what` says why (signal, exit status, timeout,
  // memory, a rejected line) and ends with the worker's last output lines.
  std::function<void(size_t index, const std::string& what)> on_lost;
  // one_case_per_worker: the worker with this serial ran task `index` and has exited; the
  // callback may amend its result before on_result receives it.
  std::function<void(int serial, size_t index, nlohmann::json& result)> on_worker_exit;
  // Whether task `index`, not started yet, is not to be started any more (e.g. after N failures
  // of the run, or of its library): asked for every waiting task once a result or a lost case has
  // come in since the last time; such a task goes to on_not_run (both needed, or neither). The
  // tasks running finish.
  std::function<bool(size_t index)> stop_dispatching;
  std::function<void(size_t index)> on_not_run;
  // Called once, after the workers were started and before any task is sent; may block. What
  // decides which tasks run (the golden files' checks) thus overlaps the workers' start (a GPU
  // context, a library load). The tasks it returns are not run: each goes to on_not_run.
  std::function<std::vector<size_t>()> before_dispatch;
};

// Runs every task, each exactly once (pool.cpp's WorkerPool; what becomes of the cases a worker
// did not answer is stated above its lose and requeue). Throws std::runtime_error when workers
// cannot start: a {"fatal"} line (its message), a start that exceeds start_timeout_s, or three
// workers in a row that die before their hello (the message carries their output).
void run_in_workers(const WorkerSpec& spec, const std::vector<PoolTask>& tasks,
                    const PoolCallbacks& cb);

// The worker's end of the protocol. claim() moves the channel off stdin/stdout to private
// close-on-exec descriptors (so no program an adapter execs inherits them), points stdin at
// /dev/null and stdout at stderr (prints go to the worker log), and registers a fork handler
// that closes the channel in any child forked from this process: only this process can answer.
class WorkerChannel {
 public:
  static WorkerChannel& claim();
  // The next request line (without the newline); false at end of input, or in a forked child.
  bool read_line(std::string& line);
  // Writes one line (a newline is added); nothing in a forked child.
  void write_line(const std::string& line);
  // True in a process forked from the worker (an adapter's fork that returned into the harness).
  bool forked_copy() const;

 private:
  WorkerChannel() = default;
  std::string buf_;
};

// Processes (not zombies) of process group `pgid`, except `exclude`.
std::vector<pid_t> live_group_members(pid_t pgid, pid_t exclude);
// Processes (not zombies) below `root` (by parent pid) in a session other than root's: started
// by it and detached with setsid (a worker is a child subreaper, so even one whose parent exited
// stays below it); and, in the same scan of /proc, the members of process group `pgid` (0: none)
// other than `root` and `exclude`.
std::vector<pid_t> detached_descendants(pid_t root, pid_t pgid = 0, pid_t exclude = 0);

// What run_self saw of the process it ran.
struct SelfRun {
  std::string out, err;    // its stdout, and the last 4 KiB of its stderr
  int status = 0;          // its wait status
  bool timed_out = false;  // killed at the limit, with everything it started
};
// Runs this executable with `args` (after argv[0]) in a session of its own, as a worker is run
// (its stdin /dev/null), and waits for its end, at most `timeout_s` seconds: past it, the process
// and every process it started are killed. Throws std::runtime_error when it cannot start.
SelfRun run_self(const std::vector<std::string>& args, double timeout_s);

// "SIGSEGV (segmentation fault)" for a wait status, or "exit status 3".
std::string describe_wait_status(int status);

// "4 GiB" / "512 MiB" for a byte count.
std::string describe_bytes(uint64_t bytes);

}  // namespace attncheck
