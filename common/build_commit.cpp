// The commit the build was made from (report.h). Alone in this file, so that a new commit
// recompiles one line: the generated header changes at every build that sees another commit.
#include "mgpu_build_commit.h"  // MGPU_BUILD_COMMIT, written by cmake/Commit.cmake
#include "report.h"

std::string mgpu::build_commit() { return MGPU_BUILD_COMMIT; }
