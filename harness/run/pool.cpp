#include "pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

namespace attncheck {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kTailBytes = 4096;
// Each check reads /proc/<pid>/stat of every process (a few ms on a busy host).
constexpr auto kMemoryCheckEvery = std::chrono::milliseconds(250);

// A request written to a worker and not answered yet.
struct InFlight {
  size_t task = 0;
  uint64_t seq = 0;
  std::string sent_id;  // its id as the request carried it (invalid UTF-8 replaced)
  Clock::time_point sent_at, deadline;
};

struct Worker {
  pid_t pid = -1;  // also its process group
  int in = -1, out = -1, err = -1;
  std::string out_buf, err_tail;
  bool ready = false;
  bool out_eof = false;
  bool retiring = false;  // said it exits after its last answer: gets no further case
  std::vector<InFlight> flight;
  int capacity = 1;            // cases at once, as its hello said (WorkerSpec::threads)
  bool isolating = false;      // runs a case alone: nothing else is sent until it is answered
  Clock::time_point deadline;  // of its start, or of its exit once retiring with nothing in flight
  Clock::time_point spawned_at;  // its fork (on_worker_started: the start's length)
  size_t slot = 0;               // its place in the pool (WorkerSpec::slot_env)
  bool solo = false;             // runs only cases that must run alone (kSoloSlots)
  int serial = -1;               // spawn number ("{worker}" in the wrapper's arguments)
  long pending = -1;             // one_case_per_worker: task whose result waits for the exit
  nlohmann::json pending_result;
};

// Slots from here on hold solo workers: each runs the cases that must run alone, one at a time,
// beside the pool's workers, so that a case run alone does not leave the other threads of a
// pool's worker idle while it runs. Their environments continue slot_env's cycle (slot % size).
constexpr size_t kSoloSlots = size_t{1} << 20;

// A slot whose worker is gone: the next one spawned there gets the slot's environment.
Worker vacant(size_t slot) {
  Worker w;
  w.slot = slot;
  w.solo = slot >= kSoloSlots;
  return w;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

std::chrono::milliseconds ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
}

// The environment of a worker in `slot`: the parent's, with the slot's settings replacing the
// variables they name.
std::vector<std::string> slot_environment(const WorkerSpec& spec, size_t slot) {
  std::vector<std::string> env;
  if (spec.slot_env.empty()) return env;
  const auto& settings = spec.slot_env[slot % spec.slot_env.size()];
  auto name_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    if (std::none_of(settings.begin(), settings.end(),
                     [&](const std::string& s) { return name_of(s) == name_of(kv); }))
      env.push_back(kv);
  }
  env.insert(env.end(), settings.begin(), settings.end());
  return env;
}

struct ProcStat {
  pid_t pid = 0, ppid = 0, pgrp = 0, session = 0;
  char state = '?';
  uint64_t rss_pages = 0;
};

template <class F>
void for_each_process(F&& f) {
  DIR* d = ::opendir("/proc");
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[300], buf[1024];
    std::snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) continue;
    buf[n] = '\0';
    // Parsed in place: every case's leftover check scans all of /proc (a stream per file made
    // the scan a few ms per case on a busy host).
    const char* close = std::strrchr(buf, ')');  // the command name may hold anything, ')' too
    if (!close) continue;
    // Fields after the name: 3 state, 4 ppid, 5 pgrp, 6 session, ... 24 rss (pages).
    const char* at = close + 1;
    auto next_field = [&at]() -> const char* {
      while (*at == ' ') ++at;
      if (!*at) return nullptr;
      const char* field = at;
      while (*at && *at != ' ') ++at;
      return field;
    };
    ProcStat s;
    s.pid = static_cast<pid_t>(std::atol(e->d_name));
    const char* state = next_field();
    if (!state) continue;
    s.state = *state;
    bool complete = true;
    for (int field = 4; field <= 24 && complete; ++field) {
      const char* v = next_field();
      complete = v != nullptr;
      if (!complete) break;
      if (field == 4) s.ppid = static_cast<pid_t>(std::strtol(v, nullptr, 10));
      if (field == 5) s.pgrp = static_cast<pid_t>(std::strtol(v, nullptr, 10));
      if (field == 6) s.session = static_cast<pid_t>(std::strtol(v, nullptr, 10));
      if (field == 24) s.rss_pages = std::strtoull(v, nullptr, 10);
    }
    if (complete) f(s);
  }
  ::closedir(d);
}

// The processes of this pool's workers, for ending everything a worker started (pool.h): the
// workers alive, and the sessions of every worker it spawned (each worker leads one).
// run_in_workers is not run twice at once, so one record per process is enough.
struct Family {
  std::set<pid_t> live, sessions;
};
Family& family() {
  static Family f;
  return f;
}

