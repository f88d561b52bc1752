// common/head_slices.h: cutting a call into groups of kv heads, which the CUDA backend does to keep its scratch
// under Inputs::cuda_workspace_limit. The views are checked where it matters, by running the CPU backend over the
// slices of a problem and comparing with one call over all heads, bit for bit (every head is computed on its own):
// GQA, the gate, varlen with a length-1 sequence, dlse, permuted (non-contiguous) inputs.
#include <gtest/gtest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common/head_slices.h"
#include "harness.h"

namespace pathattn::test {
namespace {

TEST(HeadSlices, CoverEveryHeadOnce) {
  const std::vector<HeadSlice> s = head_slices(5, 2);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].h0, 0);
  EXPECT_EQ(s[0].n, 2);
  EXPECT_EQ(s[1].h0, 2);
  EXPECT_EQ(s[2].h0, 4);
  EXPECT_EQ(s[2].n, 1);
  EXPECT_EQ(head_slices(4, 4).size(), 1u);
  EXPECT_EQ(head_slices(4, 9).size(), 1u);
  EXPECT_EQ(head_slices(4, 9)[0].n, 4);
  EXPECT_THROW(head_slices(4, 0), Error);
}

TEST(HeadSlices, MostHeadsWithinTheLimit) {
  const auto bytes = [](int64_t n) { return static_cast<std::size_t>(100 + 10 * n); };
  EXPECT_EQ(heads_per_slice(32, 0, bytes), 32);      // no limit
  EXPECT_EQ(heads_per_slice(32, 420, bytes), 32);    // all fit exactly
  EXPECT_EQ(heads_per_slice(32, 50, bytes), 1);      // not even one: one at a time
  EXPECT_EQ(heads_per_slice(1, 50, bytes), 1);
  for (std::size_t limit = 1; limit < 500; ++limit) {  // the largest n that fits, as a linear search finds it
    int64_t want = 1;
    for (int64_t n = 1; n <= 32; ++n)
      if (bytes(n) <= limit) want = n;
    EXPECT_EQ(heads_per_slice(32, limit, bytes), want) << "limit " << limit;
  }
}

TEST(HeadSlices, ViewOfHeads) {
  std::vector<float> mem(2 * 3 * 4 * 5);
  TensorView t = make_view(mem.data(), DType::f32, {2, 3, 4, 5});
  const TensorView s = slice_heads(t, 1, 2);
  EXPECT_EQ(s.data, static_cast<void*>(mem.data() + 5));
  EXPECT_EQ(s.sizes[2], 2);
  EXPECT_EQ(s.sizes[1], 3);
  for (int d = 0; d < 4; ++d) EXPECT_EQ(s.strides[d], t.strides[d]);
  EXPECT_FALSE(slice_heads(TensorView{}, 1, 2).defined());
}

// The CPU backend over slices of `per_slice` kv heads against one call, bit for bit.
void expect_slices_equal(const Spec& spec, int64_t per_slice) {
  const Problem64 P = rounded_to_f32(spec);
  Case<float> whole(P), parts(P);
  whole.forward(Backend::cpu);
  whole.backward_with_lse(Backend::cpu);

  const int64_t G = spec.HQ / spec.H;
  for (const HeadSlice& s : head_slices(spec.H, per_slice)) {
    const Inputs in = slice_inputs(parts.in, s, G);
    pathattn::forward(in, slice_outputs(parts.fwd_outputs(true), s, G), Backend::cpu);
    const HeadSlice qs = query_heads(s, G);
    pathattn::backward(in, slice_heads(parts.o.view, qs), slice_heads(parts.lse.view, qs),
                       slice_heads(parts.dout.view, qs), slice_heads(parts.dlse.view, qs),
                       slice_gradients(parts.grads(), s, G), Backend::cpu);
  }
  EXPECT_TRUE(parts.guards_intact());
  std::vector<std::pair<const char*, Buffer<float> Case<float>::*>> outputs = {
      {"o", &Case<float>::o},   {"lse", &Case<float>::lse}, {"kcache", &Case<float>::kcache},
      {"dq", &Case<float>::dq}, {"dk", &Case<float>::dk},   {"dv", &Case<float>::dv},
      {"dw", &Case<float>::dw}, {"dbeta", &Case<float>::dbeta}};
  if (spec.gate) outputs.push_back({"dg", &Case<float>::dg});
  for (const auto& [name, member] : outputs) {
    const std::vector<double> x = (whole.*member).to_vector(), y = (parts.*member).to_vector();
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)), 0) << name << " differs";
  }
}

TEST(HeadSlices, CpuSlicesEqualOneCall) {
  Spec gqa{.B = 2, .T = 37, .H = 3, .HQ = 6, .D = 16, .DV = 8};
  gqa.gate = true;
  for (int64_t per : {1, 2}) expect_slices_equal(gqa, per);
  Spec varlen{.B = 1, .T = 0, .H = 4, .HQ = 4, .D = 8, .DV = 8};
  varlen.seqlens = {5, 1, 30};
  varlen.T = 36;
  varlen.permuted = true;
  for (int64_t per : {1, 3}) expect_slices_equal(varlen, per);
}

}  // namespace
}  // namespace pathattn::test
