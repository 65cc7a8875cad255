#include "pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace attncheck {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kTailBytes = 4096;

struct Worker {
  pid_t pid = -1;
  int in = -1, out = -1, err = -1;
  std::string out_buf, err_tail;
  bool ready = false;
  bool out_eof = false;
  bool retiring = false;  // said it exits after its last result: gets no further case
  long busy = -1;         // case index being run
  Clock::time_point deadline;
  int serial = -1;    // spawn number ("{worker}" in the wrapper's arguments)
  long pending = -1;  // one_case_per_worker: case whose result waits for the exit
  nlohmann::json pending_result;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

Worker spawn(const WorkerSpec& spec, int serial) {
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
  const std::string exec_failed = "attncheck: cannot exec " + program + "\n";

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    ::dup2(pin[0], 0);
    ::dup2(pout[1], 1);
    ::dup2(perr[1], 2);
    ::close_range(3, ~0u, 0);  // nothing else of the parent (result files, ...) leaks into workers
    ::execv(program.c_str(), argv.data());
    [[maybe_unused]] auto n = ::write(2, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  ::close(pin[0]);
  ::close(pout[1]);
  ::close(perr[1]);
  Worker w;
  w.pid = pid;
  w.serial = serial;
  w.in = pin[1];
  w.out = pout[0];
  w.err = perr[0];
  ::fcntl(w.out, F_SETFL, ::fcntl(w.out, F_GETFL) | O_NONBLOCK);
  ::fcntl(w.err, F_SETFL, ::fcntl(w.err, F_GETFL) | O_NONBLOCK);
  w.deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(spec.start_timeout_s * 1e3));
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
  return "\n  worker stderr (last lines):\n    " + [&] {
    std::string s;
    for (char c : t) s += c == '\n' ? std::string("\n    ") : std::string(1, c);
    return s;
  }();
}

void reap(Worker& w, int& status, bool kill_first) {
  if (kill_first) ::kill(w.pid, SIGKILL);
  close_fd(w.in);
  close_fd(w.out);
  close_fd(w.err);
  while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
  }
  w.pid = -1;
}

}  // namespace

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

FILE* claim_protocol_stdout() {
  std::fflush(stdout);
  const int fd = ::dup(1);
  ::dup2(2, 1);
  FILE* f = ::fdopen(fd, "w");
  if (!f) throw std::runtime_error("cannot open the worker protocol stream");
  return f;
}

