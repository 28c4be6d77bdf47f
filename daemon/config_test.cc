#include "daemon/config.h"

#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

TEST(ParseByteSizeTest, AcceptsUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("64KiB"), 64u << 10);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512u << 20);
  EXPECT_EQ(*ParseByteSize("4GiB"), uint64_t{4} << 30);
  EXPECT_EQ(*ParseByteSize("2g"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize(" 1TiB "), uint64_t{1} << 40);
}

TEST(ParseByteSizeTest, RejectsBadInputNamingIt) {
  for (const char* bad : {"", "MiB", "12XB", "-1GiB", "0", "0MiB",
                          "99999999999999TiB", "1.5GiB"}) {
    absl::StatusOr<uint64_t> r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << bad;
  }
}

std::string WriteFile(const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "/shmtensord_" +
      ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".toml";
  std::ofstream(path) << text;
  return path;
}

TEST(LoadConfigFileTest, ReadsListenAndPools) {
  const std::string path = WriteFile(
      "listen = \"unix:/tmp/x.sock\"\n"
      "log_level = \"debug\"\n"
      "[[pool]]\nname = \"a\"\nsize = \"8MiB\"\n"
      "[[pool]]\nname = \"b\"\nsize = 4096\n");
  absl::StatusOr<DaemonConfig> c = LoadConfigFile(path, DefaultConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "unix:/tmp/x.sock");
  EXPECT_EQ(c->log_level, "debug");
  ASSERT_EQ(c->pools.size(), 2u);
  EXPECT_EQ(c->pools[0].name, "a");
  EXPECT_EQ(c->pools[0].size_bytes, 8u << 20);
  EXPECT_EQ(c->pools[1].size_bytes, 4096u);
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(LoadConfigFileTest, UnknownKeyNamesFileLineAndKey) {
  const std::string path = WriteFile("listen = \"unix:/x\"\npool_size = 3\n");
  absl::StatusOr<DaemonConfig> c = LoadConfigFile(path, DefaultConfig());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(path + ":2"), std::string::npos)
      << c.status();
  EXPECT_NE(c.status().message().find("pool_size"), std::string::npos);
}