// Live processes below `root` (its children, theirs, ...), found by parent pid.
std::vector<pid_t> descendants_of(pid_t root) {
  std::multimap<pid_t, pid_t> children;
  for_each_process([&](const ProcStat& s) {
    if (s.state != 'Z') children.emplace(s.ppid, s.pid);
  });
  std::vector<pid_t> out, todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    const auto [b, e] = children.equal_range(p);
    for (auto it = b; it != e; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

// Ends `root`, its process group and every process below it, whatever group or session they
// moved to: all are stopped first, scan after scan until no new one appears (a stopped process
// neither forks nor reaps, so no pid found can be reused), then killed.
void end_process_tree(pid_t root) {
  ::kill(-root, SIGSTOP);
  ::kill(root, SIGSTOP);
  std::set<pid_t> stopped;
  for (int scan = 0; scan < 64; ++scan) {
    bool found = false;
    for (pid_t p : descendants_of(root))
      if (stopped.insert(p).second) {
        ::kill(p, SIGSTOP);
        found = true;
      }
    if (!found) break;
  }
  ::kill(-root, SIGKILL);
  ::kill(root, SIGKILL);  // before its setsid, the group does not exist yet
  for (pid_t p : stopped) ::kill(p, SIGKILL);
}

// Processes a worker started that outlived it: this process is a child subreaper
// (run_in_workers), so they are its children now, in a worker's session or one of their own.
// Each is ended with what it started and reaped (not a live worker, and never another child of
// this process: those stay in its session).
void end_adopted() {
  const pid_t self = ::getpid();
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (true) {
    std::vector<pid_t> adopted;
    for_each_process([&](const ProcStat& s) {
      if (s.ppid == self && !family().live.count(s.pid) &&
          (s.session == s.pid || family().sessions.count(s.session)))
        adopted.push_back(s.pid);
    });
    if (adopted.empty() || Clock::now() > deadline) return;
    for (pid_t p : adopted) {
      end_process_tree(p);
      int status = 0;
      ::waitpid(p, &status, WNOHANG);
    }
    ::usleep(5000);
  }
}

Worker spawn(const WorkerSpec& spec, int serial, size_t slot) {
  int pin[2], pout[2], perr[2];
  if (::pipe2(pin, O_CLOEXEC) || ::pipe2(pout, O_CLOEXEC) || ::pipe2(perr, O_CLOEXEC))
    throw std::runtime_error(std::string("cannot create pipes for a worker: ") +
                             std::strerror(errno));
  // Everything the child needs is prepared before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<std::string> store(spec.wrapper.begin(), spec.wrapper.end());
  for (auto& arg : store)
    for (size_t at; (at = arg.find("{worker}")) != std::string::npos;)
      arg.replace(at, 8, std::to_string(serial));
  store.push_back(spec.exe);
  for (const auto& a : spec.args) store.push_back(a);
  const std::string program = spec.wrapper.empty() ? spec.exe : spec.wrapper.front();
  std::vector<char*> argv;
  for (auto& s : store) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_store = slot_environment(spec, slot);
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  char** const child_env = env_store.empty() ? environ : envp.data();
  const std::string exec_failed = "attncheck: cannot exec " + program + "\n";
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // Its own session and process group, killed as a whole; and killed if the run dies (kill -9
    // included). A child subreaper (kept across exec): whatever it starts stays below it, even a
    // process that detaches with setsid after a double fork, and is ended with it.
    ::setsid();
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(pin[0], 0);
    ::dup2(pout[1], 1);
    ::dup2(perr[1], 2);
    ::close_range(3, ~0u, 0);  // nothing else of the parent (result files, ...) leaks into workers
    ::execve(program.c_str(), argv.data(), child_env);
    [[maybe_unused]] auto n = ::write(2, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  // No setpgid here (it would make the child a group leader, which setsid refuses): a kill
  // before the child's setsid reaches it by its pid (end_process_tree).
  family().live.insert(pid);
  family().sessions.insert(pid);
  ::close(pin[0]);
  ::close(pout[1]);
  ::close(perr[1]);
  Worker w;
  w.pid = pid;
  w.serial = serial;
  w.slot = slot;
  w.solo = slot >= kSoloSlots;
  w.in = pin[1];
  w.out = pout[0];
  w.err = perr[0];
  ::fcntl(w.out, F_SETFL, ::fcntl(w.out, F_GETFL) | O_NONBLOCK);
  ::fcntl(w.err, F_SETFL, ::fcntl(w.err, F_GETFL) | O_NONBLOCK);
  w.spawned_at = Clock::now();
  w.deadline = w.spawned_at + ms(spec.start_timeout_s);
  return w;
}

// Reads what is available; false at end of file.
bool drain(int fd, std::string& into) {
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    return true;  // EAGAIN
  }
}

std::string last_lines(const std::string& tail) {
  if (tail.empty()) return "";
  std::string t = tail;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  // At most 12 lines.
  size_t pos = t.size();
  for (int lines = 0; lines < 12 && pos != std::string::npos && pos > 0; ++lines)
    pos = t.rfind('\n', pos - 1);
  if (pos != std::string::npos && pos > 0) t = t.substr(pos + 1);
  return "\n  worker output (last lines):\n    " + [&] {
    std::string s;
    for (char c : t) s += c == '\n' ? std::string("\n    ") : std::string(1, c);
    return s;
  }();
}

// True once the worker has exited (not yet reaped), waiting at most until `until`.
bool exited_by(pid_t pid, Clock::time_point until) {
  while (true) {
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid)
      return true;
    if (Clock::now() >= until) return false;
    ::usleep(10000);
  }
}

// Kills the worker with every process it started (its group, and below it whatever group or
// session they moved to), then reaps the worker and ends what it left (end_adopted). The group is
// killed before the reap: until then the worker's pid (the group's id) cannot be reused, so the
// signal reaches nothing else. Without kill_worker the worker is given `grace` to exit on its own
// first; false when it had to be killed. `w` keeps its pid, which the messages about its cases
// name; the caller replaces it (vacant).
bool reap(Worker& w, int& status, bool kill_worker,
          std::chrono::milliseconds grace = std::chrono::seconds(10)) {
  close_fd(w.in);
  close_fd(w.out);
  close_fd(w.err);
  const bool exited = !kill_worker && exited_by(w.pid, Clock::now() + grace);
  if (exited)
    ::kill(-w.pid, SIGKILL);  // what it left in its group; the rest is this process's now
  else
    end_process_tree(w.pid);
  while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
  }
  family().live.erase(w.pid);
  end_adopted();
  return exited;
}

std::string excerpt(const std::string& line, size_t max = 300) {
  return line.size() > max ? line.substr(0, max) + " ..." : line;
}

