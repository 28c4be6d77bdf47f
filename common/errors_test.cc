// The C++ table of error reasons against the wire enum
// shmtensor.v1.ErrorReason: one row per proto value, same value, the name
// the proto spells, and nothing the proto lacks. Fails when a reason is
// added to one and not the other.
#include "shmtensor/errors.h"

#include <set>

#include "gtest/gtest.h"
#include "shmtensor/v1/shmtensor.pb.h"

namespace shmtensor {
namespace {

TEST(ErrorReasonTable, HasOneRowPerProtoValueInValueOrder) {
  const google::protobuf::EnumDescriptor* e = v1::ErrorReason_descriptor();
  ASSERT_EQ(ErrorReasonsEnd() - ErrorReasonsBegin(), e->value_count());
  std::set<int> seen;
  for (int i = 0; i < e->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* v = e->value(i);
    SCOPED_TRACE(v->name());
    const ErrorReasonInfo* info =
        FindErrorReason(static_cast<ErrorReason>(v->number()));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(static_cast<int>(info->reason), v->number());
    EXPECT_EQ(info, ErrorReasonsBegin() + v->number());
    EXPECT_EQ(info->name, v->name());
    seen.insert(v->number());
  }
  EXPECT_EQ(static_cast<int>(seen.size()), kMaxErrorReasonValue + 1);
  EXPECT_EQ(FindErrorReason(static_cast<ErrorReason>(kMaxErrorReasonValue + 1)),
            nullptr);
  EXPECT_EQ(FindErrorReason(static_cast<ErrorReason>(-1)), nullptr);
}

// Each predicate answers the reason the table names for it, and only it.
TEST(ErrorReasonTable, EachPredicateAnswersItsRowOnly) {
  struct Predicate {
    ErrorReason reason;
    bool (*is)(const absl::Status&);
  };
  const Predicate predicates[] = {
      {ErrorReason::kStaleReference, IsStaleReference},
      {ErrorReason::kSessionEnded, IsSessionEnded},
      {ErrorReason::kAlreadyTaken, IsAlreadyTaken},
      {ErrorReason::kLargerThanPool, IsLargerThanPool},
      {ErrorReason::kLimitExceeded, IsLimitExceeded},
  };
  for (const ErrorReasonInfo* r = ErrorReasonsBegin(); r != ErrorReasonsEnd();
       ++r) {
    SCOPED_TRACE(r->name);
    const absl::Status s = WithReason(absl::InternalError("x"), r->name);
    EXPECT_EQ(ErrorReasonOf(s), r->name);
    for (const Predicate& p : predicates) {
      EXPECT_EQ(p.is(s), p.reason == r->reason);
    }
  }
}

}  // namespace
}  // namespace shmtensor
