#include "daemon/store/object_table.h"

#include <cassert>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shmtensor/errors.h"

namespace shmtensor::daemon {

absl::Status ValidateName(const std::string& name) {
  if (name.empty()) return absl::InvalidArgumentError("name is empty");
  if (name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("name %s is more than the maximum of %d bytes",
                        Quoted(name), kMaxNameBytes));
  }
  if (name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("name contains a NUL byte");
  }
  return absl::OkStatus();
}

std::string Quoted(const std::string& text) {
  if (text.size() <= 64) return absl::StrCat("'", text, "'");
  return absl::StrFormat("'%s...' (%d bytes)", text.substr(0, 64), text.size());
}

std::string RefString(const v1::ObjectRef& ref) {
  return absl::StrFormat("ref(slot %d, generation %d)", ref.slot(),
                         ref.generation());
}

ObjectTable::ObjectTable(uint64_t epoch, std::function<uint64_t()> random)
    : epoch_(epoch), random_(std::move(random)) {}

bool ObjectTable::full() const {
  return slots_.size() >= kMaxObjects && free_slots_.empty();
}

uint32_t ObjectTable::Add(Object object) {
  // Invariant: the caller checked there is room and the name is free.
  assert(!full());
  assert(object.name.empty() || !names_.contains(object.name));
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.live = true;
  s.object = std::move(object);
  s.object.nonce = random_();
  by_serial_.emplace(s.object.serial, slot);
  if (!s.object.name.empty()) names_.emplace(s.object.name, slot);
  if (s.object.state == State::kPendingTransfer) ++pending_transfers_;
  ++live_;
  return slot;
}

void ObjectTable::Restore(uint32_t slot, uint32_t generation, Object object) {
  if (slot >= slots_.size()) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  s.live = true;
  s.generation = generation == 0 ? 1 : generation;
  s.object = std::move(object);
  by_serial_.emplace(s.object.serial, slot);
  if (!s.object.name.empty()) names_.emplace(s.object.name, slot);
  if (s.object.state == State::kPendingTransfer) ++pending_transfers_;
  ++live_;
}

void ObjectTable::RestoreFree(uint32_t slot, uint32_t generation) {
  if (slot >= slots_.size()) slots_.resize(slot + 1);
  slots_[slot].generation = generation == 0 ? 1 : generation;
}

void ObjectTable::RestoreRetired(uint32_t slot) {
  if (slot >= slots_.size()) slots_.resize(slot + 1);
  if (!slots_[slot].retired) ++retired_;
  slots_[slot].retired = true;
}

void ObjectTable::FinishRestore() {
  free_slots_.clear();
  for (size_t i = slots_.size(); i-- > 0;) {
    if (!slots_[i].live && !slots_[i].retired) {
      free_slots_.push_back(static_cast<uint32_t>(i));
    }
  }
}

void ObjectTable::SetState(uint32_t slot, State state) {
  Object& obj = slots_[slot].object;
  pending_transfers_ -= obj.state == State::kPendingTransfer;
  pending_transfers_ += state == State::kPendingTransfer;
  obj.state = state;
}

std::optional<uint32_t> ObjectTable::Named(const std::string& name) const {
  auto it = names_.find(name);
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

void ObjectTable::Unbind(uint32_t slot) {
  Object& obj = slots_[slot].object;
  if (obj.name.empty()) return;
  names_.erase(obj.name);
  obj.name.clear();
}

void ObjectTable::Free(uint32_t slot) {
  Slot& s = slots_[slot];
  // Invariant: only a live object without a name or a pending transfer is
  // freed (the owner's MaybeFree checks).
  assert(s.live && s.object.name.empty() &&
         s.object.state != State::kPendingTransfer);
  --live_;
  s.live = false;
  by_serial_.erase(s.object.serial);
  if (++s.generation == 0) s.generation = 1;
  free_slots_.push_back(slot);
}

v1::ObjectRef ObjectTable::MakeRef(uint32_t slot) const {
  const Slot& s = slots_[slot];
  v1::ObjectRef ref;
  ref.set_daemon_epoch(epoch_);
  ref.set_slot(slot);
  ref.set_generation(s.generation);
  ref.set_nonce(s.object.nonce);
  const State st = s.object.state;
  ref.set_exclusive(st == State::kPendingTransfer || st == State::kTaken);
  return ref;
}

absl::StatusOr<uint32_t> ObjectTable::ResolveRef(
    const v1::ObjectRef& ref) const {
  if (ref.daemon_epoch() != epoch_) {
    return WithReason(
        absl::NotFoundError(absl::StrFormat(
            "stale reference: %s was issued by another daemon instance "
            "(epoch %016x, this one is %016x)",
            RefString(ref), ref.daemon_epoch(), epoch_)),
        kReasonStaleReference);
  }
  if (ref.slot() >= slots_.size() || ref.generation() == 0 ||
      ref.generation() > slots_[ref.slot()].generation ||
      (ref.generation() == slots_[ref.slot()].generation &&
       !slots_[ref.slot()].live)) {
    return absl::InvalidArgumentError(
        absl::StrCat(RefString(ref), " was never issued by this daemon"));
  }
  const Slot& s = slots_[ref.slot()];
  if (ref.generation() == s.generation && ref.nonce() != s.object.nonce) {
    return absl::InvalidArgumentError(
        absl::StrCat(RefString(ref), " was never issued by this daemon"));
  }
  if (ref.generation() != s.generation) {
    return WithReason(absl::NotFoundError(absl::StrCat(
                          "stale reference: the object of ", RefString(ref),
                          " is gone and its memory may have been reused")),
                      kReasonStaleReference);
  }
  return ref.slot();
}

}  // namespace shmtensor::daemon
