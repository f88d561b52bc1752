// OpCount (model/op_count.h): the leaf operators of a computation, forward and backward, by name; views counted
// apart; nothing counted once it stops.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "op_count.h"

using pathattn::model::OpCount;

TEST(OpCount, CountsLeafOperatorsOfForwardAndBackwardAndViewsApart) {
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto y = torch::randn({8, 3});
  OpCount count;
  auto z = torch::mm(x, y).transpose(0, 1);  // one mm, one view
  auto loss = (z * 2.0).sum();               // one mul, one sum
  loss.backward();                           // the backward's operators, on the autograd engine's thread
  count.stop();
  const auto ops = count.launching();
  EXPECT_EQ(ops.count("aten::mm"), 1u) << "mm of the forward, a leaf (its resolve_conj calls do not count)";
  EXPECT_GE(ops.at("aten::mm"), 2) << "the backward's x.grad = g y^T is an mm too";
  EXPECT_EQ(ops.count("aten::transpose"), 0u);
  EXPECT_GE(count.metadata_total(), 1) << "the transpose is a view";
  for (const auto& [name, n] : ops) {
    EXPECT_FALSE(pathattn::model::is_metadata_op(name)) << name;
    EXPECT_GT(n, 0) << name;
  }
  const int64_t total = count.launching_total();
  torch::mm(x, y);  // after stop(): not counted
  EXPECT_EQ(count.launching_total(), total);
  OpCount second;  // the first's counts stay readable
  torch::mm(x.detach(), y);
  second.stop();
  EXPECT_EQ(count.launching_total(), total);
  EXPECT_EQ(second.launching().at("aten::mm"), 1);
}

TEST(OpCount, AConversionCountsOnceAndANoOpToNotAtAll) {
  auto x = torch::randn({4, 8});
  OpCount count;
  auto same = x.to(torch::kFloat);   // already f32: returns x, launches nothing
  auto wider = x.to(torch::kDouble);  // a conversion: one copy
  count.stop();
  const auto ops = count.launching();
  EXPECT_EQ(ops.count("aten::to"), 0u);
  EXPECT_EQ(ops.at("aten::copy_"), 1);
  EXPECT_EQ(count.launching_total(), 1);
}

TEST(OpCount, OneAtATime) {
  OpCount first;
  EXPECT_THROW(OpCount second, std::logic_error);
}
