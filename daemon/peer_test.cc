#include "daemon/peer.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace shmtensor::daemon {
namespace {

TEST(PeerTest, OnlyUnixSocketsAndLoopbackAreLocal) {
  EXPECT_TRUE(IsLocalPeer("unix:"));
  EXPECT_TRUE(IsLocalPeer("unix:/tmp/shmtensord-0.sock"));
  EXPECT_TRUE(IsLocalPeer("ipv4:127.0.0.1:51234"));
  EXPECT_TRUE(IsLocalPeer("ipv6:[::1]:51234"));
  EXPECT_TRUE(IsLocalPeer("ipv6:%5B::1%5D:51234"));
  EXPECT_FALSE(IsLocalPeer("ipv4:10.0.0.7:51234"));
  EXPECT_FALSE(IsLocalPeer("ipv4:128.0.0.1:51234"));
  EXPECT_FALSE(IsLocalPeer("ipv6:[fe80::1]:51234"));
  EXPECT_FALSE(IsLocalPeer("ipv6:[::12]:51234"));
  EXPECT_FALSE(IsLocalPeer(""));
}

TEST(PeerTest, DescribesAVisibleProcessFromProc) {
  PeerInfo me = DescribePeer("unix:", getpid());
  EXPECT_EQ(me.peer, "unix:");
  EXPECT_TRUE(me.has_process);
  EXPECT_EQ(me.uid, getuid());
  EXPECT_NE(me.command_line.find("peer_test"), std::string::npos)
      << me.command_line;
  EXPECT_FALSE(DescribePeer("unix:", 0).has_process);
  EXPECT_FALSE(DescribePeer("unix:", 1 << 30).has_process);  // No such pid.
}

}  // namespace
}  // namespace shmtensor::daemon
