#include "client/call_canceller.h"

namespace shmtensor::internal {
namespace {
thread_local CallCanceller* current = nullptr;
}  // namespace

void CallCanceller::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
}

bool CallCanceller::Attach(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  ctx_ = ctx;
  return true;
}

void CallCanceller::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = nullptr;
}

CallCanceller* ThreadCanceller() { return current; }

ScopedCanceller::ScopedCanceller(CallCanceller* canceller)
    : previous_(current) {
  current = canceller;
}

ScopedCanceller::~ScopedCanceller() { current = previous_; }

}  // namespace shmtensor::internal
