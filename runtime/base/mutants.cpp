#include "runtime/base/mutants.hpp"

#if GRACE_MUTANTS
namespace grace::mutants {

switches& active() {
  static switches s;
  return s;
}

}  // namespace grace::mutants
#endif
