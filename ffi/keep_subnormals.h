// Host float arithmetic with subnormals kept, as the GPU kernels keep them:
// the CPU handlers that add (col2im, scatter-add) then agree with the CUDA
// ones bit for bit.
#ifndef JAX_TMA_FFI_KEEP_SUBNORMALS_H_
#define JAX_TMA_FFI_KEEP_SUBNORMALS_H_

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace jax_tma {

// XLA's CPU runtime runs handlers with subnormals flushed (MXCSR FTZ/DAZ);
// this scope turns both off and restores the caller's mode on exit.
class KeepSubnormals {
 public:
#if defined(__SSE2__)
  KeepSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~kFlushBits); }
  ~KeepSubnormals() { _mm_setcsr(saved_); }

 private:
  static constexpr unsigned kFlushBits = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned saved_;
#endif
};

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_KEEP_SUBNORMALS_H_