TEST(LoadConfigFileTest, SyntaxErrorAndMissingFile) {
  absl::StatusOr<DaemonConfig> c =
      LoadConfigFile(WriteFile("listen = \n"), DefaultConfig());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  c = LoadConfigFile("/nonexistent/shmtensord.toml", DefaultConfig());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

TEST(ValidateConfigTest, RejectsDuplicatePoolsAndLevels) {
  DaemonConfig c = DefaultConfig();
  c.pools.push_back({"default", 4096});
  EXPECT_FALSE(ValidateConfig(c).ok());
  c = DefaultConfig();
  c.log_level = "loud";
  EXPECT_NE(ValidateConfig(c).message().find("loud"), std::string::npos);
  c = DefaultConfig();
  c.nice = -21;
  EXPECT_NE(ValidateConfig(c).message().find("nice -21"), std::string::npos);
  EXPECT_FALSE(DefaultConfig().nice.has_value());  // Unchanged by default.
}

TEST(LoadConfigFileTest, ReadsEveryKey) {
  const std::string path = WriteFile(
      "listen = \"unix:/tmp/y.sock\"\n"
      "monitor_listen = \"9464\"\n"
      "socket_mode = \"0600\"\n"
      "socket_group = \"shmtensor\"\n"
      "nice = -5\n"
      "[limits]\n"
      "max_objects = 1000\n"
      "max_leases_per_client = 64\n"
      "max_bytes_per_client = \"2GiB\"\n"
      "[[pool]]\nname = \"p\"\nsize = \"8MiB\"\nkind = \"host\"\n"
      "directory = \"/run/shmtensor/huge\"\nhuge_pages = \"require\"\n"
      "users = [\"alice\", 1001]\ngroups = [\"trainers\"]\n"
      "read_only_users = [2000]\nread_only_groups = [\"readers\", 77]\n");
  absl::StatusOr<DaemonConfig> c = LoadConfigFile(path, DefaultConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(MonitorAddress(c->monitor_listen), "127.0.0.1:9464");
  EXPECT_EQ(MonitorAddress("0.0.0.0:9464"), "0.0.0.0:9464");
  EXPECT_EQ(c->socket_mode, 0600u);
  EXPECT_EQ(c->socket_group, "shmtensor");
  EXPECT_EQ(c->nice, -5);
  EXPECT_EQ(c->limits.max_objects, 1000u);
  EXPECT_EQ(c->limits.max_leases_per_client, 64u);
  EXPECT_EQ(c->limits.max_bytes_per_client, uint64_t{2} << 30);
  EXPECT_EQ(c->pools[0].kind, "host");
  EXPECT_EQ(c->pools[0].directory, "/run/shmtensor/huge");
  EXPECT_EQ(c->pools[0].huge_pages, "require");
  EXPECT_EQ(c->pools[0].access.users,
            (std::vector<std::string>{"alice", "1001"}));
  EXPECT_EQ(c->pools[0].access.groups, (std::vector<std::string>{"trainers"}));
  EXPECT_EQ(c->pools[0].access.read_only_users,
            (std::vector<std::string>{"2000"}));
  EXPECT_EQ(c->pools[0].access.read_only_groups,
            (std::vector<std::string>{"readers", "77"}));
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(PoolAccessRulesTest, NamesResolveAndUnknownOnesAreRefusedNamingThem) {
  PoolAccessConfig config;
  config.users = {"root", "4000"};
  config.read_only_groups = {"5000"};
  absl::StatusOr<PoolAccessRules> rules =
      PoolAccessRules::Resolve("p", config, /*owner=*/1234, /*socket_gid=*/-1);
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_EQ(rules->AccessOf({1, 4000, 4000, {}}), v1::POOL_ACCESS_READ_WRITE);
  EXPECT_EQ(rules->AccessOf({1, 1234, 1, {}}), v1::POOL_ACCESS_READ_WRITE);
  EXPECT_EQ(rules->AccessOf({1, 0, 0, {}}), v1::POOL_ACCESS_READ_WRITE);
  EXPECT_EQ(rules->AccessOf({1, 4001, 5000, {}}), v1::POOL_ACCESS_READ);
  EXPECT_EQ(rules->AccessOf({1, 4001, 4001, {9, 5000}}), v1::POOL_ACCESS_READ);
  EXPECT_EQ(rules->AccessOf({1, 4001, 4001, {9}}), v1::POOL_ACCESS_UNSPECIFIED);
  config.groups = {"no-such-group-here"};
  absl::StatusOr<PoolAccessRules> bad =
      PoolAccessRules::Resolve("p", config, 1234, -1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(
      bad.status().message(),
      "pool 'p': 'no-such-group-here' in groups is not a group"))
      << bad.status();
  // A socket_group's members may use a pool that names no writers.
  PoolAccessConfig none;
  absl::StatusOr<PoolAccessRules> grouped =
      PoolAccessRules::Resolve("p", none, 1234, 600);
  EXPECT_EQ(grouped->AccessOf({1, 4001, 600, {}}), v1::POOL_ACCESS_READ_WRITE);
  EXPECT_EQ(grouped->AccessOf({1, 4001, 601, {}}), v1::POOL_ACCESS_UNSPECIFIED);
}

// Each bad value: the error names the file, the line and the key.
TEST(LoadConfigFileTest, BadValuesNameLineAndKey) {
  struct Case {
    std::string text, line, needle;
  };
  const Case cases[] = {
      {"log_level = \"info\"\nlisten = 5\n", ":2", "'listen' must be a string"},
      {"\nsocket_mode = \"0999\"\n", ":2", "'socket_mode' is '0999'"},
      {"nice = 20\n", ":1", "'nice' must be an integer from -20 to 19"},
      {"\nnice = \"-5\"\n", ":2", "'nice' must be an integer from -20 to 19"},
      {"[limits]\nmax_objects = -1\n", ":2", "'limits.max_objects'"},
      {"[limits]\n\nmax_bytes_per_client = \"lots\"\n", ":3", "'lots'"},
      {"[limits]\nmax_lease = 3\n", ":2", "unknown key 'limits.max_lease'"},
      {"[[pool]]\nname = \"g\"\nsize = \"1GiB\"\nkind = \"gpu\"\n", ":4",
       "'pool.kind' is 'gpu'; use \"host\" or \"cuda\""},
      {"[[pool]]\nname = \"g\"\nsize = 4096\nkind = \"cuda\"\ndevice = -1\n",
       ":5", "'pool.device' must be an integer >= 0"},
      {"[[pool]]\nname = \"g\"\nsizes = 4\n", ":3", "unknown key 'pool.sizes'"},
      {"[[pool]]\nname = \"g\"\n", ":1", "pool 'g' has no 'size'"},
      {"[[pool]]\nname = \"g\"\nsize = 4096\ndirectory = \"shm\"\n", ":4",
       "'pool.directory' is 'shm'; it must be an absolute path"},
      {"[[pool]]\nname = \"g\"\nsize = 4096\nhuge_pages = \"yes\"\n", ":4",
       "'pool.huge_pages' is 'yes'"},
      {"[[pool]]\nname = \"g\"\nsize = 4096\nusers = \"alice\"\n", ":4",
       "'pool.users' must be an array of names or ids"},
      {"[[pool]]\nname = \"g\"\nsize = 4096\ngroups = [-1]\n", ":4",
       "each entry of 'pool.groups' must be a name"},
      {"[[pool]]\nname = \"g\"\nsize = 4096\nread_only_users = [\"\"]\n", ":4",
       "each entry of 'pool.read_only_users'"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<DaemonConfig> r =
        LoadConfigFile(WriteFile(c.text), DefaultConfig());
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(".toml" + c.line + ":"),
              std::string::npos)
        << r.status() << " for\n"
        << c.text;
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos)
        << r.status() << " lacks " << c.needle;
  }
}

TEST(ValidateConfigTest, CudaPoolsTakeADeviceAndNoDirectory) {
  absl::StatusOr<DaemonConfig> c =
      LoadConfigFile(WriteFile("[[pool]]\nname = \"gpu1\"\nsize = \"1GiB\"\n"
                               "kind = \"cuda\"\ndevice = 1\n"),
                     DefaultConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pools[0].kind, "cuda");
  EXPECT_EQ(c->pools[0].device, 1);
  EXPECT_TRUE(ValidateConfig(*c).ok());
  c->pools[0].directory = "/run/shmtensor-pools";
  const absl::Status s = ValidateConfig(*c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pool 'gpu1' is a CUDA pool"), std::string::npos)
      << s;
}

TEST(LoadConfigFileTest, TheSampleConfigIsValidAndHoldsTheDefaults) {
  absl::StatusOr<DaemonConfig> c = LoadConfigFile(
      SHMTENSOR_SOURCE_DIR "/deploy/shmtensord.toml", DefaultConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ValidateConfig(*c).ok());
  const DaemonConfig d = DefaultConfig();
  EXPECT_EQ(c->listen, d.listen);  // Commented out in the sample.
  EXPECT_EQ(c->monitor_listen, d.monitor_listen);
  EXPECT_EQ(c->socket_mode, d.socket_mode);
  EXPECT_EQ(c->socket_group, d.socket_group);
  EXPECT_EQ(c->log_level, d.log_level);
  EXPECT_EQ(c->limits.max_objects, d.limits.max_objects);
  EXPECT_EQ(c->limits.max_leases_per_client, d.limits.max_leases_per_client);
  EXPECT_EQ(c->limits.max_bytes_per_client, d.limits.max_bytes_per_client);
  EXPECT_EQ(c->limits.max_leases, d.limits.max_leases);
  EXPECT_EQ(c->limits.max_bytes_per_uid, d.limits.max_bytes_per_uid);
  EXPECT_EQ(c->limits.max_sessions_per_uid, d.limits.max_sessions_per_uid);
  EXPECT_EQ(c->limits.max_connections_per_uid,
            d.limits.max_connections_per_uid);
  EXPECT_EQ(c->limits.max_waiters_per_session,
            d.limits.max_waiters_per_session);
  EXPECT_EQ(c->limits.max_waiters_per_uid, d.limits.max_waiters_per_uid);
  EXPECT_EQ(c->limits.max_waiters, d.limits.max_waiters);
  ASSERT_EQ(c->pools.size(), 1u);
  EXPECT_EQ(c->pools[0].name, d.pools[0].name);
  EXPECT_EQ(c->pools[0].size_bytes, d.pools[0].size_bytes);
  EXPECT_EQ(c->pools[0].kind, d.pools[0].kind);
  EXPECT_EQ(c->pools[0].directory, d.pools[0].directory);
  EXPECT_EQ(c->pools[0].huge_pages, d.pools[0].huge_pages);
}

}  // namespace
}  // namespace shmtensor::daemon
