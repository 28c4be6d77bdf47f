#include "python/src/shared_view.h"

#include <utility>

#include "client/lease_address.h"
#include "python/src/py_support.h"

namespace shmtensor::python {

SharedView* SharedView::Make(View view, std::shared_ptr<SharedViews> table) {
  auto* s = new SharedView(std::move(view));
  const View& v = s->view_;
  if (table != nullptr && v.valid() &&
      internal::LeaseSharesRef(*v.lease(), v.ref())) {
    table->by_object_[SharedViews::Key(v.ref())] = s;
    s->table_ = std::move(table);
  }
  return s;
}

void SharedView::Leave() {
  if (table_ == nullptr) return;
  auto it = table_->by_object_.find(SharedViews::Key(view_.ref()));
  // Another SharedView of the object may have taken its place.
  if (it != table_->by_object_.end() && it->second == this) {
    table_->by_object_.erase(it);
  }
  table_.reset();
}

void SharedView::Drop() {
  if (--holders_ > 0) return;
  Leave();
  // Only the lease's last share sends a release (see Lease::~Lease).
  if (view_.lease() != nullptr && view_.lease().use_count() > 1) {
    delete this;
    return;
  }
  ReleaseGil release;
  delete this;
}

void SharedView::Close() {
  if (--holders_ > 0) return;
  Leave();
  View v = std::move(view_);
  delete this;
  ReleaseGil release;
  if (v.valid()) v.Release().IgnoreError();
}

SharedView* SharedViews::Find(const ObjectRef& ref) {
  auto it = by_object_.find(Key(ref));
  if (it == by_object_.end()) return nullptr;
  SharedView* s = it->second;
  if (!internal::LeaseSharesRef(*s->view().lease(), ref)) return nullptr;
  s->Hold();
  return s;
}

}  // namespace shmtensor::python
