#include "ctl/render.h"

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace shmtensor::ctl {
namespace {

TEST(RenderTest, HumanBytesUsesBinaryUnits) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(64 << 10), "64.0 KiB");
  EXPECT_EQ(HumanBytes(3 << 19), "1.5 MiB");
  EXPECT_EQ(HumanBytes(uint64_t{2} << 30), "2.0 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{1} << 40), "1.0 TiB");
}

TEST(RenderTest, HumanAge) {
  EXPECT_EQ(HumanAge(850), "850ms");
  EXPECT_EQ(HumanAge(12345), "12.3s");
  EXPECT_EQ(HumanAge(307000), "5m07s");
  EXPECT_EQ(HumanAge(3 * 3600000 + 2 * 60000), "3h02m");
  EXPECT_EQ(HumanAge(uint64_t{4} * 86400000 + 5 * 3600000), "4d05h");
}

TEST(RenderTest, TableAlignsColumns) {
  const std::string t =
      Table({"NAME", "SIZE"}, {{"a", "1.0 KiB"}, {"longer", "12 B"}}, {1});
  EXPECT_EQ(t,
            "NAME       SIZE\n"
            "a       1.0 KiB\n"
            "longer     12 B\n");
}

TEST(RenderTest, MetricsEscapeLabelsAndPrintIntegersExactly) {
  v1::DaemonStatus s;
  s.set_version("0.1.0");
  s.set_uptime_ms(1500);
  v1::PoolStatus* p = s.add_pools();
  p->mutable_info()->set_name("default");
  p->mutable_info()->set_kind(v1::MEMORY_KIND_HOST);
  p->mutable_info()->set_size_bytes(uint64_t{1} << 40);
  p->set_used_bytes((uint64_t{1} << 40) - 4096);
  v1::ListClientsResponse c;
  v1::ClientStatus* cl = c.add_clients();
  cl->set_client_name("say \"hi\"\\now");
  cl->set_bytes_held(12345);
  const std::string m = RenderMetrics(s, c);
  EXPECT_NE(m.find("shmtensor_uptime_seconds 1.500\n"), std::string::npos);
  EXPECT_NE(m.find("shmtensor_pool_size_bytes{pool=\"default\",kind=\"host\"} "
                   "1099511627776\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("shmtensor_pool_used_bytes{pool=\"default\"} 1099511623680"),
            std::string::npos);
  EXPECT_NE(m.find("client=\"say \\\"hi\\\"\\\\now\""), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE shmtensor_client_bytes_held gauge\n"),
            std::string::npos);
  EXPECT_EQ(RenderMetricsDown(),
            "# HELP shmtensor_up 1 when shmtensord answered.\n"
            "# TYPE shmtensor_up gauge\nshmtensor_up 0\n");
}

// Operators see each uid's use of the shared tables beside its share, in
// the status and in the metrics.
TEST(RenderTest, StatusAndMetricsShowEachUidsUseAgainstItsShare) {
  v1::DaemonStatus s;
  s.set_version("0.1.0");
  v1::Limits* l = s.mutable_limits();
  l->set_uid_share_percent(50);
  l->set_max_objects_per_uid(131072);
  l->set_max_pins_per_uid(524288);
  l->set_max_stock_bytes_per_uid(uint64_t{512} << 20);
  l->set_max_sessions_per_uid(1024);
  v1::UidUsage* u = s.add_uids();
  u->set_uid(2000);
  u->set_sessions(3);
  u->set_objects(131072);
  u->set_pins(17);
  u->set_stock_bytes(uint64_t{64} << 20);
  s.set_refused_records(2);
  const std::string text = RenderStatus(s);
  EXPECT_NE(text.find("per uid (share 50%)"), std::string::npos) << text;
  EXPECT_NE(text.find("131072/131072"), std::string::npos) << text;
  EXPECT_NE(text.find("64.0 MiB/512.0 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("3/1024"), std::string::npos) << text;
  EXPECT_NE(text.find("ledger records refused at adoption: 2"),
            std::string::npos)
      << text;
  const std::string m = RenderMetrics(s, v1::ListClientsResponse());
  EXPECT_NE(m.find("shmtensor_uid_objects{uid=\"2000\"} 131072\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("shmtensor_uid_objects_limit 131072\n"), std::string::npos)
      << m;
  EXPECT_NE(m.find("shmtensor_uid_pins{uid=\"2000\"} 17\n"), std::string::npos);
  EXPECT_NE(m.find("shmtensor_refused_ledger_records 2\n"), std::string::npos);
}

TEST(RenderTest, StatusShowsEachPoolsPageSize) {
  v1::DaemonStatus s;
  v1::PoolStatus* small = s.add_pools();
  small->mutable_info()->set_name("shm");
  small->mutable_info()->set_page_size(4096);
  v1::PoolStatus* huge = s.add_pools();
  huge->mutable_info()->set_name("huge");
  huge->mutable_info()->set_page_size(4096);
  huge->mutable_info()->set_huge_page_size(2 << 20);
  const std::string t = RenderStatus(s);
  EXPECT_NE(t.find("PAGES"), std::string::npos) << t;
  const size_t shm_row = t.find("\nshm "), huge_row = t.find("\nhuge ");
  ASSERT_NE(shm_row, std::string::npos) << t;
  ASSERT_NE(huge_row, std::string::npos) << t;
  EXPECT_NE(
      t.substr(shm_row, t.find('\n', shm_row + 1) - shm_row).find("4.0 KiB"),
      std::string::npos)
      << t;
  EXPECT_NE(
      t.substr(huge_row, t.find('\n', huge_row + 1) - huge_row).find("2.0 MiB"),
      std::string::npos)
      << t;
  v1::UnavailablePool* gpu = s.add_unavailable_pools();
  gpu->set_name("gpu0");
  gpu->set_kind(v1::MEMORY_KIND_CUDA_DEVICE);
  gpu->set_reason("CUDA pools are unavailable: no usable CUDA device");
  EXPECT_NE(RenderStatus(s).find("unavailable: pool gpu0 (cuda): CUDA pools "
                                 "are unavailable: no usable CUDA device\n"),
            std::string::npos)
      << RenderStatus(s);
  v1::ListClientsResponse none;
  EXPECT_NE(RenderMetrics(s, none).find(
                "shmtensor_pool_page_bytes{pool=\"huge\"} 2097152\n"),
            std::string::npos)
      << RenderMetrics(s, none);
}

TEST(RenderTest, ObjectsTableNamesDTypesShapesAndStates) {
  v1::ListObjectsResponse r;
  v1::ObjectStatus* o = r.add_objects();
  o->set_name("w");
  o->mutable_layout()->set_dtype(v1::DTYPE_BFLOAT16);
  o->mutable_layout()->add_shape(64);
  o->mutable_layout()->add_shape(8);
  o->set_state(v1::OBJECT_STATE_PENDING_TRANSFER);
  r.add_objects()->set_state(v1::OBJECT_STATE_WRITING);  // Untyped bytes.
  r.add_objects()->set_state(v1::OBJECT_STATE_SHARED_WRITABLE);
  r.set_total(5);
  const std::string t = RenderObjects(r);
  EXPECT_NE(t.find("bfloat16"), std::string::npos) << t;
  EXPECT_NE(t.find("[64, 8]"), std::string::npos) << t;
  EXPECT_NE(t.find("pending-transfer"), std::string::npos) << t;
  EXPECT_NE(t.find("shared-writable"), std::string::npos) << t;
  EXPECT_NE(t.find("bytes"), std::string::npos) << t;
  EXPECT_NE(t.find("(3 of 5 objects shown)"), std::string::npos) << t;
}

}  // namespace
TEST(RenderTest, ClientsShowEachSessionsUidAndPoolAccess) {
  v1::ListClientsResponse r;
  v1::ClientStatus* c = r.add_clients();
  c->set_client_name("reader");
  c->set_has_process(true);
  c->set_uid(1234);
  v1::PoolGrant* g = c->add_pools();
  g->set_pool("default");
  g->set_access(v1::POOL_ACCESS_READ_WRITE);
  g = c->add_pools();
  g->set_pool("shared\nname");
  g->set_access(v1::POOL_ACCESS_READ);
  const std::string t = RenderClients(r);
  EXPECT_NE(t.find("ACCESS"), std::string::npos) << t;
  EXPECT_NE(t.find("1234"), std::string::npos) << t;
  EXPECT_NE(t.find("default:rw shared name:ro"), std::string::npos) << t;
}

// Which sessions post in a release ring, and how many messages came that
// way: "-" for one without a ring (every message by its stream), and no
// metric sample for it.
TEST(RenderTest, ClientsShowTheirReleaseRingsMessages) {
  v1::ListClientsResponse r;
  v1::ClientStatus* with = r.add_clients();
  with->set_client_id(7);
  with->set_client_name("producer");
  with->set_has_release_ring(true);
  with->set_ring_messages(987654);
  v1::ClientStatus* without = r.add_clients();
  without->set_client_id(8);
  without->set_client_name("reader");
  const std::string t = RenderClients(r);
  // The column is right-aligned: each row's cell ends where "RING" does.
  const std::vector<std::string> lines = absl::StrSplit(t, '\n');
  ASSERT_GE(lines.size(), 3u) << t;
  ASSERT_NE(lines[0].find("RING"), std::string::npos) << t;
  const size_t end = lines[0].find("RING") + 4;
  EXPECT_EQ(lines[1].substr(end - 7, 7), " 987654") << t;
  EXPECT_EQ(lines[2].substr(end - 2, 2), " -") << t;
  const std::string m = RenderMetrics(v1::DaemonStatus(), r);
  EXPECT_NE(m.find("# TYPE shmtensor_client_ring_messages_total counter\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("shmtensor_client_ring_messages_total{client_id=\"7\","
                   "client=\"producer\",pid=\"0\"} 987654\n"),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("client_ring_messages_total{client_id=\"8\""),
            std::string::npos)
      << m;
}

}  // namespace shmtensor::ctl
