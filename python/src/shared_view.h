// The C++ View behind the Python Views (shmtensor.View) of one sealed
// object, and the table of them a Python Client keeps, so that a get of an
// object this process holds a view of through that client takes one more
// Python View of the same SharedView: with the GIL held, without the
// client's share lock, a copy of the object's description or a C++ View of
// its own. It is Client::GetHeld's share taken one level up, under the same
// rule (internal::LeaseSharesRef: the lease is the client's share of
// exactly that ref, held by this process, not lost), so a Python get shares
// exactly what a C++ get would, at a fraction of the cost (python_bench
// times both). The View, and with it this process's share of the lease,
// goes with the last Python View holding it.
//
// Ownership: each Python View holds its SharedView once (Hold; Drop or
// Close let go); a SharedView in a table holds the table (shared_ptr), so a
// table outlives its client's Python object while views of it live. A table
// names its SharedViews without holding them: one leaves its table before
// it is destroyed.
//
// Thread safety: every function must be called with the GIL held, which
// guards the counts and the table. The GIL is given up only while a last
// holder's View is destroyed or released, after the SharedView left its
// table, so no get can find it meanwhile.
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
  // A SharedView of `view`, held once (by the Python View about to be made
  // for it). Entered in `table` (null: none) when a get may share its
  // lease (LeaseSharesRef of its own ref), in place of any SharedView of
  // the same object entered before (one whose lease a resume lost).
  static SharedView* Make(View view, std::shared_ptr<SharedViews> table);

  SharedView(const SharedView&) = delete;
  SharedView& operator=(const SharedView&) = delete;

  const View& view() const { return view_; }

  // One more Python View holds it.
  void Hold() { ++holders_; }
  // A Python View lets go (it is deallocated). The last holder destroys
  // the View, giving up the GIL when that ends the lease's last share (its
  // release takes the client's locks).
  void Drop();
  // A Python View lets go (View.close()). The last holder releases the
  // View and waits for the daemon (View::Release), without the GIL.
  void Close();

 private:
  explicit SharedView(View view) : view_(std::move(view)) {}
  ~SharedView() = default;
  // Out of its table, if it is in one.
  void Leave();

  View view_;
  int64_t holders_ = 1;
  std::shared_ptr<SharedViews> table_;  // Null: in no table.
};

// A Python Client's SharedViews that a get may share, by object.
class SharedViews {
 public:
  // The SharedView of exactly `ref` that a get in this process may share,
  // held once more for the caller's new Python View; null when there is
  // none (then the client decides: Client::GetHeld, else the daemon).
  SharedView* Find(const ObjectRef& ref);

 private:
  friend class SharedView;
  // slot << 32 | generation; the whole ref is compared on a find.
  static uint64_t Key(const ObjectRef& ref) {
    return (uint64_t{ref.slot} << 32) | ref.generation;
  }

  absl::flat_hash_map<uint64_t, SharedView*> by_object_;
};

}  // namespace shmtensor::python

#endif  // SHMTENSOR_PYTHON_SRC_SHARED_VIEW_H_
