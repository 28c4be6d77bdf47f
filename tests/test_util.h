// Helpers for the multi-process tests: a fixture with a real daemon per
// test (testing/cpp/daemon_process.h), monitoring calls, system figures.
//
// Thread safety: none; use from the test's main thread.
#ifndef SHMTENSOR_TESTS_TEST_UTIL_H_
#define SHMTENSOR_TESTS_TEST_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "shmtensor/client.h"
#include "shmtensor/v1/monitor.pb.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"
#include "testing/cpp/daemon_process.h"
#include "testing/cpp/subprocess.h"

namespace shmtensor::testing {

// Fixture: a fresh daemon per test and a client of it.
class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // Daemon flags; override for other pools.
  virtual std::vector<std::string> DaemonArgs() {
    return {"--pool-size", "64MiB"};
  }
  // A new client (session) of the test's daemon.
  Client Connect();
  // Runs `st_child <command[0]> <address> <command[1:]...>`.
  std::unique_ptr<Subprocess> Child(const std::vector<std::string>& command);
  // Bytes in use in the daemon's first pool by objects, the clients' stock
  // (buffers granted ahead of their puts: PoolUsage::stock_bytes) left out.
  uint64_t Used();

  std::unique_ptr<DaemonProcess> daemon_;
  std::optional<Client> client_;
};

// What the Monitor service of the daemon at `address` says now (failures
// are test failures, answered with an empty message).
v1::DaemonStatus MonitorStatus(const std::string& address);
v1::ListClientsResponse MonitorClients(const std::string& address);
// Leases the client with `client_id` holds at the daemon now (the
// monitor's per-client count: other sessions' stock does not move it);
// UINT64_MAX when the daemon lists no such client.
uint64_t MonitorLeasesOf(const std::string& address, uint64_t client_id);
// The first page of objects (up to 10,000).
v1::ListObjectsResponse MonitorObjects(const std::string& address);

// A session opened by hand, as a client of the proto alone: writes
// OpenSession{client_name, resume_session_id, present_leases} on the
// Session stream `stream` and returns the SessionOpened it answers; nullopt,
// with a test failure recorded, when the stream ends or answers otherwise.
std::optional<v1::SessionOpened> OpenRawSession(
    grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>* stream,
    absl::string_view client_name, uint64_t resume_session_id = 0,
    bool present_leases = false);

// Path of the test helper binary (st_child).
std::string ChildPath();
// Names in /dev/shm that a shmtensord could have made ("shmtensor*"): there
// must never be any (pools are unnamed memory).
std::vector<std::string> ShmtensorFilesInDevShm();
// Shmem in /proc/meminfo, bytes.
uint64_t ShmemBytes();

// Page faults the calling thread traps on from construction on (perf's
// software page-fault counter of the thread, which counts the faults a
// touch takes, not the page-table fills a madvise makes): for tests that a
// path maps its pages before they are touched. ok() is false where perf
// events are refused (perf_event_paranoid), and in a sanitizer build (its
// shadow memory faults beside the bytes); such a test then checks the page
// tables alone (PagesPresent).
class ThreadFaults {
 public:
  ThreadFaults();
  ~ThreadFaults();
  ThreadFaults(const ThreadFaults&) = delete;
  ThreadFaults& operator=(const ThreadFaults&) = delete;
  bool ok() const { return fd_ >= 0; }
  uint64_t count() const;

 private:
  int fd_ = -1;
};

// Whether every page of [p, p + bytes) has an entry in this process's page
// table now (/proc/self/pagemap: present or swapped).
bool PagesPresent(const void* p, uint64_t bytes);

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTS_TEST_UTIL_H_
