// main() of the kiln_test() binaries: the OpenMP team's spin bounded as kilnd
// bounds it (base/openmp_policy.h; kernels ran up to 20x slower under load
// with libgomp's default), then GoogleTest.
#include <gtest/gtest.h>

#include "base/openmp_policy.h"

int main(int argc, char** argv) {
  kiln::UseBoundedOpenMpSpin(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
