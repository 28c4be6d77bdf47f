// Who last wrote each range of a pool, so that bytes one user wrote never
// reach another user (docs/pitfalls.md, P21). A range is "written" by a uid
// from the moment that uid is given it writable (a create, an exclusive
// hand-off's take, a writable Get of a shared-writable object), whether or
// not it wrote: the daemon never sees the writes. A range written by two
// uids is marked mixed, which no uid owns. A range nobody was ever given
// writable is clean: pools are zeroed when they are made (host_segment.h).
//
// Cost: one map entry per run of ranges of one writer (adjacent runs of
// the same writer merge), so a pool used by one uid holds a single entry.
//
// Thread safety: not thread-safe; the pool's owner (ObjectStore) serialises
// access under its lock.
#ifndef SHMTENSOR_DAEMON_MEMORY_WRITER_MAP_H_
#define SHMTENSOR_DAEMON_MEMORY_WRITER_MAP_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace shmtensor::daemon {

class WriterMap {
 public:
  // The writer of a range more than one uid was given writable.
  static constexpr uid_t kMixed = static_cast<uid_t>(-1);

  struct Range {
    uint64_t offset = 0;
    uint64_t length = 0;
    bool operator==(const Range& o) const {
      return offset == o.offset && length == o.length;
    }
  };

  // For a new object of uid `uid` at [offset, offset + length): returns the
  // parts whose writer is another uid (or mixed), which the caller must
  // clear before `uid` sees them, in ascending order with adjacent parts
  // merged; then records `uid` as the writer of the whole range.
  std::vector<Range> Claim(uint64_t offset, uint64_t length, uid_t uid);

  // `uid` is given [offset, offset + length) writable while others may
  // have written it: each part written by another uid becomes mixed, a
  // clean part becomes `uid`'s.
  void Share(uint64_t offset, uint64_t length, uid_t uid);

  // The writer of the byte at `offset`; nullopt when it is clean.
  std::optional<uid_t> WriterAt(uint64_t offset) const;

  // Runs of one writer recorded (for tests and the cost above).
  size_t runs() const { return runs_.size(); }

 private:
  struct Run {
    uint64_t end = 0;  // Exclusive.
    uid_t uid = 0;
  };
  // Makes `at` the start of a run when a run spans it.
  void SplitAt(uint64_t at);
  // Merges the runs around [from, to] with equal neighbours.
  void Coalesce(uint64_t from, uint64_t to);

  // Non-overlapping runs by start offset; clean bytes have no run.
  std::map<uint64_t, Run> runs_;
};

}  // namespace shmtensor::daemon

#endif  // SHMTENSOR_DAEMON_MEMORY_WRITER_MAP_H_