// Why `j` is not the answer to request `seq` for `id`; "" when it is. A requeue answer (no
// result) is one only from a worker that runs several cases at once.
std::string answer_mismatch(const nlohmann::json& j, uint64_t seq, const std::string& id,
                            bool requeue_allowed) {
  const bool requeue = requeue_allowed && j.is_object() && j.contains("requeue") &&
                       j["requeue"].is_string() && !j.contains("result");
  if (!requeue && (!j.is_object() || !j.contains("result") || !j["result"].is_object()))
    return "it is not a result";
  if (!j.contains("seq") || !j["seq"].is_number_unsigned() || j["seq"].get<uint64_t>() != seq)
    return "its seq is not " + std::to_string(seq) + " (the request's)";
  if (!j.contains("id") || !j["id"].is_string() || j["id"].get<std::string>() != id)
    return "it answers for another case";
  for (const char* flag : {"isolate", "blameless", "retire"})
    if (j.contains(flag) && !j[flag].is_boolean())
      return std::string("its \"") + flag + "\" is not true or false";
  if (!requeue && (!j["result"].contains("id") || j["result"]["id"] != id))
    return "its result is another case's";
  return "";
}

// pgid -> resident bytes of its live processes, for the groups asked.
std::map<pid_t, uint64_t> group_rss(const std::vector<pid_t>& groups) {
  std::map<pid_t, uint64_t> rss;
  for (pid_t g : groups) rss[g] = 0;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for_each_process([&](const ProcStat& s) {
    const auto it = rss.find(s.pgrp);
    if (it != rss.end() && s.state != 'Z') it->second += s.rss_pages * page;
  });
  return rss;
}

// The worker side's descriptors; -1 once closed (in a forked child).
int g_request_fd = -1, g_answer_fd = -1;
pid_t g_owner = -1;

void close_channel_in_child() {
  // After fork in the child: only async-signal-safe calls.
  if (g_request_fd >= 0) ::close(g_request_fd);
  if (g_answer_fd >= 0) ::close(g_answer_fd);
  g_request_fd = g_answer_fd = -1;
}

}  // namespace

std::vector<pid_t> live_group_members(pid_t pgid, pid_t exclude) {
  std::vector<pid_t> out;
  for_each_process([&](const ProcStat& s) {
    if (s.pgrp == pgid && s.pid != exclude && s.state != 'Z') out.push_back(s.pid);
  });
  return out;
}

std::vector<pid_t> detached_descendants(pid_t root, pid_t pgid, pid_t exclude) {
  // One scan of /proc (it runs after every case): parents, groups and sessions, then the tree.
  const pid_t session = ::getsid(root);
  std::multimap<pid_t, ProcStat> children;
  std::vector<pid_t> out;
  for_each_process([&](const ProcStat& s) {
    if (s.state == 'Z') return;
    children.emplace(s.ppid, s);
    if (pgid > 0 && s.pgrp == pgid && s.pid != root && s.pid != exclude) out.push_back(s.pid);
  });
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    const auto [b, e] = children.equal_range(p);
    for (auto it = b; it != e; ++it) {
      const ProcStat& c = it->second;
      if (c.session != session && std::find(out.begin(), out.end(), c.pid) == out.end())
        out.push_back(c.pid);
      todo.push_back(it->second.pid);
    }
  }
  return out;
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = sig == SIGSEGV   ? "SIGSEGV"
                       : sig == SIGABRT ? "SIGABRT"
                       : sig == SIGBUS  ? "SIGBUS"
                       : sig == SIGFPE  ? "SIGFPE"
                       : sig == SIGILL  ? "SIGILL"
                       : sig == SIGKILL ? "SIGKILL"
                       : sig == SIGTERM ? "SIGTERM"
                                        : nullptr;
    std::string s = name ? name : "signal " + std::to_string(sig);
    return s + " (" + ::strsignal(sig) + ")";
  }
  return "status " + std::to_string(status);
}

std::string describe_bytes(uint64_t bytes) {
  const uint64_t mib = bytes >> 20;
  if (mib >= 1024 && mib % 1024 == 0) return std::to_string(mib >> 10) + " GiB";
  return std::to_string(mib) + " MiB";
}

WorkerChannel& WorkerChannel::claim() {
  static WorkerChannel* channel = [] {
    std::fflush(stdout);
    g_request_fd = ::fcntl(0, F_DUPFD_CLOEXEC, 3);
    g_answer_fd = ::fcntl(1, F_DUPFD_CLOEXEC, 3);
    if (g_request_fd < 0 || g_answer_fd < 0)
      throw std::runtime_error("cannot move the worker protocol channel to private descriptors");
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) {
      ::dup2(null, 0);
      ::close(null);
    }
    ::dup2(2, 1);
    g_owner = ::getpid();
    ::pthread_atfork(nullptr, nullptr, close_channel_in_child);
    return new WorkerChannel();
  }();
  return *channel;
}

bool WorkerChannel::forked_copy() const {
  return ::getpid() != g_owner;
}

bool WorkerChannel::read_line(std::string& line) {
  while (true) {
    if (forked_copy() || g_request_fd < 0) return false;
    const auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return true;
    }
    char chunk[65536];
    const ssize_t n = ::read(g_request_fd, chunk, sizeof chunk);
    if (n > 0) {
      buf_.append(chunk, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

void WorkerChannel::write_line(const std::string& line) {
  if (forked_copy() || g_answer_fd < 0) return;
  const std::string s = line + "\n";
  size_t at = 0;
  while (at < s.size()) {
    const ssize_t n = ::write(g_answer_fd, s.data() + at, s.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent is gone
    at += static_cast<size_t>(n);
  }
}

SelfRun run_self(const std::vector<std::string>& args, double timeout_s) {
  ::signal(SIGPIPE, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);  // what it leaves behind is ended here (end_adopted)
  WorkerSpec spec;
  spec.args = args;
  Worker w = spawn(spec, 0, 0);
  close_fd(w.in);  // nothing to read: end of input at once
  SelfRun run;
  const auto deadline = Clock::now() + ms(timeout_s);
  while (w.out >= 0 || w.err >= 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      run.timed_out = true;
      break;
    }
    std::vector<pollfd> fds;
    for (int fd : {w.out, w.err})
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000))) <
            0 &&
        errno != EINTR)
      break;
    if (w.out >= 0 && !drain(w.out, run.out)) close_fd(w.out);
    // Said all it says and exited: a process it started may hold stderr open, not the command.
    if (w.out < 0 && exited_by(w.pid, Clock::now())) {
      if (w.err >= 0) drain(w.err, w.err_tail);
      break;
    }
    if (w.err >= 0) {
      const bool open = drain(w.err, w.err_tail);
      if (w.err_tail.size() > kTailBytes) w.err_tail.erase(0, w.err_tail.size() - kTailBytes);
      if (!open) close_fd(w.err);
    }
  }
  // Both pipes closed: it has exited, or is about to (a process it started may hold them open
  // no longer than the limit).
  const bool exited = !run.timed_out && exited_by(w.pid, deadline);
  run.timed_out = !exited;
  reap(w, run.status, !exited, std::chrono::milliseconds(0));
  run.err = w.err_tail;
  return run;
}

