// Per-device facts the launchers need (compute capability, SM count, the
// opt-in shared-memory limit), queried once per device and cached; safe to
// call from many host threads and devices at once.
#ifndef JAX_TMA_FFI_CUDA_DEVICE_INFO_H_
#define JAX_TMA_FFI_CUDA_DEVICE_INFO_H_

#include <array>
#include <mutex>
#include <string>
#include <string_view>

#include "cuda_status.h"

namespace jax_tma {

struct DeviceInfo {
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int smem_per_block_optin = 0;  // bytes
  int smem_per_sm = 0;           // bytes
  // Peak memory bandwidth, TB/s: 2 x memory clock x bus width (0 where the
  // device reports neither); picks the tuned plans (copy/copy_plan.h).
  double memory_tbps = 0;
  bool has_tma() const { return cc_major >= kTmaMinComputeMajor; }
  // The error of a method that cannot run here, spelled as Python's
  // jax_tma/_checks.py require_tma spells it: "method='tma' needs TMA, but
  // device 0 has compute capability 8.0 (TMA needs >= 9.0); use ...".
  std::string NeedsTma(std::string_view method, int device,
                       std::string_view need = "TMA") const {
    Message m;
    m << "method='" << method << "' needs " << need << ", but device " << device
      << " has compute capability " << cc_major << "." << cc_minor
      << " (TMA needs >= " << kTmaMinComputeMajor << ".0); use method='auto' or 'simt'";
    return m.str();
  }
};

// Up to this many device ordinals are cached; the rest are queried per call.
inline constexpr int kMaxCachedDevices = 64;

// Runs `init(device, &value)` once per device ordinal and returns the cached
// value (and the cached error, if the first run failed).
template <typename T>
class PerDevice {
 public:
  template <typename Init>
  ffi::Error Get(int device, Init&& init, T* out) {
    if (device < 0 || device >= kMaxCachedDevices) {
      ffi::Error err = init(device, out);
      return err;
    }
    Slot& s = slots_[device];
    std::call_once(s.once, [&] {
      ffi::Error err = init(device, &s.value);
      s.failed = err.failure();
      if (s.failed) s.message = err.message();
    });
    if (s.failed) return ffi::Error::Internal(s.message);
    *out = s.value;
    return ffi::Error::Success();
  }

 private:
  struct Slot {
    std::once_flag once;
    T value{};
    bool failed = false;
    std::string message;
  };
  std::array<Slot, kMaxCachedDevices> slots_;
};

ffi::Error GetDeviceInfo(int device, DeviceInfo* out);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_DEVICE_INFO_H_
