#include "daemon/config.h"

#include <fstream>

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
}

}  // namespace
}  // namespace shmtensor::daemon
