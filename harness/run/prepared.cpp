#include "run/prepared.h"

#include <set>

namespace attncheck {
namespace {

size_t storage_bytes(const Problem& p) {
  std::set<const Storage*> seen;
  size_t bytes = 0;
  for (const auto& a : p.args)
    if (seen.insert(a.tensor.storage().get()).second) bytes += a.tensor.storage()->bytes.size();
  return bytes;
}

}  // namespace

std::list<PreparedCases::Entry>::iterator PreparedCases::find(const std::string& id) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->id == id) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.begin();
    }
  return entries_.end();
}

void PreparedCases::drop_beyond_budget() {
  while (bytes_ > max_bytes_ && !entries_.empty()) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

Problem PreparedCases::problem(const Case& c, const std::function<Problem()>& make) {
  const std::string params = c.params.dump();
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = find(c.id);
    if (it != entries_.end() && it->params == params) return it->problem;
  }
  Problem made = make();  // outside the lock: other threads go on meanwhile
  const size_t bytes = storage_bytes(made);
  if (bytes > max_bytes_) return made;
  const std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = find(c.id); it != entries_.end()) {  // made twice at once, or new params
    bytes_ -= it->bytes;
    entries_.erase(it);
  }
  entries_.push_front({c.id, params, made, bytes, {}});
  bytes_ += bytes;
  drop_beyond_budget();
  return made;
}

std::vector<OutputCheck> PreparedCases::default_checks(
    const std::string& id, const std::string& expected_from,
    const std::function<std::vector<OutputCheck>()>& derive) {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = find(id);
    if (it == entries_.end()) return derive();
    if (const auto known = it->checks.find(expected_from); known != it->checks.end())
      return known->second;
  }
  std::vector<OutputCheck> derived = derive();
  const std::lock_guard<std::mutex> lock(mutex_);
  if (const auto it = find(id); it != entries_.end()) it->checks.emplace(expected_from, derived);
  return derived;
}

size_t PreparedCases::kept_bytes() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

size_t PreparedCases::kept_cases() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

}  // namespace attncheck
