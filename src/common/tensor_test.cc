// Tests of the one tensor boundary: DType tables and TensorView validation
// (include/loongforge/tensor.h).
#include "loongforge/tensor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loongforge {
namespace {

const DType kAll[] = {DType::kBool,    DType::kUInt8,  DType::kInt8,    DType::kInt16,
                      DType::kInt32,   DType::kInt64,  DType::kFloat16, DType::kBFloat16,
                      DType::kFloat32, DType::kFloat64};

// Guards the checkpoint manifest format: the short names and sizes are stored on disk and must
// never change.
TEST(DType, NamesAndSizesAreStable) {
  const char* names[] = {"bool", "u8", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64"};
  const int sizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  for (int i = 0; i < 10; ++i) {
    EXPECT_STREQ(DTypeName(kAll[i]), names[i]);
    EXPECT_EQ(DTypeSize(kAll[i]), sizes[i]) << names[i];
  }
}

// Guards parsing: every short name round-trips, torch's long names are accepted, and an unknown
// name is InvalidArgument that names it.
TEST(DType, ParsesShortAndLongNames) {
  for (DType d : kAll) {
    StatusOr<DType> p = ParseDType(DTypeName(d));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, d);
  }
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("float32"), DType::kFloat32);
  EXPECT_EQ(*ParseDType("uint8"), DType::kUInt8);
  StatusOr<DType> bad = ParseDType("complex64");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'complex64'"), std::string::npos);
}

// Guards numel/nbytes, including 0-d (one element) and empty tensors.
TEST(TensorView, CountsElementsAndBytes) {
  float x = 0;
  EXPECT_EQ(TensorView::Contiguous(&x, DType::kFloat32, {}).numel(), 1);
  EXPECT_EQ(TensorView::Contiguous(&x, DType::kBFloat16, {2, 3, 4}).nbytes(), 48);
  EXPECT_EQ(TensorView::Contiguous(static_cast<void*>(nullptr), DType::kFloat64, {5, 0}).numel(),
            0);
}

// Guards the contiguity rule (torch's): size-1 dimensions may have any stride, empty tensors are
// contiguous, a transposed or sliced view is not.
TEST(TensorView, ContiguityFollowsTorchsRule) {
  float buf[64] = {};
  TensorView v = TensorView::Contiguous(buf, DType::kFloat32, {4, 8});
  EXPECT_TRUE(v.IsContiguous());
  v.strides = {8, 1};
  EXPECT_TRUE(v.IsContiguous());
  v.strides = {1, 4};  // a transpose
  EXPECT_FALSE(v.IsContiguous());
  v.strides = {16, 1};  // every other row
  EXPECT_FALSE(v.IsContiguous());
  v.shape = {1, 8};
  v.strides = {999, 1};  // size-1 dimension: its stride does not matter
  EXPECT_TRUE(v.IsContiguous());
  v.shape = {0, 8};
  v.strides = {1, 7};
  EXPECT_TRUE(v.IsContiguous());
}

// Guards the validation helpers: each names the tensor and says what is wrong, as InvalidArgument.
TEST(TensorView, ChecksNameTheTensor) {
  float buf[8] = {};
  TensorView v = TensorView::Contiguous(buf, DType::kFloat32, {2, 4});
  EXPECT_TRUE(v.CheckValid("w").ok());
  EXPECT_TRUE(v.CheckDType("w", {DType::kBFloat16, DType::kFloat32}).ok());
  EXPECT_TRUE(v.CheckDevice("w", Device{}).ok());
  EXPECT_TRUE(v.CheckNumel("w", 8).ok());
  EXPECT_TRUE(v.CheckWritable("w").ok());
  auto msg = [](const Status& s) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    return s.message();
  };
  EXPECT_EQ(msg(v.CheckDType("model/w", DType::kInt32)),
            "tensor 'model/w' has dtype f32; expected i32");
  EXPECT_EQ(msg(v.CheckDType("w", {DType::kFloat16, DType::kBFloat16})),
            "tensor 'w' has dtype f32; expected f16 or bf16");
  EXPECT_EQ(msg(v.CheckDevice("w", Device{DeviceType::kCUDA, 2})),
            "tensor 'w' is on cpu; expected cuda:2");
  EXPECT_EQ(msg(v.CheckNumel("w", 9)), "tensor 'w' has 8 elements (shape [2, 4]); expected 9");
  TensorView t = v;
  t.strides = {1, 2};
  EXPECT_EQ(msg(t.CheckContiguous("w")),
            "tensor 'w' is not contiguous (shape [2, 4], strides [1, 2]); make it contiguous "
            "first");
  t.read_only = true;
  EXPECT_NE(msg(t.CheckWritable("w")).find("tensor 'w' is read-only"), std::string::npos);
  EXPECT_NE(
      msg(TensorView::Contiguous(static_cast<void*>(nullptr), DType::kFloat32, {3}).CheckValid("w"))
          .find("tensor 'w' has no data pointer"),
      std::string::npos);
  EXPECT_NE(msg(TensorView::Contiguous(buf, DType::kFloat32, {-1}).CheckValid("w"))
                .find("negative dimension"),
            std::string::npos);
  t.strides = {1};
  EXPECT_NE(msg(t.CheckValid("w")).find("1 strides for 2 dimensions"), std::string::npos);
}

// Guards Device: host memory kinds are host, CUDA devices compare by index, names are readable.
TEST(TensorView, DeviceKinds) {
  EXPECT_TRUE((Device{DeviceType::kCUDAHost, 0}).is_host());
  EXPECT_FALSE((Device{DeviceType::kCUDA, 0}).is_host());
  EXPECT_NE((Device{DeviceType::kCUDA, 0}), (Device{DeviceType::kCUDA, 1}));
  EXPECT_EQ((Device{DeviceType::kCUDA, 3}).ToString(), "cuda:3");
  EXPECT_EQ((Device{DeviceType::kCUDAHost, 0}).ToString(), "cuda_host");
}

}  // namespace
}  // namespace loongforge
