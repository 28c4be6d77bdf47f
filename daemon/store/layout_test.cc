#include "daemon/store/layout.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

v1::Layout L(v1::DType dtype, std::vector<int64_t> shape,
             std::vector<int64_t> strides = {}) {
  v1::Layout l;
  l.set_dtype(dtype);
  for (auto d : shape) l.add_shape(d);
  for (auto s : strides) l.add_strides_bytes(s);
  return l;
}

TEST(LayoutTest, ContiguousExtent) {
  EXPECT_EQ(*LayoutExtent(L(v1::DTYPE_FLOAT32, {64, 1024})), 64u * 1024 * 4);
  EXPECT_EQ(*LayoutExtent(L(v1::DTYPE_FLOAT64, {})), 8u);      // 0-d scalar.
  EXPECT_EQ(*LayoutExtent(L(v1::DTYPE_INT8, {3, 0, 5})), 0u);  // Empty.
}

TEST(LayoutTest, StridedExtentIsLastElementPlusOne) {
  // A transposed 3x4 float32 view of a 4x3 array.
  EXPECT_EQ(*LayoutExtent(L(v1::DTYPE_FLOAT32, {3, 4}, {4, 12})), 48u);
  // Every other element of 10.
  EXPECT_EQ(*LayoutExtent(L(v1::DTYPE_INT16, {5}, {4})), 18u);
  // Broadcast (stride 0).
  EXPECT_EQ(*LayoutExtent(L(v1::DTYPE_INT64, {1000}, {0})), 8u);
}

TEST(LayoutTest, RejectsBadLayoutsNamingTheValue) {
  struct Case {
    v1::Layout layout;
    std::string needle;
  } cases[] = {
      {L(static_cast<v1::DType>(99), {1}), "99"},
      {L(v1::DTYPE_FLOAT32, {4, -3}), "-3"},
      {L(v1::DTYPE_FLOAT32, {4, 4}, {4}), "rank 2"},
      {L(v1::DTYPE_FLOAT32, {4}, {-4}), "-4"},
      {L(v1::DTYPE_FLOAT32, {4}, {3}), "stride 3"},
      {L(v1::DTYPE_UINT8, {1LL << 40, 1LL << 40}), "overflow"},
      {L(v1::DTYPE_UNSPECIFIED, {4}), "dtype"},
      {L(v1::DTYPE_UINT8, std::vector<int64_t>(65, 1)), "65"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<uint64_t> r = LayoutExtent(c.layout);
    ASSERT_FALSE(r.ok()) << c.layout.DebugString();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << r.status();
  }
}

// [P23] What a client sends goes into a fixed ledger record: a layout is
// bounded where it arrives, whatever protobuf parsed into it.
TEST(LayoutTest, RefusesUnknownFieldsAndOversizeLayouts) {
  // The widest layout there is (rank 64, every value 10 bytes as a varint)
  // fits the ledger's record.
  v1::Layout widest = L(v1::DTYPE_UINT8, std::vector<int64_t>(kMaxRank, 1),
                        std::vector<int64_t>(kMaxRank, INT64_MAX));
  EXPECT_LE(widest.ByteSizeLong(), kMaxLayoutBytes);
  // A layout with a field this daemon does not know, of a few bytes and of
  // megabytes (protobuf keeps both in the parsed message).
  for (size_t junk : {size_t{4}, size_t{1800}, size_t{4} << 20}) {
    v1::Layout l = L(v1::DTYPE_FLOAT32, {4});
    std::string wire = l.SerializeAsString();
    // Field 99, length-delimited.
    wire += static_cast<char>((99 << 3 | 2) & 0x7f | 0x80);
    wire += static_cast<char>((99 << 3 | 2) >> 7);
    std::string len;
    for (size_t n = junk;; n >>= 7) {
      len += static_cast<char>((n & 0x7f) | (n >= 0x80 ? 0x80 : 0));
      if (n < 0x80) break;
    }
    wire += len + std::string(junk, 'x');
    v1::Layout parsed;
    ASSERT_TRUE(parsed.ParseFromString(wire));
    absl::StatusOr<uint64_t> r = RequestedBytes(0, parsed);
    ASSERT_FALSE(r.ok()) << junk;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string needle =
        junk < kMaxLayoutBytes ? "field 99" : absl::StrCat(kMaxLayoutBytes);
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << r.status();
    EXPECT_LT(r.status().message().size(), 256u);
  }
}

TEST(LayoutTest, RequestedBytesChecksSizeAgainstLayout) {
  EXPECT_EQ(*RequestedBytes(100, v1::Layout()), 100u);
  EXPECT_FALSE(RequestedBytes(0, v1::Layout()).ok());
  EXPECT_EQ(*RequestedBytes(0, L(v1::DTYPE_INT32, {10})), 40u);
  EXPECT_EQ(*RequestedBytes(64, L(v1::DTYPE_INT32, {10})), 64u);
  absl::StatusOr<uint64_t> r = RequestedBytes(16, L(v1::DTYPE_INT32, {10}));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("40"), std::string::npos);
}

}  // namespace
}  // namespace shmtensor::daemon
