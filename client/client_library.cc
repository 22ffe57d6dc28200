// The shared library strata::client is strata_client_core linked in whole
// (see client/CMakeLists.txt); CMake needs one source file for it: this one.
