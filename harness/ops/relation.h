// Metamorphic relations (docs/verification.md "Invariance"): a transformed problem whose outputs,
// mapped back, must equal the case's first launch's. Each op declares its relations in one place
// (Op::relations, PyTorch-OpInfo style); the runner (run/invariance.h) launches them. The builders
// here are shared by the paged batch ops: requests permuted or alone, pages shuffled.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/case.h"

namespace attncheck {

// The kernel properties that make a relation bitwise (docs/abi.md "properties"). Without its
// property a relation holds within the op's own budgets.
inline constexpr const char* kBatchInvariant = "batch-invariant";  // alone == in any batch
inline constexpr const char* kBatchOrderInvariant = "batch-order-invariant";  // any order
inline constexpr const char* kSplitInvariant = "split-invariant";             // any split count
inline constexpr const char* kPageOrderInvariant = "page-order-invariant";    // any page order
// Every property name a library may declare.
std::vector<std::string> known_properties();

struct Relation {
  std::string name;  // "batch permutation [2,0,3,1]": named in the verdict
  // The properties under which outputs must match bitwise (any one suffices; batch-invariant
  // implies batch-order-invariant, so a permutation lists both).
  std::vector<std::string> bitwise_under;
  Problem problem;  // same op and kernel entry, transformed inputs
  // The transformed launch's outputs in the case's output space; `first`: the case's first launch.
  std::function<TensorMap(const TensorMap& outputs, const TensorMap& first)> back;
  // The op's budgets of the transformed problem (what changed enters its error model, e.g. the
  // split count) instead of the case's.
  bool own_budgets = false;
};

// Which arguments of a batch problem belong to which request.
struct BatchArgs {
  std::vector<std::string> per_request;  // dim 0 = request (lengths, block table rows)
  std::vector<std::string> per_token;    // dim 0 = query token (q, out, lse)
  // int32 [B + 1] prefix sums of tokens per request ("query_start_loc"); "": every request has
  // `tokens_per_request` consecutive rows of the per_token args (next_n decode rows).
  std::string token_starts;
  std::string unit = "request";  // what one row of per_request is, in relation names ("token")
  int64_t tokens_per_request = 1;
  // Outputs the transformed launch produces as a whole (a cache the tokens write into): taken
  // from it unchanged, not row by row.
  std::vector<std::string> whole = {};
};

// The requests of `p` in `order` (a permutation of [0, B)), outputs un-permuted.
Relation permuted_requests(const Problem& p, const BatchArgs& args, std::vector<int64_t> order);
// Request `r` alone as a batch of one; its rows replace the first launch's rows.
Relation request_alone(const Problem& p, const BatchArgs& args, int64_t r);
// The requests [begin, end) alone, as the batch of a launch of their own: a chunk of the batch
// (chunked prefill over query rows, a writer over token chunks); their rows replace the first
// launch's.
Relation requests_alone(const Problem& p, const BatchArgs& args, int64_t begin, int64_t end);
// The usual relations of a batch, for two or more requests (none otherwise): the requests in a
// derangement seeded by `seed`, and request `alone` as a batch of one.
std::vector<Relation> permuted_and_alone(const Problem& p, const BatchArgs& args, int64_t alone,
                                         uint64_t seed);
// Rows independent of each other (query rows, tokens), for two or more: the rows in a derangement
// and the second half [n/2, n) as a launch of its own (chunked vs whole).
std::vector<Relation> permuted_and_chunked(const Problem& p, const BatchArgs& args, uint64_t seed);
// A writer over token chunks: tokens [T/2, T) alone, written into the outputs `tokens.whole`
// (the caches, inout) as `write_first` (the op's reference) leaves them after tokens [0, T/2);
// those outputs are compared whole with the case's launch. nullopt for fewer than 2 tokens or an
// output on a sparse storage.
std::optional<Relation> chunked_write(const Problem& p, const BatchArgs& tokens,
                                      const std::function<TensorMap(const Problem&)>& write_first);
// The request with the most tokens in `seq_lens` (int32 [B]; the first of equals).
int64_t longest_request(const Tensor& seq_lens);
// The number of requests (dim 0 of the first per_request arg).
int64_t request_count(const Problem& p, const BatchArgs& args);
// A deterministic permutation of [0, n) that moves every element when n > 1 (a rotation composed
// with a shuffle seeded by `seed`).
std::vector<int64_t> derangement(int64_t n, uint64_t seed);

// The same logical cache with its pages (dim 0 of every `caches` arg) moved by a deterministic
// permutation and `table`'s non-negative ids rewritten to match. nullopt for a sparse storage
// (large-offset cases: the host does not hold the pages to move).
std::optional<Relation> shuffled_pages(const Problem& p, const std::vector<std::string>& caches,
                                       const std::string& table, uint64_t seed);

// The same logical cache at one token per page: each `caches` arg [n, P, ...] whose page stride is
// P times its token stride is the same storage viewed as [n * P, ...] ([n * P, 1, ...] with
// `keep_token_dim`), where page b's token t is page b * P + t; each non-negative id of `table`
// (int32 [rows, W]) becomes the P ids of its tokens. Same slots, same keys in the same order, so
// the case's budgets hold. The caller sets its op's page size in the problem's parameters and
// kernel parameters. nullopt at P <= 1, for pages that are not contiguous, a sparse storage, or
// ids past int32.
std::optional<Relation> at_page_size_one(const Problem& p, const std::vector<std::string>& caches,
                                         const std::string& table, int64_t P, bool keep_token_dim);

// The problem with one kernel parameter changed (and the typed parameters `params`, so the op's
// budgets follow); outputs map back unchanged.
Relation with_kernel_param(const Problem& p, std::string name, const std::string& key,
                           const nlohmann::json& value, std::any params);

std::string format_order(const std::vector<int64_t>& order);

}  // namespace attncheck