namespace {

// pgid -> resident bytes of its processes (WorkerSpec::memory_limit).
using GroupRss = std::map<pid_t, uint64_t>;

// Workers the pool starts with: WorkerSpec::jobs, no more than there are tasks.
int pool_jobs(const WorkerSpec& spec, size_t tasks) {
  return std::max(1, std::min<int>(spec.jobs, static_cast<int>(tasks)));
}

// One run of run_in_workers, in phases: start (a worker in a slot), dispatch (requests to idle
// capacity), poll (wait on the workers' pipes and the nearest deadline), then per worker: its
// lines (on_line: hello, result, requeue, or reject), its exit (on_exit), its memory
// (check_memory) and its deadlines. What a lost worker's cases become is decided in lose and
// requeue, beside each other below.
class WorkerPool {
 public:
  WorkerPool(const WorkerSpec& spec, const std::vector<PoolTask>& tasks, const PoolCallbacks& cb);
  void run();

 private:
  bool work_left() const { return next_ < tasks_.size() || !again_.empty() || !isolated_.empty(); }
  // Work for the pool's own workers: all of it, unless solo workers take the cases run alone.
  bool pool_work_left() const {
    return next_ < tasks_.size() || !again_.empty() || (solo_max_ == 0 && !isolated_.empty());
  }
  Worker start(size_t slot) { return spawn(spec_, spawned_++, slot); }
  void start_before_dispatch();
  void settle_stopped();
  void skip_not_started();
  void not_run(size_t idx);
  void refill_slots();
  void dispatch();
  void start_solo_workers();
  void send(Worker& w, size_t idx);
  void poll();
  GroupRss sample_memory();
  void service(Worker& w, const GroupRss& rss);
  void read_stderr(Worker& w);
  bool read_lines(Worker& w);
  bool on_line(Worker& w, const std::string& line);
  bool on_hello(Worker& w, const nlohmann::json& j, const std::string& line);
  void on_result(Worker& w, const InFlight& request, const nlohmann::json& j);
  void on_exit(Worker& w);
  bool check_memory(Worker& w, const GroupRss& rss);
  void check_deadlines(Worker& w);
  void end_worker(Worker& w, const std::string& what, bool fatal_at_start);
  void lose(Worker& w, const std::string& what, bool fatal_at_start);
  void requeue(Worker& w, size_t idx, const nlohmann::json& j);
  void reject(Worker& w, const std::string& line, const std::string& why);
  void retire(Worker& w);
  void grow(int capacity);
  void deliver_pending(Worker& w);
  void note(const std::string& text);
  void finish();

