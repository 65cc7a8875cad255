// docs/abi.md's table of ops ("Per-op argument contracts") against the op registry: an op added
// without a row there, or a row naming an op that no longer exists, fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "ops/op.h"
#include "run/provenance.h"

namespace attncheck {
namespace {

// The backticked names of the table's "ops" column, between its heading and the next heading.
std::set<std::string> ops_in_abi_table(const std::string& abi_md) {
  const auto start = abi_md.find("## Per-op argument contracts");
  if (start == std::string::npos) return {};
  const auto end = abi_md.find("\n## ", start + 1);
  std::istringstream section(abi_md.substr(start, end - start));
  std::set<std::string> names;
  const std::regex cell_name("`([a-z0-9_]+)`");
  for (std::string line; std::getline(section, line);) {
    if (line.rfind("| ", 0) != 0) continue;
    // | family | ops | contract |: the second cell only (its parenthesised entry names aside).
    const auto first = line.find('|', 1), second = line.find('|', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    std::string ops = line.substr(first + 1, second - first - 1);
    ops = std::regex_replace(ops, std::regex("\\(entries[^)]*\\)"), "");
    for (std::sregex_iterator it(ops.begin(), ops.end(), cell_name), e; it != e; ++it)
      names.insert((*it)[1]);
  }
  return names;
}

TEST(DocsOps, AbiTableNamesEveryRegisteredOpAndNoOther) {
  const std::string path = default_root() + "/docs/abi.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::stringstream text;
  text << in.rdbuf();
  const std::set<std::string> documented = ops_in_abi_table(text.str());
  std::set<std::string> registered;
  for (const Op* op : all_ops()) registered.insert(op->name());
  for (const auto& name : registered)
    EXPECT_TRUE(documented.count(name)) << "op '" << name << "' has no row in " << path;
  for (const auto& name : documented)
    EXPECT_TRUE(registered.count(name)) << path << " names op '" << name << "', not registered";
}

TEST(DocsOps, TheTableReaderSeesOpsAndSkipsEntryNames) {
  const std::string md =
      "## Per-op argument contracts\n| family | ops | contract |\n|---|---|---|\n"
      "| RoPE | `rope` (entries `rope_inplace`), `indexer_qk_rope` | x |\n## Next\n| a | `b` | c "
      "|\n";
  EXPECT_EQ(ops_in_abi_table(md), (std::set<std::string>{"rope", "indexer_qk_rope"}));
}

}  // namespace
}  // namespace attncheck
