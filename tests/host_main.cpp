// doctest's own main() for the suites that run on the host only (the data loader, the
// command line, the batch order): they need no device, so they run in every build.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
