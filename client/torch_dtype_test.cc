#include "client/torch_dtype.h"

#include <set>

#include "gtest/gtest.h"

namespace shmtensor::internal {
namespace {

TEST(TorchDTypeTest, EveryRowOfTheTableMapsToTheSameTorchType) {
  std::set<at::ScalarType> seen;
  int mapped = 0;
  for (const DTypeInfo* d = DTypesBegin(); d != DTypesEnd(); ++d) {
    const std::optional<at::ScalarType> t = ScalarTypeOf(d->dtype);
    if (d->dtype == DType::kUnspecified) {
      EXPECT_FALSE(t.has_value()) << "raw bytes have no torch type";
      continue;
    }
    ASSERT_EQ(t.has_value(), d->torch) << d->name;
    if (!t) continue;
    ++mapped;
    EXPECT_TRUE(seen.insert(*t).second) << d->name << ": mapped twice";
    EXPECT_EQ(static_cast<int64_t>(c10::elementSize(*t)), d->item_size)
        << d->name;
    switch (d->kind) {
      case 'b':
        EXPECT_EQ(*t, at::kBool) << d->name;
        break;
      case 'u':
      case 'i':
        EXPECT_TRUE(c10::isIntegralType(*t, /*includeBool=*/false)) << d->name;
        EXPECT_EQ(c10::isSignedType(*t), d->kind == 'i') << d->name;
        break;
      case 'f':
        EXPECT_TRUE(c10::isFloatingType(*t)) << d->name;
        EXPECT_NE(*t, at::kBFloat16) << d->name;
        break;
      case 'B':
        EXPECT_EQ(*t, at::kBFloat16) << d->name;
        break;
      case 'c':
        EXPECT_TRUE(c10::isComplexType(*t)) << d->name;
        break;
      default:
        ADD_FAILURE() << d->name << ": unknown kind " << d->kind;
    }
  }
  EXPECT_EQ(mapped, 12);  // Every torch type of the proto's DType.
  EXPECT_FALSE(ScalarTypeOf(static_cast<DType>(kMaxDTypeValue + 1)));
}

}  // namespace
}  // namespace shmtensor::internal