  const WorkerSpec& spec_;
  const std::vector<PoolTask>& tasks_;
  const PoolCallbacks& cb_;
  std::ofstream log_;
  const int threads_;    // cases a worker is asked to run at once
  const size_t target_;  // cases at once the pool aims at (jobs x threads)
  // Solo workers at most (kSoloSlots): as many as the pool's worker processes when these run
  // several cases at once; none when they run one (a case alone is then any worker's case).
  const size_t solo_max_;
  size_t solo_spawned_ = 0;
  std::string worker_name_;  // in the errors of a pool whose workers cannot start
  std::vector<Worker> workers_;
  size_t next_ = 0, done_ = 0;   // the next task never sent; tasks ended (any outcome)
  std::deque<size_t> again_;     // requeued: any worker
  std::deque<size_t> isolated_;  // each alone in a (solo) worker
  std::vector<int> requeues_;    // requeue answers per task, of cases that ran
  std::vector<int> blameless_;   // requeue answers per task that said nothing of the case
  // Tasks from next_ on that stop_dispatching or before_dispatch took out of the run.
  std::vector<char> not_started_;
  // done_ when stop_dispatching was last asked: only an outcome can change its answer.
  size_t settled_at_done_ = static_cast<size_t>(-1);
  uint64_t seq_ = 0;
  int start_failures_ = 0, spawned_ = 0;
  Clock::time_point next_memory_check_ = Clock::now();
  int grow_wanted_;  // < threads_: a hello said so (the smallest capacity said)
  // Slots whose retiring worker gets its replacement now (spawned after the loop over workers_,
  // which a spawn would invalidate): the replacement's start (a GPU context, the library's load)
  // overlaps the retiring worker's last cases and exit instead of following them.
  std::vector<size_t> replace_now_;
};

WorkerPool::WorkerPool(const WorkerSpec& spec, const std::vector<PoolTask>& tasks,
                       const PoolCallbacks& cb)
    : spec_(spec),
      tasks_(tasks),
      cb_(cb),
      threads_(spec.one_case_per_worker ? 1 : std::max(1, spec.threads)),
      target_(static_cast<size_t>(pool_jobs(spec, tasks.size())) * static_cast<size_t>(threads_)),
      solo_max_(threads_ > 1 ? static_cast<size_t>(pool_jobs(spec, tasks.size())) : 0),
      requeues_(tasks.size(), 0),
      blameless_(tasks.size(), 0),
      not_started_(tasks.size(), 0),
      grow_wanted_(threads_) {
  if (!spec.log_path.empty()) log_.open(spec.log_path, std::ios::app);
  for (size_t k = 0; k < static_cast<size_t>(pool_jobs(spec, tasks.size())); ++k)
    workers_.push_back(vacant(k));
  // Named with the kernel library it loads: a worker that cannot start is that library's doing.
  worker_name_ =
      "the worker process (" + spec.exe + (spec.args.empty() ? "" : " " + spec.args[0]) + ")";
  if (const auto k = std::find(spec.args.begin(), spec.args.end(), "--kernels");
      k != spec.args.end() && k + 1 != spec.args.end())
    worker_name_ = "the worker process of kernel library '" + *(k + 1) + "'";
}

// Until every task has ended: the waiting tasks stop_dispatching excludes are set aside, slots
// open and fill, requests go out, and each worker's output, exit, memory and deadlines are seen to.
void WorkerPool::run() {
  if (cb_.before_dispatch) start_before_dispatch();
  while (done_ < tasks_.size()) {
    if (work_left() && done_ != settled_at_done_) {
      settle_stopped();
      settled_at_done_ = done_;
      if (done_ == tasks_.size()) break;
    }
    if (grow_wanted_ < threads_) {
      grow(grow_wanted_);
      grow_wanted_ = threads_;
    }
    refill_slots();
    dispatch();
    start_solo_workers();
    poll();
    const GroupRss rss = sample_memory();
    for (auto& w : workers_)
      if (w.pid >= 0) service(w, rss);
  }
  finish();
}

// The workers start, then before_dispatch runs beside their start; what it returns is not run.
void WorkerPool::start_before_dispatch() {
  for (auto& w : workers_)
    if (w.pid < 0 && work_left()) w = start(w.slot);
  for (size_t idx : cb_.before_dispatch()) {
    if (idx >= tasks_.size() || not_started_[idx]) continue;
    not_started_[idx] = 1;
    not_run(idx);
  }
  skip_not_started();
}

// The waiting tasks that stop_dispatching now excludes go to on_not_run.
void WorkerPool::settle_stopped() {
  if (!cb_.stop_dispatching || !cb_.on_not_run) return;
  auto stopped = [&](size_t idx) {
    if (!cb_.stop_dispatching(idx)) return false;
    not_run(idx);
    return true;
  };
  std::erase_if(isolated_, stopped);
  std::erase_if(again_, stopped);
  for (size_t idx = next_; idx < tasks_.size(); ++idx)
    if (!not_started_[idx] && stopped(idx)) not_started_[idx] = 1;
  skip_not_started();
}

void WorkerPool::skip_not_started() {
  while (next_ < tasks_.size() && not_started_[next_]) ++next_;
}

// A waiting task taken out of the run: on_not_run has it.
void WorkerPool::not_run(size_t idx) {
  ++done_;
  if (cb_.on_not_run) cb_.on_not_run(idx);
}

// The replacements asked for since the last pass; then one entry per slot: an entry whose worker
// is gone is dropped when a live worker (a replacement) or an earlier gone entry holds its slot,
// so that dispatch refills each slot once at most.
void WorkerPool::refill_slots() {
  for (size_t slot : std::exchange(replace_now_, {}))
    if (pool_work_left()) workers_.push_back(start(slot));
  std::vector<size_t> held;
  for (const auto& w : workers_)
    if (w.pid >= 0) held.push_back(w.slot);
  std::vector<size_t> dropped;  // indices, ascending
  for (size_t k = 0; k < workers_.size(); ++k) {
    if (workers_[k].pid >= 0) continue;
    // A solo worker is started when a case waits for one (start_solo_workers), not refilled.
    if (workers_[k].solo || std::find(held.begin(), held.end(), workers_[k].slot) != held.end())
      dropped.push_back(k);
    else
      held.push_back(workers_[k].slot);
  }
  for (auto k = dropped.rbegin(); k != dropped.rend(); ++k)
    workers_.erase(workers_.begin() + static_cast<std::ptrdiff_t>(*k));
}

// Starts a worker in each empty slot while work is left, and fills each ready worker's capacity:
// a case that runs alone into a solo worker (or, without solo workers, first, into a worker with
// nothing in flight), then requeued cases, then new ones.
void WorkerPool::dispatch() {
  for (auto& w : workers_) {
    if (w.pid < 0 && pool_work_left()) w = start(w.slot);
    if (w.pid < 0 || !w.ready || w.retiring || w.isolating) continue;
    if ((w.solo || solo_max_ == 0) && w.flight.empty() && !isolated_.empty()) {
      w.isolating = true;
      send(w, isolated_.front());
      isolated_.pop_front();
      continue;
    }
    if (w.solo) continue;
    const int in_flight = w.capacity + (w.capacity > 1 ? spec_.queued_per_worker : 0);
    while (static_cast<int>(w.flight.size()) < in_flight) {
      if (!again_.empty()) {
        send(w, again_.front());
        again_.pop_front();
      } else if (next_ < tasks_.size()) {
        send(w, next_++);
        skip_not_started();
      } else {
        break;
      }
    }
  }
}

// A solo worker for each case waiting to run alone that no solo worker (idle or starting) will
// take, up to solo_max_ live ones.
void WorkerPool::start_solo_workers() {
  size_t live = 0, free = 0;
  for (const auto& w : workers_) {
    if (!w.solo || w.pid < 0 || w.retiring) continue;
    ++live;
    if (!w.ready || w.flight.empty()) ++free;
  }
  for (; free < isolated_.size() && live < solo_max_; ++free, ++live)
    workers_.push_back(start(kSoloSlots + solo_spawned_++));
}

void WorkerPool::send(Worker& w, size_t idx) {
  InFlight f;
  f.task = idx;
  f.seq = ++seq_;
  nlohmann::json request = tasks_[idx].request;
  request.update(
      nlohmann::json{{"seq", f.seq}, {"id", tasks_[idx].id}, {"case", tasks_[idx].payload}});
  const std::string line =
      request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  f.sent_id = nlohmann::json::parse(line)["id"].get<std::string>();
  f.sent_at = Clock::now();
  f.deadline = f.sent_at + ms(spec_.case_timeout_s);
  w.flight.push_back(std::move(f));
  // A failed or short write: the worker is gone, and its end of file arrives through poll.
  size_t at = 0;
  while (at < line.size()) {
    const ssize_t n = ::write(w.in, line.data() + at, line.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
}

// Waits for a line or output from any worker, at most until the nearest deadline (a case's, a
// start's, a retiring worker's exit, the next memory sample) and never more than a second.
void WorkerPool::poll() {
  std::vector<pollfd> fds;
  auto earliest = Clock::time_point::max();
  for (const auto& w : workers_) {
    if (w.pid < 0) continue;
    if (w.out >= 0) fds.push_back({w.out, POLLIN, 0});
    if (w.err >= 0) fds.push_back({w.err, POLLIN, 0});
    for (const auto& f : w.flight) earliest = std::min(earliest, f.deadline);
    if (!w.ready || (w.retiring && w.flight.empty())) earliest = std::min(earliest, w.deadline);
  }
  if (spec_.memory_limit > 0) earliest = std::min(earliest, next_memory_check_);
  int wait_ms = 1000;
  if (earliest != Clock::time_point::max())
    wait_ms = static_cast<int>(std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(earliest - Clock::now()).count() + 1,
        0, 1000));
  if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR)
    throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
}

// The resident memory of each live worker's process group, when a sample is due; else none.
GroupRss WorkerPool::sample_memory() {
  if (spec_.memory_limit == 0 || Clock::now() < next_memory_check_) return {};
  next_memory_check_ = Clock::now() + kMemoryCheckEvery;
  std::vector<pid_t> groups;
  for (const auto& w : workers_)
    if (w.pid >= 0) groups.push_back(w.pid);
  return group_rss(groups);
}

// After poll, for one live worker: its output, its lines, its exit, its memory, its deadlines;
// each of them may end the worker, and what follows is then skipped.
void WorkerPool::service(Worker& w, const GroupRss& rss) {
  if (w.err >= 0) read_stderr(w);
  bool eof = false;
  if (w.out >= 0) {
    eof = !drain(w.out, w.out_buf);
    if (!read_lines(w)) return;
  }
  if (eof) {
    on_exit(w);
    return;
  }
  if (check_memory(w, rss)) return;
  check_deadlines(w);
}

// What the worker printed since: to the log and its kept tail; its stderr closed at end of file.
void WorkerPool::read_stderr(Worker& w) {
  std::string chunk;
  const bool open = drain(w.err, chunk);
  if (!chunk.empty()) {
    if (log_.is_open()) log_ << chunk << std::flush;
    w.err_tail += chunk;
    if (w.err_tail.size() > kTailBytes) w.err_tail.erase(0, w.err_tail.size() - kTailBytes);
  }
  if (!open) close_fd(w.err);
}

// Each complete protocol line read from `w`; false when the worker was killed for one.
bool WorkerPool::read_lines(Worker& w) {
  for (size_t nl; (nl = w.out_buf.find('\n')) != std::string::npos;) {
    const std::string line = w.out_buf.substr(0, nl);
    w.out_buf.erase(0, nl + 1);
    if (!line.empty() && !on_line(w, line)) return false;
  }
  return true;
}

// One protocol line from `w`: its hello, or the answer to a request in flight (a result or a
// requeue); anything else is rejected. False when the worker was killed for it.
bool WorkerPool::on_line(Worker& w, const std::string& line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const std::exception&) {
    reject(w, line, "not JSON");
    return false;
  }
  if (!w.ready) return on_hello(w, j, line);
  if (w.flight.empty()) {
    reject(w, line, "no request was outstanding");
    return false;
  }
  // The request it answers: by seq when several are in flight.
  auto it = w.flight.begin();
  if (w.flight.size() > 1 && j.is_object() && j.contains("seq") && j["seq"].is_number_unsigned()) {
    const auto s = j["seq"].get<uint64_t>();
    it = std::find_if(w.flight.begin(), w.flight.end(),
                      [&](const InFlight& f) { return f.seq == s; });
    if (it == w.flight.end()) {
      reject(
          w, line,
          "its seq is not one of the " + std::to_string(w.flight.size()) + " requests in flight");
      return false;
    }
  }
  const InFlight request = *it;
  if (const std::string why = answer_mismatch(j, request.seq, request.sent_id, w.capacity > 1);
      !why.empty()) {
    reject(w, line,
           why + "; the request was seq " + std::to_string(request.seq) + " for '" +
               tasks_[request.task].id + "'");
    return false;
  }
  w.flight.erase(it);
  if (w.flight.empty()) w.isolating = false;
  if (j.contains("result"))
    on_result(w, request, j);
  else
    requeue(w, request.task, j);
  return true;
}

