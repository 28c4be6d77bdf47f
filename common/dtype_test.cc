// The C++ dtype table against the wire enum shmtensor.v1.DType: one row per
// proto value, same value, the name the proto spells, and nothing the proto
// lacks. Fails when a DType is added to one and not the other.
#include "shmtensor/dtype.h"

#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor {
namespace {

TEST(DTypeTable, HasOneRowPerProtoValueInValueOrder) {
  const google::protobuf::EnumDescriptor* e = v1::DType_descriptor();
  ASSERT_EQ(DTypesEnd() - DTypesBegin(), e->value_count());
  std::set<int> seen;
  for (int i = 0; i < e->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* v = e->value(i);
    SCOPED_TRACE(v->name());
    const DTypeInfo* info = FindDType(static_cast<DType>(v->number()));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(static_cast<int>(info->dtype), v->number());
    EXPECT_EQ(info, DTypesBegin() + v->number());
    const std::string expected =
        v->number() == 0
            ? "bytes"
            : absl::AsciiStrToLower(absl::StripPrefix(v->name(), "DTYPE_"));
    EXPECT_EQ(info->name, expected);
    seen.insert(v->number());
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kMaxDTypeValue + 1);
  EXPECT_EQ(FindDType(static_cast<DType>(kMaxDTypeValue + 1)), nullptr);
  EXPECT_EQ(FindDType(static_cast<DType>(-1)), nullptr);
  EXPECT_EQ(ItemSize(static_cast<DType>(99)), 0);
  EXPECT_STREQ(DTypeName(static_cast<DType>(99)), "invalid");
}

TEST(DTypeTable, SpellingsAgreeWithTheItemSize) {
  for (const DTypeInfo* d = DTypesBegin(); d != DTypesEnd(); ++d) {
    SCOPED_TRACE(d->name);
    ASSERT_GT(d->item_size, 0);
    // NumPy and the buffer protocol name the same types.
    EXPECT_EQ(d->numpy == nullptr, d->buffer == nullptr);
    if (d->numpy == nullptr) continue;
    // "<f4", "u1": the digits are the item size ("?", bool: one byte).
    std::string digits;
    for (const char* c = d->numpy; *c != 0; ++c) {
      if (absl::ascii_isdigit(*c)) digits += *c;
    }
    int64_t n = 1;
    if (!digits.empty()) {
      ASSERT_TRUE(absl::SimpleAtoi(digits, &n));
    }
    EXPECT_EQ(n, d->item_size);
    // Multi-byte types say little-endian explicitly.
    EXPECT_EQ(d->numpy[0] == '<', d->item_size > 1);
    EXPECT_EQ(d->kind == 'c', absl::StartsWith(d->buffer, "Z"));
  }
}

}  // namespace
}  // namespace shmtensor
