// Every bad request gets a precise status, the daemon stays up and nothing
// stored is harmed. Requests are sent with the raw gRPC stub, as a client in
// another language (or a buggy one) would.
#include <grpcpp/grpcpp.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/release_protocol.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "tests/test_util.h"

namespace shmtensor {
namespace {

class BadInputTest : public testing::DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    channel_ = grpc::CreateChannel(daemon_->address(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::ObjectStore::NewStub(channel_);
    session_id_ = OpenSession(session_ctx_, session_);
    other_id_ = OpenSession(other_ctx_, other_);
    // Something stored that no bad request may harm.
    absl::StatusOr<Buffer> buf =
        client_->Create({.size_bytes = 1 << 20, .name = "precious"});
    ASSERT_TRUE(buf.ok());
    std::memset(buf->data(), 0x5a, 1 << 20);
    precious_ = *buf->Seal();
  }
  void TearDown() override {
    // The daemon is up and the stored object is intact.
    absl::StatusOr<View> v = client_->Get("precious");
    ASSERT_TRUE(v.ok()) << v.status();
    const auto* p = static_cast<const uint8_t*>(v->data());
    for (int i = 0; i < (1 << 20); ++i) ASSERT_EQ(p[i], 0x5a) << i;
    for (auto* s : {&session_, &other_}) {
      if (*s) {
        (*s)->WritesDone();
        (*s)->Finish();
      }
    }
  }

  using Stream = std::unique_ptr<
      grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>>;
  uint64_t OpenSession(grpc::ClientContext& ctx, Stream& stream) {
    stream = stub_->Session(&ctx);
    v1::SessionRequest open;
    open.mutable_open()->set_client_name("raw");
    EXPECT_TRUE(stream->Write(open));
    v1::SessionEvent ev;
    EXPECT_TRUE(stream->Read(&ev));
    return ev.opened().session_id();
  }

  // Calls `method` and expects `code` with `needle` in the message.
  template <typename Req, typename Resp>
  void Expect(grpc::Status (v1::ObjectStore::Stub::*method)(
                  grpc::ClientContext*, const Req&, Resp*),
              const Req& req, grpc::StatusCode code, const std::string& needle,
              std::string* reason = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    Resp resp;
    grpc::Status st = (stub_.get()->*method)(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), code)
        << req.ShortDebugString() << " -> " << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), needle))
        << "'" << st.error_message() << "' lacks '" << needle << "'";
    if (reason != nullptr) {
      auto it = ctx.GetServerTrailingMetadata().find("shmtensor-error-reason");
      *reason = it == ctx.GetServerTrailingMetadata().end()
                    ? ""
                    : std::string(it->second.data(), it->second.size());
    }
  }

  v1::CreateRequest CreateReq(uint64_t size) {
    v1::CreateRequest r;
    r.set_session_id(session_id_);
    r.set_size_bytes(size);
    return r;
  }
  v1::CreateResponse CreateOk(uint64_t session, uint64_t size) {
    v1::CreateRequest r = CreateReq(size);
    r.set_session_id(session);
    grpc::ClientContext ctx;
    v1::CreateResponse resp;
    EXPECT_TRUE(stub_->Create(&ctx, r, &resp).ok());
    return resp;
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ObjectStore::Stub> stub_;
  grpc::ClientContext session_ctx_, other_ctx_;
  Stream session_, other_;
  uint64_t session_id_ = 0, other_id_ = 0;
  SealedRef precious_;
};

using Stub = v1::ObjectStore::Stub;
constexpr auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;

TEST_F(BadInputTest, ZeroAndAbsurdSizes) {
  Expect(&Stub::Create, CreateReq(0), kInvalid, "size_bytes 0");
  Expect(&Stub::Create, CreateReq(1ull << 50), kInvalid, "1125899906842624");
  Expect(&Stub::Create, CreateReq(~0ull), kInvalid, "18446744073709551615");
}

