// Tests of Status, StatusOr and their macros (src/common/status.cc).
#include <gtest/gtest.h>

#include <cerrno>

#include "loongforge/status.h"

namespace loongforge {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  LF_ASSIGN_OR_RETURN(int h, Half(x));
  LF_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

// Guards the macros: an error deep in a chain arrives unchanged at the top.
TEST(Status, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
  EXPECT_EQ(s.WithContext("file a.jpg").ToString(), "InvalidArgument: file a.jpg: odd: 3");
}

TEST(Status, ErrnoMapping) {
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open x").code(), StatusCode::kNotFound);
  EXPECT_NE(ErrnoToStatus(ENOENT, "open x").message().find("open x"), std::string::npos);
}

}  // namespace
}  // namespace loongforge