// The worker's first line: its hello (how many cases it runs at once), or a fatal error that
// ends the run.
bool WorkerPool::on_hello(Worker& w, const nlohmann::json& j, const std::string& line) {
  if (j.is_object() && j.contains("fatal") && j["fatal"].is_string())
    throw std::runtime_error(j["fatal"].get<std::string>());
  if (!j.is_object() || !j.contains("hello")) {
    reject(w, line, "expected the hello line");
    return false;
  }
  w.ready = true;
  start_failures_ = 0;
  const auto& hello = j["hello"];
  w.capacity =
      hello.is_object() && hello.contains("threads") && hello["threads"].is_number_integer()
          ? std::clamp(hello["threads"].get<int>(), 1, threads_)
          : 1;
  // Not here: workers_ is being iterated.
  if (!w.solo && w.capacity < threads_) grow_wanted_ = std::min(grow_wanted_, w.capacity);
  if (cb_.on_worker_started)
    cb_.on_worker_started(w.slot,
                          std::chrono::duration<double>(Clock::now() - w.spawned_at).count());
  if (cb_.on_hello) cb_.on_hello(hello);
  return true;
}

void WorkerPool::on_result(Worker& w, const InFlight& request, const nlohmann::json& j) {
  const size_t idx = request.task;
  if (cb_.on_round_trip)
    cb_.on_round_trip(
        idx, w.slot,
        std::chrono::duration<double, std::milli>(Clock::now() - request.sent_at).count());
  if (spec_.one_case_per_worker) {
    // Delivered (and counted done) once the worker and its wrapper have exited.
    w.pending = static_cast<long>(idx);
    w.pending_result = j["result"];
    w.retiring = true;
    w.deadline = Clock::now() + ms(spec_.case_timeout_s);
    close_fd(w.in);
    return;
  }
  ++done_;
  if (j.value("retire", false)) retire(w);
  cb_.on_result(idx, j["result"]);
}