TEST_F(BadInputTest, BadShapesDtypesAndStrides) {
  v1::CreateRequest r = CreateReq(0);
  r.mutable_layout()->set_dtype(v1::DTYPE_FLOAT32);
  r.mutable_layout()->add_shape(4);
  r.mutable_layout()->add_shape(-5);
  Expect(&Stub::Create, r, kInvalid, "negative dimension -5 at axis 1");

  r.mutable_layout()->clear_shape();
  r.mutable_layout()->add_shape(1ll << 62);
  r.mutable_layout()->add_shape(1ll << 62);
  Expect(&Stub::Create, r, kInvalid, "overflows");

  r.mutable_layout()->clear_shape();
  r.mutable_layout()->set_dtype(static_cast<v1::DType>(77));
  Expect(&Stub::Create, r, kInvalid, "unknown dtype 77");

  r = CreateReq(64);  // 64 bytes cannot hold a 4x4 float32 with these strides.
  r.mutable_layout()->set_dtype(v1::DTYPE_FLOAT32);
  r.mutable_layout()->add_shape(4);
  r.mutable_layout()->add_shape(4);
  r.mutable_layout()->add_strides_bytes(64);
  r.mutable_layout()->add_strides_bytes(4);
  Expect(&Stub::Create, r, kInvalid,
         "layout spans 208 bytes but size_bytes is 64");

  r.mutable_layout()->set_strides_bytes(0, -16);
  Expect(&Stub::Create, r, kInvalid, "stride -16 bytes at axis 0");
}

TEST_F(BadInputTest, BadNamesAndPools) {
  v1::CreateRequest r = CreateReq(4096);
  r.set_name(std::string(300, 'x'));
  Expect(&Stub::Create, r, kInvalid, "300 bytes");
  r.set_name(std::string("a\0b", 3));
  Expect(&Stub::Create, r, kInvalid, "NUL");
  r.set_name("precious");
  Expect(&Stub::Create, r, grpc::StatusCode::ALREADY_EXISTS, "'precious'");
  r.set_name("");
  r.set_pool("gpu9");
  Expect(&Stub::Create, r, grpc::StatusCode::NOT_FOUND, "'gpu9'");

  v1::GetRequest g;
  g.set_session_id(session_id_);
  g.set_name("");
  Expect(&Stub::Get, g, kInvalid, "name is empty");
  v1::DeleteRequest d;
  d.set_session_id(session_id_);
  d.set_name("nobody");
  Expect(&Stub::Delete, d, grpc::StatusCode::NOT_FOUND, "'nobody'");
}

TEST_F(BadInputTest, UnknownSession) {
  v1::CreateRequest r = CreateReq(4096);
  r.set_session_id(0x1234);
  std::string reason;
  Expect(&Stub::Create, r, grpc::StatusCode::FAILED_PRECONDITION,
         "session 0000000000001234 is not open", &reason);
  EXPECT_EQ(reason, "ERROR_REASON_SESSION_ENDED");
}

TEST_F(BadInputTest, ForgedAndStaleRefs) {
  v1::GetRequest g;
  g.set_session_id(session_id_);
  Expect(&Stub::Get, g, kInvalid, "neither a ref nor a name");

  v1::ObjectRef forged;
  forged.set_daemon_epoch(precious_.ref().daemon_epoch);
  forged.set_slot(999999);
  forged.set_generation(1);
  *g.mutable_ref() = forged;
  Expect(&Stub::Get, g, kInvalid, "slot 999999");

  forged.set_slot(precious_.ref().slot);
  forged.set_generation(precious_.ref().generation + 100);
  *g.mutable_ref() = forged;
  Expect(&Stub::Get, g, kInvalid, "never issued");

  forged.set_generation(precious_.ref().generation);
  forged.set_daemon_epoch(precious_.ref().daemon_epoch ^ 1);
  *g.mutable_ref() = forged;
  std::string reason;
  Expect(&Stub::Get, g, grpc::StatusCode::NOT_FOUND, "another daemon instance",
         &reason);
  EXPECT_EQ(reason, "ERROR_REASON_STALE_REFERENCE");

  // A ref whose object is gone.
  v1::CreateResponse c = CreateOk(session_id_, 4096);
  v1::ReleaseRequest rel;
  rel.set_session_id(session_id_);
  rel.set_lease_id(c.lease_id());
  grpc::ClientContext ctx;
  v1::ReleaseResponse rr;
  ASSERT_TRUE(stub_->Release(&ctx, rel, &rr).ok());
  EXPECT_TRUE(rr.freed());
  *g.mutable_ref() = c.ref();
  Expect(&Stub::Get, g, grpc::StatusCode::NOT_FOUND, "stale reference",
         &reason);
  EXPECT_EQ(reason, "ERROR_REASON_STALE_REFERENCE");
}

