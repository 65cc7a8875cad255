// Cases prepared once per worker process and run against several kernel libraries (`attncheck
// mutants`: each mutant library runs the same quick-tier cases). Making a case's inputs and
// deriving its default budgets cost as much host time as the rest of a launch (docs/results.md),
// and neither depends on the library: both are kept by case id and handed to every library's
// launch of that case. A kept problem is only read (the runner uploads it, relations and poison
// flips work on copies), so threads share it.
#pragma once
#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/case.h"

namespace attncheck {

class PreparedCases {
 public:
  // At most `max_bytes` of host storage kept (least recently used dropped first).
  explicit PreparedCases(size_t max_bytes = kDefaultBytes) : max_bytes_(max_bytes) {}
  static constexpr size_t kDefaultBytes = size_t{1} << 30;

  // Case `c`'s problem: `make()`'s the first time, the kept one after.
  Problem problem(const Case& c, const std::function<Problem()>& make);
  // The default contract's checks of case `id` over its kept problem and expected outputs made
  // as `expected_from` says (the Result's expected_from, plus the entry's partial contract when it
  // declares one, run/evaluate.cpp): `derive()`'s the first time, the kept ones after; derived
  // anew each time when the problem is not kept.
  std::vector<OutputCheck> default_checks(const std::string& id, const std::string& expected_from,
                                          const std::function<std::vector<OutputCheck>()>& derive);
  size_t kept_bytes() const;
  size_t kept_cases() const;

 private:
  struct Entry {
    std::string id, params;  // params: the Case's parameters, as its JSON
    Problem problem;
    size_t bytes = 0;
    std::map<std::string, std::vector<OutputCheck>> checks;  // expected_from -> checks
  };
  std::list<Entry>::iterator find(const std::string& id);  // end() when not kept; touches it
  void drop_beyond_budget();

  mutable std::mutex mutex_;
  size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace attncheck
