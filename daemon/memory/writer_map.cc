#include "daemon/memory/writer_map.h"

#include <iterator>

namespace shmtensor::daemon {

void WriterMap::SplitAt(uint64_t at) {
  auto it = runs_.upper_bound(at);
  if (it == runs_.begin()) return;
  --it;
  if (it->first == at || it->second.end <= at) return;
  const Run tail{it->second.end, it->second.uid};
  it->second.end = at;
  runs_.emplace(at, tail);
}

void WriterMap::Coalesce(uint64_t from, uint64_t to) {
  auto it = runs_.lower_bound(from);
  if (it != runs_.begin()) --it;
  while (it != runs_.end() && it->first <= to) {
    auto next = std::next(it);
    if (next != runs_.end() && next->first == it->second.end &&
        next->second.uid == it->second.uid) {
      it->second.end = next->second.end;
      runs_.erase(next);
      continue;
    }
    it = next;
  }
}

std::vector<WriterMap::Range> WriterMap::Claim(uint64_t offset, uint64_t length,
                                               uid_t uid) {
  std::vector<Range> dirty;
  if (length == 0) return dirty;
  const uint64_t end = offset + length;
  SplitAt(offset);
  SplitAt(end);
  for (auto it = runs_.lower_bound(offset);
       it != runs_.end() && it->first < end;) {
    if (it->second.uid != uid) {
      const uint64_t len = it->second.end - it->first;
      if (!dirty.empty() &&
          dirty.back().offset + dirty.back().length == it->first) {
        dirty.back().length += len;
      } else {
        dirty.push_back(Range{it->first, len});
      }
    }
    it = runs_.erase(it);
  }
  runs_.emplace(offset, Run{end, uid});
  Coalesce(offset, end);
  return dirty;
}

void WriterMap::Share(uint64_t offset, uint64_t length, uid_t uid) {
  if (length == 0) return;
  const uint64_t end = offset + length;
  SplitAt(offset);
  SplitAt(end);
  // Fill the clean gaps with `uid`, and mark others' runs mixed.
  uint64_t at = offset;
  auto it = runs_.lower_bound(offset);
  while (at < end) {
    if (it == runs_.end() || it->first >= end) {
      runs_.emplace(at, Run{end, uid});
      break;
    }
    if (it->first > at) runs_.emplace(at, Run{it->first, uid});
    if (it->second.uid != uid) it->second.uid = kMixed;
    at = it->second.end;
    ++it;
  }
  Coalesce(offset, end);
}

std::optional<uid_t> WriterMap::WriterAt(uint64_t offset) const {
  auto it = runs_.upper_bound(offset);
  if (it == runs_.begin()) return std::nullopt;
  --it;
  if (offset >= it->second.end) return std::nullopt;
  return it->second.uid;
}

}  // namespace shmtensor::daemon
