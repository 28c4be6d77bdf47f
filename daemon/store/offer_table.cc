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
  offers_.emplace(token, offer).first->second.token = token;
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

std::vector<uint64_t> OfferTable::SessionEnded(uint64_t session_id,
                                               absl::Time now,
                                               absl::Duration grace) {
  auto s = by_session_.find(session_id);
  if (s == by_session_.end()) return {};
  const absl::Time expires = now + grace;
  std::vector<uint64_t> tokens(s->second.begin(), s->second.end());
  for (uint64_t token : tokens) {
    offers_[token].expires = expires;
    expiring_.emplace(expires, token);
  }
  by_session_.erase(s);
  return tokens;
}

void OfferTable::Rekey(uint64_t old_id, uint64_t new_id) {
  auto s = by_session_.find(old_id);
  if (s == by_session_.end()) return;
  absl::flat_hash_set<uint64_t> tokens = std::move(s->second);
  by_session_.erase(s);
  for (uint64_t token : tokens) offers_[token].session_id = new_id;
  by_session_[new_id] = std::move(tokens);
}

void OfferTable::Restore(uint64_t token, const Offer& offer) {
  offers_[token] = offer;
  offers_[token].token = token;
  if (offer.expires == absl::InfiniteFuture()) {
    by_session_[offer.session_id].insert(token);
  } else {
    expiring_.emplace(offer.expires, token);
  }
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
