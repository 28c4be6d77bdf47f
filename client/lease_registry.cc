#include "client/lease_registry.h"

#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "client/lease.h"

namespace shmtensor::internal {
namespace {

// (address, lease) -> bytes. Leases of one object in this process share an
// address; ranges of different objects do not overlap.
using Ranges = std::map<std::pair<uintptr_t, const Lease*>, uint64_t>;

std::mutex& Mu() {
  static auto* mu = new std::mutex;  // Never destroyed: leases outlive main.
  return *mu;
}

Ranges& All() {
  static auto* ranges = new Ranges;
  return *ranges;
}

}  // namespace

void LeaseRegistry::Add(const Lease* lease, const uint8_t* data,
                        uint64_t size) {
  std::lock_guard<std::mutex> lock(Mu());
  All().emplace(std::make_pair(reinterpret_cast<uintptr_t>(data), lease), size);
}

void LeaseRegistry::Remove(const Lease* lease, const uint8_t* data) {
  std::lock_guard<std::mutex> lock(Mu());
  All().erase(std::make_pair(reinterpret_cast<uintptr_t>(data), lease));
}

std::shared_ptr<Lease> LeaseRegistry::Find(const void* p, uint64_t size) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  // Taken under the lock, dropped after it: the last reference to a lease
  // may go here, and its destructor takes the lock to Remove it.
  std::vector<std::shared_ptr<Lease>> candidates;
  {
    std::lock_guard<std::mutex> lock(Mu());
    Ranges& all = All();
    auto it = all.upper_bound(std::make_pair(
        address,
        reinterpret_cast<const Lease*>(std::numeric_limits<uintptr_t>::max())));
    // The entries just below `p` that start where the nearest one does: the
    // leases of the one object that can contain it.
    const uintptr_t nearest =
        it == all.begin() ? 0 : std::prev(it)->first.first;
    while (it != all.begin()) {
      --it;
      const uintptr_t start = it->first.first;
      if (start != nearest) break;
      if (address - start >= it->second ||
          size > it->second - (address - start)) {
        break;  // [p, p + size) is not within its bytes.
      }
      // Null while the lease is being destroyed (its destructor waits on
      // the lock to Remove it, so the pointer is valid here).
      if (std::shared_ptr<Lease> lease =
              const_cast<Lease*>(it->first.second)->weak_from_this().lock()) {
        candidates.push_back(std::move(lease));
      }
    }
  }
  for (std::shared_ptr<Lease>& lease : candidates) {
    // A lease inherited across fork is the parent's session's: this
    // process cannot act for it (its own lease of the object may follow).
    if (!lease->core().inherited()) return std::move(lease);
  }
  return nullptr;
}

void LeaseRegistry::LockForFork() { Mu().lock(); }
void LeaseRegistry::UnlockAfterFork() { Mu().unlock(); }

}  // namespace shmtensor::internal
