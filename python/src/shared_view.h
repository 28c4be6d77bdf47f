// The C++ View behind the Python Views (shmtensor.View) of one sealed
// object, and the table of them a Python Client keeps, so that a get of an
// object this process holds a view of through that client takes one more
// Python View of the same SharedView: with the GIL held, without the
// client's share lock, a copy of the object's description or a C++ View of
// its own. It is Client::GetHeld's share taken one level up, under the same
// rule (client/lease_share.h: the lease is the client's share of exactly
// that ref, held by this process, not lost), so a Python get shares exactly
// what a C++ get would, at a fraction of the cost (python_bench times
// both). The View, and with it this process's share of the lease, goes with
// the last open Python View of it (closed or deallocated).
//
// Ownership: every Python View of a SharedView holds it (its memory) from
// its making to its deallocation, and keeps it open until it is closed or
// deallocated: the View goes when the last open one lets go, the
// SharedView's memory when the last holder is deallocated. So whatever a
// method of a Python View reads of view() stays readable memory while that
// method runs, even when Python code it calls closes every view of the
// object (view() is then an empty View, as a closed view was before). A
// SharedView in a table holds the table (shared_ptr), so a table outlives
// its client's Python object while open views of it live; a table names
// its SharedViews without holding them: one leaves its table when its last
// open view lets go.
//
// Thread safety: every function must be called with the GIL held, which
// guards the counts and the table. The GIL is given up only after the
// SharedView left its table and its View was moved out of it, while that
// View is released or destroyed.
#ifndef SHMTENSOR_PYTHON_SRC_SHARED_VIEW_H_
#define SHMTENSOR_PYTHON_SRC_SHARED_VIEW_H_

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "shmtensor/object_ref.h"
#include "shmtensor/view.h"

namespace shmtensor::python {

class SharedViews;

class SharedView {
 public:
  // A SharedView of `view`, held and opened once (for the Python View about
  // to be made for it). Entered in `table` (null: none) when a get may share
  // its lease (LeaseSharesRef of its own ref) and the table has no
  // SharedView of the object a get may share (one whose lease a resume lost
  // is replaced).
  static SharedView* Make(View view, std::shared_ptr<SharedViews> table);

  SharedView(const SharedView&) = delete;
  SharedView& operator=(const SharedView&) = delete;

  // The view; an empty View once its last open Python View let go. A
  // reference valid while the caller's Python View lives (see above).
  const View& view() const { return view_; }
  // Its Python Views not closed, and not deallocated (for tests).
  int64_t open() const { return open_; }
  int64_t holders() const { return holders_; }

  // A Python View closes (View.close()): the last open one releases the
  // View and waits for the daemon (View::Release), without the GIL.
  void Close();
  // A Python View is deallocated, `open` or closed already: an open one
  // lets go as Close does but without waiting (the release is posted; the
  // GIL given up only when that ends the lease's last share, whose release
  // takes the client's locks); the last holder frees the SharedView.
  void Drop(bool open);

 private:
  friend class SharedViews;
  explicit SharedView(View view) : view_(std::move(view)) {}
  ~SharedView() = default;
  // One more open Python View of it (SharedViews::Find).
  void Share() {
    ++open_;
    ++holders_;
  }
  // The last open view let go: out of its table, and the View out of it.
  View TakeLast();

  View view_;
  int64_t open_ = 1;                    // Python Views of it not closed.
  int64_t holders_ = 1;                 // Python Views of it not deallocated.
  std::shared_ptr<SharedViews> table_;  // Null: in no table.
};

// A Python Client's SharedViews that a get may share, by object.
class SharedViews {
 public:
  // The SharedView of exactly `ref` that a get in this process may share,
  // opened and held once more for the caller's new Python View; null when
  // there is none (then the client decides: Client::GetHeld, else the
  // daemon).
  SharedView* Find(const ObjectRef& ref);

 private:
  friend class SharedView;
  absl::flat_hash_map<uint64_t, SharedView*> by_object_;  // By ShareKey.
};

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_SHARED_VIEW_H_
