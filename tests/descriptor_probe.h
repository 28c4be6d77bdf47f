// Test helpers that speak the daemon's protocols by hand, as an attacker (or
// a broken client) would: a raw session stream, and raw requests on the
// descriptor socket (DescriptorRequest in shmtensor.proto).
//
// Thread safety: none.
#ifndef SHMTENSOR_TESTS_DESCRIPTOR_PROBE_H_
#define SHMTENSOR_TESTS_DESCRIPTOR_PROBE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shmtensor/v1/shmtensor.grpc.pb.h"

namespace shmtensor::testing {

// A session opened with a raw gRPC stream (no client library), kept open
// while this object lives.
struct RawSession {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ObjectStore::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>>
      stream;
  v1::SessionOpened opened;
};
// Opens one at `address` ("unix:/path"). The daemon's refusal as its status.
absl::StatusOr<std::unique_ptr<RawSession>> OpenRawSession(
    const std::string& address, bool read_only = false);

// What the descriptor socket answered one connection.
struct DescriptorAnswer {
  bool replied = false;  // A reply message came (else the socket closed).
  int code = -1;         // DescriptorReply.code.
  std::string message;   // DescriptorReply.message.
  // Access mode (O_RDONLY, O_RDWR) of each descriptor received, in order;
  // the descriptors themselves are closed.
  std::vector<int> access_modes;
};

// Connects to `socket_path` + ".fd", sends `bytes` as one message (none
// when empty), and waits up to `timeout_ms` for the answer.
absl::StatusOr<DescriptorAnswer> AskDescriptors(const std::string& socket_path,
                                                const std::string& bytes,
                                                int timeout_ms = 5000);
// Waits up to `timeout_ms` for what connection `fd` (kept open) receives:
// DEADLINE_EXCEEDED when nothing comes; an answer that did not reply when
// the daemon closed it.
absl::StatusOr<DescriptorAnswer> ReadAnswer(int fd, int timeout_ms);
// Sends `bytes` as one message with `fds` attached (SCM_RIGHTS). False
// with errno set when it cannot.
bool SendWithDescriptors(int fd, const std::string& bytes,
                         const std::vector<int>& fds);
// A serialized DescriptorRequest.
std::string DescriptorRequestBytes(uint64_t session_id,
                                   const std::string& secret);
// Connects a SOCK_SEQPACKET socket to `socket_path` + ".fd"; -1 on failure.
int ConnectDescriptorSocket(const std::string& socket_path);

}  // namespace shmtensor::testing

#endif  // SHMTENSOR_TESTS_DESCRIPTOR_PROBE_H_
