// Where a run or a golden came from: attncheck version, git revisions, toolchain, time; and where
// the repository is (case files, goldens, the report package).
#pragma once
#include <string>

namespace attncheck {

std::string attncheck_version();
// $ATTNCHECK_ROOT, else the source tree this binary was built from.
std::string default_root();
// `git rev-parse HEAD` in root, "+dirty" when tracked files differ; "unknown" outside git.
std::string git_revision(const std::string& root);
std::string toolchain();    // compiler that built attncheck
std::string utc_now_iso();  // "2026-05-01T12:00:00Z"

}  // namespace attncheck
