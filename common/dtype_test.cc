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

// Every spelling the table gives a dtype parses back to it.
TEST(ParseDType, ReadsEveryRowsNamesAndTypeStrings) {
  for (const DTypeInfo* d = DTypesBegin(); d != DTypesEnd(); ++d) {
    if (d->dtype == DType::kUnspecified) continue;
    SCOPED_TRACE(d->name);
    EXPECT_EQ(ParseDType(d->name).value(), d->dtype);
    if (d->numpy != nullptr) {
      EXPECT_EQ(ParseDType(d->numpy).value(), d->dtype);
      EXPECT_EQ(DTypeOfTypestr(d->numpy, "x").value(), d->dtype);
    }
    if (d->torch) {
      EXPECT_EQ(ParseDType(std::string("torch.") + d->name).value(), d->dtype);
    }
  }
}

// What NumPy and torch mean by these, and nothing else.
TEST(ParseDType, MeansWhatNumPyAndTorchMean) {
  EXPECT_EQ(ParseDType("<f4").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("=f8").value(), DType::kFloat64);
  EXPECT_EQ(ParseDType("|u1").value(), DType::kUInt8);
  EXPECT_EQ(ParseDType(">u1").value(), DType::kUInt8);  // One byte: no order.
  EXPECT_EQ(ParseDType("b1").value(), DType::kBool);
  EXPECT_EQ(ParseDType("?").value(), DType::kBool);
  EXPECT_EQ(ParseDType("c16").value(), DType::kComplex128);
  // torch.float is float32 (NumPy's "float" is float64: not the table's).
  EXPECT_EQ(ParseDType("torch.float").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("torch.double").value(), DType::kFloat64);
  EXPECT_EQ(ParseDType("torch.half").value(), DType::kFloat16);
  EXPECT_EQ(ParseDType("torch.long").value(), DType::kInt64);
  EXPECT_EQ(ParseDType("torch.int").value(), DType::kInt32);
  EXPECT_EQ(ParseDType("torch.short").value(), DType::kInt16);
  EXPECT_EQ(ParseDType("torch.cfloat").value(), DType::kComplex64);
  EXPECT_EQ(ParseDType("torch.cdouble").value(), DType::kComplex128);
  // NumPy's own spellings are the binding's to read.
  for (const char* numpy_only : {"float", "int", "d", "f", "b", "double",
                                 "float7", "", "bytes", "torch"}) {
    SCOPED_TRACE(numpy_only);
    EXPECT_EQ(ParseDType(numpy_only).status().code(),
              absl::StatusCode::kNotFound);
  }
}

TEST(ParseDType, RefusesBigEndianSayingHowToConvert) {
  for (const char* text : {">i4", ">f8", ">c8"}) {
    SCOPED_TRACE(text);
    absl::Status s = ParseDType(text).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), text)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "big-endian")) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "newbyteorder('<')")) << s;
  }
}

TEST(ParseDType, RefusesTypesItDoesNotStoreNamingThem) {
  // Type strings NumPy has and shmtensor does not store.
  for (const char* text : {"f16", "<f16", "c32", "i16", "u3"}) {
    SCOPED_TRACE(text);
    absl::Status s = ParseDType(text).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), text)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(), "no shmtensor equivalent"));
  }
  // torch's types the table lacks, or has for NumPy only.
  for (const char* text : {"torch.complex32", "torch.uint16", "torch.nope",
                           "torch.", "torch.bytes"}) {
    SCOPED_TRACE(text);
    absl::Status s = ParseDType(text).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), text)) << s;
    EXPECT_TRUE(absl::StrContains(s.message(),
                                  "supported torch dtypes: "
                                  "bfloat16, bool, complex128"))
        << s;
  }
  // NumPy's type strings of what no table kind is, named as the binding
  // shows them.
  for (const char* typestr : {"|V8", "<U1", "|O", "<M8[ns]", "|S3", ""}) {
    SCOPED_TRACE(typestr);
    absl::Status s = DTypeOfTypestr(typestr, "shown").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.message(), "dtype shown has no"));
  }
  EXPECT_EQ(DTypeOfTypestr("|b1", "bool").value(), DType::kBool);
}

}  // namespace
}  // namespace shmtensor
