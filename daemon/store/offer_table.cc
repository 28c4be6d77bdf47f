#include "daemon/store/offer_table.h"

#include <cassert>

namespace shmtensor::daemon {

size_t OfferTable::CountOf(uint64_t session_id) const {
  auto it = by_session_.find(session_id);
  return it == by_session_.end() ? 0 : it->second.size();
}

void OfferTable::Add(uint64_t token, const Offer& offer) {
  assert(token != 0 && !offers_.contains(token));
  assert(offer.expires == absl::InfiniteFuture());
  offers_.emplace(token, offer);
  by_session_[offer.session_id].insert(token);
}

const OfferTable::Offer* OfferTable::Find(uint64_t token, uint32_t slot,
                                          uint32_t generation) const {
  auto it = offers_.find(token);
  if (it == offers_.end() || it->second.slot != slot ||
      it->second.generation != generation) {
    return nullptr;
  }
  return &it->second;
}

std::optional<OfferTable::Offer> OfferTable::Take(uint64_t token, uint32_t slot,
                                                  uint32_t generation) {
  auto it = offers_.find(token);
  if (it == offers_.end() || it->second.slot != slot ||
      it->second.generation != generation) {
    return std::nullopt;
  }
  Offer offer = it->second;
  offers_.erase(it);
  if (offer.expires == absl::InfiniteFuture()) {
    auto s = by_session_.find(offer.session_id);
    assert(s != by_session_.end());
    s->second.erase(token);
    if (s->second.empty()) by_session_.erase(s);
  } else {
    expiring_.erase({offer.expires, token});
  }
  return offer;
}

void OfferTable::SessionEnded(uint64_t session_id, absl::Time now,
                              absl::Duration grace) {
  auto s = by_session_.find(session_id);
  if (s == by_session_.end()) return;
  const absl::Time expires = now + grace;
  for (uint64_t token : s->second) {
    offers_[token].expires = expires;
    expiring_.emplace(expires, token);
  }
  by_session_.erase(s);
}

std::vector<OfferTable::Offer> OfferTable::Expire(absl::Time now) {
  std::vector<Offer> out;
  while (!expiring_.empty() && expiring_.begin()->first <= now) {
    const uint64_t token = expiring_.begin()->second;
    expiring_.erase(expiring_.begin());
    auto it = offers_.find(token);
    assert(it != offers_.end());
    out.push_back(it->second);
    offers_.erase(it);
  }
  return out;
}

}  // namespace shmtensor::daemon
