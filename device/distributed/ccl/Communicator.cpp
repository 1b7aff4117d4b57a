// See phantom/ccl/Communicator.h.
#include <phantom/ccl/Communicator.h>

#include <phantom/Exception.h>

namespace phantom::ccl {

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Product: return "product";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::BitwiseAnd: return "band";
    case ReduceOp::BitwiseOr: return "bor";
    case ReduceOp::BitwiseXor: return "bxor";
  }
  return "?";
}

void Communicator::orderAfter(const PhantomStream& waiting,
                              const PhantomStream& stream) {
  if (waiting == stream) {
    return;  // a stream's own work is in order already
  }
  ph_event_t queued = nullptr;
  PHANTOM_CHECK(ph_event_create(PH_EVENT_DISABLE_TIMING, &queued));
  const ph_status_t recorded = ph_event_record(queued, waiting.handle());
  const ph_status_t waited =
      recorded == PH_SUCCESS ? ph_stream_wait_event(stream.handle(), queued)
                             : recorded;
  (void)ph_event_destroy(queued);  // the wait keeps its record alive
  PHANTOM_CHECK(waited);
}

}  // namespace phantom::ccl