// The worker closed its protocol channel: it has left as announced, owing nothing, or it is lost.
void WorkerPool::on_exit(Worker& w) {
  int status = 0;
  const bool exited = reap(w, status, false);
  if (w.retiring && w.flight.empty()) {
    if (w.pending >= 0) deliver_pending(w);
  } else {
    lose(w,
         exited ? "worker process died with " + describe_wait_status(status) +
                      (w.flight.size() == 1 ? " while running this case" : "")
                : std::string("the worker closed its protocol channel (did the kernel or an "
                              "adapter close descriptors?) and was killed"),
         false);
  }
  w = vacant(w.slot);
}

// Kills the worker when its process group holds more than the limit; true when it did.
bool WorkerPool::check_memory(Worker& w, const GroupRss& rss) {
  const auto it = rss.find(w.pid);
  if (it == rss.end() || it->second <= spec_.memory_limit) return false;
  end_worker(w,
             "the worker's processes held " + describe_bytes(it->second) +
                 " of memory, over the limit of " + describe_bytes(spec_.memory_limit) + " (" +
                 spec_.memory_limit_flag + "); the worker was killed",
             false);
  return true;
}

// Kills the worker when a case in flight is past its timeout, or its start or its announced exit
// is late. A start that hangs hangs again: it is not retried.
void WorkerPool::check_deadlines(Worker& w) {
  const auto now = Clock::now();
  const bool case_late = std::any_of(w.flight.begin(), w.flight.end(),
                                     [&](const InFlight& f) { return now > f.deadline; });
  const bool worker_late = (!w.ready || (w.retiring && w.flight.empty())) && now > w.deadline;
  if (!case_late && !worker_late) return;
  if (w.ready || !w.flight.empty())
    end_worker(
        w,
        "timed out after " + std::to_string(static_cast<int64_t>(spec_.case_timeout_s)) +
            " s (hung, or slower than --timeout); the worker was killed with every process it "
            "started",
        false);
  else
    end_worker(w,
               "no hello within " + std::to_string(static_cast<int64_t>(spec_.start_timeout_s)) +
                   " s; the worker was killed",
               true);
}

// Kills the worker with every process it started. A one-case worker that answered before
// delivers that answer (its case ran; it overran or did not exit in time after it); otherwise
// its cases are lost with `what`.
void WorkerPool::end_worker(Worker& w, const std::string& what, bool fatal_at_start) {
  int status = 0;
  reap(w, status, true);
  if (w.pending >= 0)
    deliver_pending(w);
  else
    lose(w, what, fatal_at_start);
  w = vacant(w.slot);
}

// A case is run again at most this often after requeue answers (a worker that keeps answering
// so, forged or not, cannot keep a run going). From its second requeue on it runs alone in a
// worker, where a legitimate worker answers with a result: only a misbehaving one reaches this.
constexpr int kMaxRequeues = 3;
// Requeues that say nothing of the case ("blameless": the worker had decided to retire before the
// case started, or its launch failed only after another case's device error) count apart: the
// case runs alone only from the kBlamelessAlone-th on (a run whose kernels fault often, such as a
// mutants run, hits the same long case again and again), and only a misbehaving worker gives
// kMaxBlameless (alone, a case starts at once and its launch fails only by its own fault).
constexpr int kBlamelessAlone = 3;
constexpr int kMaxBlameless = 6;

// The rules for cases a worker did not answer, in one place (pool.h, docs/verification.md
// "Worker isolation"):
// - lose: the worker is gone (it died, hung, overran the memory limit, a line of it was rejected)
//   with `what`. A case it ran alone fails with that reason and the worker's last output lines.
//   Several cases in flight run again, each alone in a worker: nothing can be pinned on one of
//   them. A worker gone before its hello is a start failure: a start that hung
//   (`fatal_at_start`), or the third failure in a row, ends the run.
// - requeue: the worker answered "run it again"; it retires. The case runs again in any worker
//   the first time, alone when the worker said "isolate" and from its second requeue on (so that
//   other cases' device errors never exhaust its requeues), and is lost after kMaxRequeues. A
//   "blameless" answer runs the case again in any worker, alone from the kBlamelessAlone-th, and
//   it is lost after kMaxBlameless. Alone means in a solo worker when the pool has them.
// - A one-case worker's answer counts once the worker has exited; killed after it (its memory, a
//   late exit) the answer still counts (end_worker), after a rejected line it does not (reject).
void WorkerPool::lose(Worker& w, const std::string& what, bool fatal_at_start) {
  if (w.flight.size() == 1) {
    const size_t idx = w.flight.front().task;
    w.flight.clear();
    ++done_;
    cb_.on_lost(idx, what + last_lines(w.err_tail));
  } else if (!w.flight.empty()) {
    note("worker " + std::to_string(w.pid) + ": " + what + "; its " +
         std::to_string(w.flight.size()) + " cases in flight run again, each alone in a worker");
    for (const auto& f : w.flight) isolated_.push_back(f.task);
    w.flight.clear();
  } else if (!w.ready) {
    if (fatal_at_start)
      throw std::runtime_error(worker_name_ + " did not start: " + what + last_lines(w.err_tail));
    if (++start_failures_ >= 3)
      throw std::runtime_error(worker_name_ + " failed to start three times: " + what +
                               " before its hello, while loading the library and asking for its "
                               "device" +
                               last_lines(w.err_tail));
  }
}

