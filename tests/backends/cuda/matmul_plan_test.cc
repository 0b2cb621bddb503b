// PlanMatMul against a brute-force NumPy broadcast: for every shape of the
// conformance suite's matmul family (and a few more), the cuBLASLt calls a
// plan describes multiply exactly the (A, B, C) matrix triples that
// numpy.matmul pairs up. Runs without a GPU.
#include "backends/cuda/matmul_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln::cuda {
namespace {

struct PlanShape {
  Dims a, b;
  bool ta = false, tb = false;
};

using Triple = std::array<int64_t, 3>;

// The element offsets of each batch's A, B and C matrices, numpy.matmul's way.
std::vector<Triple> Expected(Dims a, Dims b, bool ta, bool tb, int64_t* m, int64_t* n, int64_t* k) {
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t ra = a.size(), rb = b.size(), r = std::max(ra, rb) - 2;
  *m = ta ? a[ra - 1] : a[ra - 2];
  *k = ta ? a[ra - 2] : a[ra - 1];
  *n = tb ? b[rb - 2] : b[rb - 1];
  Dims ad(r, 1), bd(r, 1), out(r);
  std::copy(a.begin(), a.end() - 2, ad.begin() + (r - (ra - 2)));
  std::copy(b.begin(), b.end() - 2, bd.begin() + (r - (rb - 2)));
  int64_t batch = 1;
  for (size_t d = 0; d < r; ++d) batch *= out[d] = std::max(ad[d], bd[d]);
  std::vector<Triple> t;
  for (int64_t bi = 0; bi < batch; ++bi) {
    int64_t rem = bi, ao = 0, bo = 0, as = *m * *k, bs = *k * *n;
    for (size_t d = r; d-- > 0;) {
      const int64_t c = rem % out[d];
      rem /= out[d];
      ao += (ad[d] == 1 ? 0 : c) * as;
      bo += (bd[d] == 1 ? 0 : c) * bs;
      as *= ad[d];
      bs *= bd[d];
    }
    t.push_back({ao, bo, bi * *m * *n});
  }
  return t;
}

TEST(MatMulPlan, CallsCoverExactlyTheBroadcastPairs) {
  const PlanShape shapes[] = {
      {{1, 1}, {1, 1}},
      {{3, 17}, {17, 65}},
      {{17}, {17, 5}},
      {{5, 17}, {17}},
      {{65}, {65}},
      {{2, 3, 17, 5}, {2, 3, 5, 7}},
      {{4, 17, 33}, {33, 9}},
      {{17, 33}, {4, 33, 9}},
      {{2, 1, 5, 7}, {1, 3, 7, 4}},
      {{2, 3, 4, 5}, {5, 6}},
      {{3, 1, 4, 5}, {2, 5, 6}},
      {{5}, {3, 5, 2}},
      {{3, 4, 5}, {5}},
      {{2, 1, 3}, {2, 3, 1}},
      {{3, 1, 2, 17, 3}, {1, 4, 1, 3, 17}},
      {{17, 3}, {65, 17}, true, true},
      {{4, 33, 17}, {33, 9}, true, false},
      {{4, 17, 33}, {9, 33}, false, true},
      {{2, 1, 7, 5}, {1, 3, 4, 7}, true, true},
      {{8, 12, 128, 64}, {8, 12, 64, 128}},
      {{8, 1, 128, 64}, {8, 12, 64, 128}},
      {{6, 5, 4, 3}, {1, 5, 3, 2}},
  };
  for (const PlanShape& s : shapes) {
    SCOPED_TRACE(absl::StrCat("[", absl::StrJoin(s.a, ","), "] @ [", absl::StrJoin(s.b, ","),
                              "] ta=", s.ta, " tb=", s.tb));
    int64_t m, n, k;
    std::vector<Triple> want = Expected(s.a, s.b, s.ta, s.tb, &m, &n, &k);
    backend::KernelSpec spec;
    spec.op = v1::OP_MATMUL;
    spec.attrs.mutable_matmul()->set_transpose_a(s.ta);
    spec.attrs.mutable_matmul()->set_transpose_b(s.tb);
    spec.inputs = {{v1::DTYPE_F32, s.a}, {v1::DTYPE_F32, s.b}};
    spec.outputs = {{v1::DTYPE_F32, {}}};
    absl::StatusOr<MatMulPlan> p = PlanMatMul(spec);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->K, k);
    EXPECT_EQ(p->N, n);
    std::vector<Triple> got;
    if (p->M != m) {
      // Folded: one product of batch * M rows, A contiguous, B shared.
      ASSERT_EQ(p->M % m, 0);
      ASSERT_EQ(p->calls.size(), 1u);
      ASSERT_EQ(p->count, 1);
      for (int64_t r = 0; r < p->M / m; ++r) got.push_back({r * m * k, 0, r * m * n});
    } else {
      for (const Triple& c : p->calls) {
        for (int64_t i = 0; i < p->count; ++i) {
          got.push_back({c[0] + i * p->a_stride, c[1] + i * p->b_stride, c[2] + i * m * n});
        }
      }
      if (p->count > 1) {
        EXPECT_NE(p->a_stride, 0) << "a 0-stride batch";
        EXPECT_NE(p->b_stride, 0) << "a 0-stride batch";
      }
    }
    std::sort(got.begin(), got.end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got, want);
  }
}

TEST(MatMulPlan, RefusesWhatDoesNotFit) {
  backend::KernelSpec spec;
  spec.op = v1::OP_MATMUL;
  spec.attrs.mutable_matmul();
  spec.outputs = {{v1::DTYPE_F32, {}}};
  spec.inputs = {{v1::DTYPE_F32, {3, 4}}, {v1::DTYPE_F32, {5, 6}}};
  EXPECT_EQ(PlanMatMul(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.inputs = {{v1::DTYPE_F32, {2, 3, 4}}, {v1::DTYPE_F32, {3, 4, 6}}};
  EXPECT_EQ(PlanMatMul(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.inputs = {{v1::DTYPE_F32, {3, 4}}};
  EXPECT_EQ(PlanMatMul(spec).status().code(), absl::StatusCode::kInvalidArgument);
  // 64 x 65 broadcast batches with the inner run broadcast: 4160 calls.
  spec.inputs = {{v1::DTYPE_F32, {64, 1, 2, 2}}, {v1::DTYPE_F32, {1, 65, 2, 2}}};
  EXPECT_EQ(PlanMatMul(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::cuda
