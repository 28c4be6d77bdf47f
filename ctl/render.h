// What shmtensorctl prints: aligned tables, human sizes and ages, JSON, and
// the Prometheus text exposition format, made from Monitor messages.
//
// Thread safety: pure functions.
#ifndef SHMTENSOR_CTL_RENDER_H_
#define SHMTENSOR_CTL_RENDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "shmtensor/v1/monitor.pb.h"

namespace shmtensor::ctl {

// 512 B, 64.0 KiB, 1.5 MiB, 2.0 GiB, 1.0 TiB.
std::string HumanBytes(uint64_t bytes);
// 850ms, 12.3s, 5m07s, 3h02m, 4d05h.
std::string HumanAge(uint64_t ms);

// Rows of cells under a header, each column padded to its widest cell;
// columns listed in `right` are right-aligned (numbers), the rest left.
std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows,
                  const std::vector<size_t>& right = {});

std::string RenderStatus(const v1::DaemonStatus& s);
std::string RenderObjects(const v1::ListObjectsResponse& r);
std::string RenderClients(const v1::ListClientsResponse& r);

// The message as JSON (proto3 mapping, field names as in the .proto, every
// field printed), one document, ending with a newline.
std::string ToJson(const google::protobuf::Message& m);

// Prometheus text exposition format (version 0.0.4): daemon, pool and
// per-client gauges and counters, every family with HELP and TYPE.
std::string RenderMetrics(const v1::DaemonStatus& s,
                          const v1::ListClientsResponse& clients);
// What `metrics` prints when the daemon does not answer: shmtensor_up 0.
std::string RenderMetricsDown();

}  // namespace shmtensor::ctl

#endif  // SHMTENSOR_CTL_RENDER_H_