TEST_F(BadInputTest, BufferCopiesOutsideTheBufferAreRefused) {
  absl::StatusOr<Buffer> buf = client_->Create({.size_bytes = 1000});
  ASSERT_TRUE(buf.ok()) << buf.status();
  const std::vector<uint8_t> src(2000, 1);
  absl::Status s = buf->CopyFrom(src.data(), 1001);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1001 bytes at offset 0")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1000 bytes")) << s;
  // offset + size wraps around 2^64: still refused, not a wild copy.
  s = buf->CopyFrom(src.data(), 2, ~uint64_t{0});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  s = buf->CopyFrom(nullptr, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(buf->CopyFrom(nullptr, 0, 1000).ok());  // Nothing to copy.
  // What fits goes where it was asked to.
  const std::vector<uint8_t> twos(500, 2);
  ASSERT_TRUE(buf->CopyFrom(twos.data(), 500).ok());
  ASSERT_TRUE(buf->CopyFrom(src.data(), 500, 500).ok());
  absl::StatusOr<SealedRef> ref = buf->Seal();
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<View> v = client_->Get(ref->ref());
  ASSERT_TRUE(v.ok()) << v.status();
  const auto* p = static_cast<const uint8_t*>(v->data());
  EXPECT_EQ(p[0], 2);
  EXPECT_EQ(p[499], 2);
  EXPECT_EQ(p[500], 1);
  EXPECT_EQ(p[999], 1);
  // A sealed buffer takes no more bytes.
  s = buf->CopyFrom(src.data(), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  s = buf->Fill([](absl::Span<uint8_t>) { ADD_FAILURE() << "called"; });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_F(BadInputTest, LeaseMisuse) {
  v1::CreateResponse c = CreateOk(session_id_, 4096);
  v1::ReleaseRequest rel;
  rel.set_session_id(other_id_);
  rel.set_lease_id(c.lease_id());
  Expect(&Stub::Release, rel, grpc::StatusCode::PERMISSION_DENIED,
         "belongs to another session");
  v1::SealRequest seal;
  seal.set_session_id(other_id_);
  seal.set_lease_id(c.lease_id());
  Expect(&Stub::Seal, seal, grpc::StatusCode::PERMISSION_DENIED,
         "belongs to another session");

  seal.set_session_id(session_id_);
  {
    grpc::ClientContext ctx;
    v1::SealResponse sr;
    ASSERT_TRUE(stub_->Seal(&ctx, seal, &sr).ok());
  }
  Expect(&Stub::Seal, seal, grpc::StatusCode::FAILED_PRECONDITION,
         "already sealed");
  rel.set_session_id(session_id_);
  {
    grpc::ClientContext ctx;
    v1::ReleaseResponse rr;
    ASSERT_TRUE(stub_->Release(&ctx, rel, &rr).ok());
  }
  Expect(&Stub::Release, rel, grpc::StatusCode::FAILED_PRECONDITION,
         "already released");
  rel.set_lease_id(1ull << 60);
  Expect(&Stub::Release, rel, grpc::StatusCode::NOT_FOUND, "never issued");
}

TEST_F(BadInputTest, SessionStreamProtocolViolations) {
  grpc::ClientContext ctx;
  auto stream = stub_->Session(&ctx);
  v1::SessionRequest empty;  // Not an OpenSession.
  ASSERT_TRUE(stream->Write(empty));
  v1::SessionEvent ev;
  EXPECT_FALSE(stream->Read(&ev));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), kInvalid);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "must be open"));

  grpc::ClientContext ctx2;
  auto twice = stub_->Session(&ctx2);
  v1::SessionRequest open;
  open.mutable_open()->set_client_name("twice");
  ASSERT_TRUE(twice->Write(open));
  ASSERT_TRUE(twice->Read(&ev));
  twice->Write(open);
  EXPECT_FALSE(twice->Read(&ev));
  st = twice->Finish();
  EXPECT_EQ(st.error_code(), kInvalid);
  EXPECT_TRUE(absl::StrContains(st.error_message(), "one OpenSession"));
}

