// See phantom/ccl/Communicator.h.
#include <phantom/ccl/Communicator.h>

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

}  // namespace phantom::ccl