void WorkerPool::requeue(Worker& w, size_t idx, const nlohmann::json& j) {
  retire(w);
  const std::string why = j["requeue"].get<std::string>();
  const bool blameless = j.value("blameless", false);
  const int limit = blameless ? kMaxBlameless : kMaxRequeues;
  if (++(blameless ? blameless_ : requeues_)[idx] > limit) {
    ++done_;
    cb_.on_lost(idx, std::string(blameless ? "answered 'run it again, not its doing' "
                                           : "answered 'run it again' ") +
                         std::to_string(limit) + " times; the last: " + why);
    return;
  }
  const bool alone = blameless ? blameless_[idx] >= kBlamelessAlone
                               : j.value("isolate", false) || requeues_[idx] >= 2;
  note("worker " + std::to_string(w.pid) + ": " + tasks_[idx].id + " runs again" +
       (alone ? " alone" : "") + ": " + why);
  (alone ? isolated_ : again_).push_back(idx);
}

// A line the parent did not ask for, or an answer that is not the request's: the channel of this
// worker is not trustworthy any more. The worker is killed and its cases are lost (lose), a
// one-case worker's answer included.
void WorkerPool::reject(Worker& w, const std::string& line, const std::string& why) {
  note("worker " + std::to_string(w.pid) + ": rejected protocol line (" + why +
       "): " + excerpt(line));
  int status = 0;
  reap(w, status, true);
  const std::string what = "the worker's protocol line was rejected (" + why +
                           "): " + excerpt(line) +
                           "; the worker was killed (did the kernel or an adapter write to the "
                           "protocol channel?)";
  if (w.pending >= 0) {
    ++done_;
    cb_.on_lost(static_cast<size_t>(w.pending), what + last_lines(w.err_tail));
  } else {
    lose(w, what, false);
  }
  w = vacant(w.slot);
}

// The worker said it exits after its last answer: it gets no further case, and its replacement
// starts now (refill_slots, if work is left by then).
void WorkerPool::retire(Worker& w) {
  if (w.retiring) return;
  w.retiring = true;
  w.deadline = Clock::now() + std::chrono::seconds(30);  // to exit
  close_fd(w.in);
  if (!w.solo) replace_now_.push_back(w.slot);
}

// After a hello said `capacity` < threads: while the workers (those yet to say hello counted at
// threads) cannot run target_ cases at once, another slot is opened.
void WorkerPool::grow(int capacity) {
  size_t can = 0;
  for (const auto& w : workers_)
    if (!w.solo) can += w.ready ? static_cast<size_t>(w.capacity) : static_cast<size_t>(threads_);
  // Slots, not entries: a retiring worker and its replacement share one.
  size_t slots = 0;
  for (const auto& w : workers_)
    if (!w.solo) slots = std::max(slots, w.slot + 1);
  const size_t before = slots;
  while (can < target_ && slots < target_) {
    workers_.push_back(vacant(slots++));
    can += static_cast<size_t>(threads_);
  }
  if (slots > before)
    note("a worker runs " + std::to_string(capacity) + " case(s) at once, not " +
         std::to_string(threads_) + ": the pool opens " + std::to_string(slots - before) +
         " more worker process(es)");
}

// A one-case worker has exited (or been killed after answering): its case's result counts now.
void WorkerPool::deliver_pending(Worker& w) {
  const auto idx = static_cast<size_t>(w.pending);
  if (cb_.on_worker_exit) cb_.on_worker_exit(w.serial, idx, w.pending_result);
  ++done_;
  cb_.on_result(idx, w.pending_result);
}

// One line of the pool's own in the worker log.
void WorkerPool::note(const std::string& text) {
  if (log_.is_open()) log_ << "[attncheck] " << text << "\n" << std::flush;
}

// No more cases: end of input lets each worker exit; stragglers are killed after 10 s. What the
// workers print on their way out still reaches the log: their stderr is read until it closes or
// the worker has exited (a process it started may hold the pipe open).
void WorkerPool::finish() {
  for (auto& w : workers_) close_fd(w.in);
  const auto grace = Clock::now() + std::chrono::seconds(10);
  while (log_.is_open() && Clock::now() < grace) {
    std::vector<pollfd> fds;
    std::vector<Worker*> owners;
    for (auto& w : workers_)
      if (w.pid >= 0 && w.err >= 0) {
        fds.push_back({w.err, POLLIN, 0});
        owners.push_back(&w);
      }
    if (fds.empty()) break;
    if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      Worker& w = *owners[k];
      const bool gone = exited_by(w.pid, Clock::now());
      if (fds[k].revents == 0 && !gone) continue;
      read_stderr(w);
      if (gone) close_fd(w.err);
    }
  }
  for (auto& w : workers_) {
    if (w.pid < 0) continue;
    int status = 0;
    reap(w, status, false,
         std::chrono::duration_cast<std::chrono::milliseconds>(
             std::max(grace - Clock::now(), Clock::duration::zero())));
  }
}

}  // namespace

void run_in_workers(const WorkerSpec& spec, const std::vector<PoolTask>& tasks,
                    const PoolCallbacks& cb) {
  ::signal(SIGPIPE, SIG_IGN);  // a worker that died must not take the parent with it
  // What a worker started and left behind becomes this process's child, not init's: reap() ends
  // it (end_adopted).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  WorkerPool(spec, tasks, cb).run();
}

}  // namespace attncheck