TEST_F(BadInputTest, StreamReleasesOfOthersAreSkippedAndOutOfOrderEndsSession) {
  // Another session's lease, released on this session's stream: skipped, the
  // object stays, and the session goes on.
  v1::CreateResponse theirs = CreateOk(other_id_, 4096);
  v1::SessionRequest rel;
  rel.mutable_release()->set_seq(1);
  rel.mutable_release()->add_lease_ids(theirs.lease_id());
  ASSERT_TRUE(session_->Write(rel));
  v1::StatsRequest stats;
  stats.set_session_id(session_id_);
  stats.set_releases_through(1);  // Served only after seq 1 was applied.
  {
    grpc::ClientContext ctx;
    v1::StatsResponse resp;
    ASSERT_TRUE(stub_->Stats(&ctx, stats, &resp).ok());
    EXPECT_EQ(resp.sessions(), 3u);  // client_, session_ and other_: all up.
  }
  v1::SealRequest seal;
  seal.set_session_id(other_id_);
  seal.set_lease_id(theirs.lease_id());
  {
    grpc::ClientContext ctx;
    v1::SealResponse sr;
    EXPECT_TRUE(stub_->Seal(&ctx, seal, &sr).ok());  // Their lease is intact.
  }
  // A seq that skips one: the daemon cannot order releases any more, so it
  // ends the session with INVALID_ARGUMENT naming both seqs.
  rel.mutable_release()->set_seq(5);
  ASSERT_TRUE(session_->Write(rel));
  v1::SessionEvent ev;
  EXPECT_FALSE(session_->Read(&ev));
  grpc::Status st = session_->Finish();
  session_.reset();
  EXPECT_EQ(st.error_code(), kInvalid);
  EXPECT_TRUE(
      absl::StrContains(st.error_message(), "seq 5 out of order: expected 2"))
      << st.error_message();
}

TEST_F(BadInputTest, CarriedReleaseCopiesApplyAheadOfTheirStreamMessages) {
  v1::CreateResponse a = CreateOk(session_id_, 4096);
  v1::CreateResponse b = CreateOk(session_id_, 4096);
  v1::CreateResponse c = CreateOk(session_id_, 4096);
  auto stats = [&](const v1::StatsRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    v1::StatsResponse resp;
    grpc::Status st = stub_->Stats(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  };
  v1::StatsRequest plain;
  plain.set_session_id(session_id_);
  const uint64_t leases = stats(plain).leases();
  // Seq 1 releases `a`, and only a copy carried by the request tells the
  // daemon: it is served without waiting for the stream (which would take
  // until the deadline: the stream message is not sent yet).
  v1::StatsRequest carrying = plain;
  carrying.set_releases_through(1);
  v1::ReleaseLeases* copy = carrying.add_releases();
  copy->set_seq(1);
  copy->add_lease_ids(a.lease_id());
  EXPECT_EQ(stats(carrying).leases(), leases - 1);
  // The stream's own seq 1 arrives late, naming another lease: skipped whole
  // (it is the same message), and the session goes on to seq 2.
  v1::SessionRequest rel;
  rel.mutable_release()->set_seq(1);
  rel.mutable_release()->add_lease_ids(b.lease_id());
  ASSERT_TRUE(session_->Write(rel));
  rel.mutable_release()->set_seq(2);
  rel.mutable_release()->clear_lease_ids();
  rel.mutable_release()->add_lease_ids(c.lease_id());
  ASSERT_TRUE(session_->Write(rel));
  v1::StatsRequest through2 = plain;
  through2.set_releases_through(2);
  v1::StatsResponse after = stats(through2);
  EXPECT_EQ(after.leases(), leases - 2);  // `a` and `c`; `b` is held.
  EXPECT_EQ(after.sessions(), 3u);
  v1::SealRequest seal;
  seal.set_session_id(session_id_);
  seal.set_lease_id(b.lease_id());
  {
    grpc::ClientContext ctx;
    v1::SealResponse sr;
    EXPECT_TRUE(stub_->Seal(&ctx, seal, &sr).ok());  // `b` is intact.
  }
  // A copy past a gap (seq 4 when 3 is due) is ignored: the stream delivers
  // it in order. The request is still served.
  v1::StatsRequest gap = plain;
  copy = gap.add_releases();
  copy->set_seq(4);
  copy->add_lease_ids(b.lease_id());
  EXPECT_EQ(stats(gap).leases(), leases - 2);
  // Too many copies: INVALID_ARGUMENT naming the count and the limit.
  v1::StatsRequest flood = plain;
  for (size_t i = 0; i <= kDaemonMaxCarriedReleases; ++i) {
    flood.add_releases()->set_seq(3 + i);
  }
  Expect(&Stub::Stats, flood, kInvalid,
         absl::StrCat(kDaemonMaxCarriedReleases + 1,
                      " ReleaseLeases copies, at most ",
                      kDaemonMaxCarriedReleases));
  // Copies for a session that is not open: its error, nothing applied.
  v1::StatsRequest stranger = gap;
  stranger.set_session_id(12345);
  Expect(&Stub::Stats, stranger, grpc::StatusCode::FAILED_PRECONDITION,
         "is not open");
}

}  // namespace
}  // namespace shmtensor