void run_in_workers(const WorkerSpec& spec, const std::vector<std::string>& ids,
                    const PoolCallbacks& cb) {
  ::signal(SIGPIPE, SIG_IGN);  // a worker that died must not take the parent with it
  std::ofstream log;
  if (!spec.log_path.empty()) log.open(spec.log_path, std::ios::app);
  const int jobs = std::max(1, std::min<int>(spec.jobs, static_cast<int>(ids.size())));
  std::vector<Worker> workers(static_cast<size_t>(jobs));
  size_t next = 0, done = 0;
  int start_failures = 0, spawned = 0;
  const auto case_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(spec.case_timeout_s * 1e3));

  auto lose_or_fail_start = [&](Worker& w, const std::string& what) {
    if (w.busy >= 0) {
      const auto idx = static_cast<size_t>(w.busy);
      w.busy = -1;
      ++done;
      cb.on_lost(idx, what + last_lines(w.err_tail));
    } else if (!w.ready) {
      if (++start_failures >= 3)
        throw std::runtime_error("the worker process (" + spec.exe + " " +
                                 (spec.args.empty() ? "" : spec.args[0]) +
                                 ") failed to start three times: " + what + last_lines(w.err_tail));
    }
  };

  // A one-case worker has exited (or been killed after answering): its case's result counts now.
  auto deliver_pending = [&](Worker& w) {
    const auto idx = static_cast<size_t>(w.pending);
    if (cb.on_worker_exit) cb.on_worker_exit(w.serial, idx, w.pending_result);
    ++done;
    cb.on_result(idx, w.pending_result);
  };

  while (done < ids.size()) {
    const auto now = Clock::now();
    for (auto& w : workers) {
      if (w.pid < 0 && next < ids.size()) w = spawn(spec, spawned++);
      if (w.pid >= 0 && w.ready && !w.retiring && w.busy < 0 && next < ids.size()) {
        const std::string line = ids[next] + "\n";
        if (::write(w.in, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          // The worker is gone; its end of file arrives through poll below.
          w.busy = static_cast<long>(next++);
          w.deadline = now + case_timeout;
          continue;
        }
        w.busy = static_cast<long>(next++);
        w.deadline = now + case_timeout;
      }
    }

    std::vector<pollfd> fds;
    auto earliest = Clock::time_point::max();
    for (const auto& w : workers) {
      if (w.pid < 0) continue;
      if (w.out >= 0) fds.push_back({w.out, POLLIN, 0});
      if (w.err >= 0) fds.push_back({w.err, POLLIN, 0});
      if (w.busy >= 0 || !w.ready || w.retiring) earliest = std::min(earliest, w.deadline);
    }
    int wait_ms = 1000;
    if (earliest != Clock::time_point::max())
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(earliest - Clock::now()).count() +
              1,
          0, 1000));
    if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR)
      throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));

    for (auto& w : workers) {
      if (w.pid < 0) continue;
      if (w.err >= 0) {
        std::string chunk;
        const bool open = drain(w.err, chunk);
        if (!chunk.empty()) {
          if (log.is_open()) log << chunk << std::flush;
          w.err_tail += chunk;
          if (w.err_tail.size() > kTailBytes) w.err_tail.erase(0, w.err_tail.size() - kTailBytes);
        }
        if (!open) close_fd(w.err);
      }
      if (w.out >= 0) {
        const bool open = drain(w.out, w.out_buf);
        size_t nl;
        while ((nl = w.out_buf.find('\n')) != std::string::npos) {
          const std::string line = w.out_buf.substr(0, nl);
          w.out_buf.erase(0, nl + 1);
          if (line.empty()) continue;
          nlohmann::json j;
          try {
            j = nlohmann::json::parse(line);
          } catch (const std::exception&) {
            if (log.is_open()) log << "[worker " << w.pid << " stdout] " << line << "\n";
            continue;
          }
          if (j.contains("fatal")) throw std::runtime_error(j["fatal"].get<std::string>());
          if (j.contains("hello")) {
            w.ready = true;
            start_failures = 0;
            if (cb.on_hello) cb.on_hello(j["hello"]);
          } else if (w.busy >= 0 && j.contains("result")) {
            const auto idx = static_cast<size_t>(w.busy);
            w.busy = -1;
            if (spec.one_case_per_worker) {
              // Delivered (and counted done) once the worker and its wrapper have exited.
              w.pending = static_cast<long>(idx);
              w.pending_result = j["result"];
              w.retiring = true;
              w.deadline = Clock::now() + case_timeout;
              close_fd(w.in);
              continue;
            }
            ++done;
            if (j.value("retire", false)) {
              w.retiring = true;
              w.deadline = Clock::now() + std::chrono::seconds(30);  // to exit
              close_fd(w.in);
            }
            cb.on_result(idx, j["result"]);
          }
        }
        if (!open) w.out_eof = true;
      }
      if (w.out_eof) {
        int status = 0;
        reap(w, status, false);
        if (w.retiring && w.busy < 0) {  // left as announced, owing nothing
          if (w.pending >= 0) deliver_pending(w);
          w = Worker{};
          continue;
        }
        lose_or_fail_start(w, "worker process died with " + describe_wait_status(status) +
                                  (w.busy >= 0 ? " while running this case" : ""));
        w = Worker{};
        continue;
      }
      if ((w.busy >= 0 || !w.ready || w.retiring) && Clock::now() > w.deadline) {
        int status = 0;
        reap(w, status, true);
        if (w.pending >= 0) {  // ran its case, then did not exit in time: deliver what it said
          deliver_pending(w);
          w = Worker{};
          continue;
        }
        const double limit = w.ready ? spec.case_timeout_s : spec.start_timeout_s;
        lose_or_fail_start(w, "timed out after " + std::to_string(static_cast<int64_t>(limit)) +
                                  " s (hung, or slower than --timeout); the worker was killed");
        w = Worker{};
      }
    }
  }
  // No more cases: end of input lets each worker exit; stragglers are killed after 10 s.
  for (auto& w : workers) close_fd(w.in);
  const auto grace = Clock::now() + std::chrono::seconds(10);
  for (auto& w : workers) {
    if (w.pid < 0) continue;
    int status = 0;
    while (Clock::now() < grace && ::waitpid(w.pid, &status, WNOHANG) == 0) ::usleep(10000);
    if (::waitpid(w.pid, &status, WNOHANG) == 0) ::kill(w.pid, SIGKILL);
    reap(w, status, false);
  }
}

}  // namespace attncheck
