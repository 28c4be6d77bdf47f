#include "python/src/shared_view.h"

#include <utility>

#include "client/lease_share.h"
#include "python/src/py_support.h"

namespace shmtensor::python {

namespace {

// Whether a get of `ref` may share `v` (client/lease_share.h).
bool Shares(const View& v, const ObjectRef& ref) {
  return v.valid() && internal::LeaseSharesRef(*v.lease(), ref);
}

}  // namespace

SharedView* SharedView::Make(View view, std::shared_ptr<SharedViews> table) {
  auto* s = new SharedView(std::move(view));
  const View& v = s->view_;
  if (table != nullptr && Shares(v, v.ref())) {
    try {
      SharedView*& entry = table->by_object_[internal::ShareKey(v.ref())];
      if (entry == nullptr || !Shares(entry->view_, entry->view_.ref())) {
        entry = s;
        s->table_ = std::move(table);
      }
    } catch (...) {  // The table could not grow: the view goes.
      s->Drop(/*open=*/true);
      throw;
    }
  }
  return s;
}

View SharedView::TakeLast() {
  if (table_ != nullptr) {
    auto it = table_->by_object_.find(internal::ShareKey(view_.ref()));
    // Another SharedView of the object may have taken its place.
    if (it != table_->by_object_.end() && it->second == this) {
      table_->by_object_.erase(it);
    }
    table_.reset();
  }
  View v = std::move(view_);
  view_ = View();
  return v;
}

void SharedView::Close() {
  if (--open_ > 0) return;
  View v = TakeLast();
  ReleaseGil release;
  if (v.valid()) v.Release().IgnoreError();
}

void SharedView::Drop(bool open) {
  if (open && --open_ == 0) {
    View v = TakeLast();
    // Only the lease's last share sends a release (see Lease::~Lease).
    if (v.lease() != nullptr && v.lease().use_count() == 1) {
      ReleaseGil release;
      v = View();
    }
  }
  if (--holders_ == 0) delete this;
}

SharedView* SharedViews::Find(const ObjectRef& ref) {
  auto it = by_object_.find(internal::ShareKey(ref));
  if (it == by_object_.end() || !Shares(it->second->view_, ref)) {
    return nullptr;
  }
  it->second->Share();
  return it->second;
}

}  // namespace shmtensor::python
