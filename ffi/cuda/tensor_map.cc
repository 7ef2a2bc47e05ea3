// Tiled and im2col tensor-map encoding (see tensor_map.h). The driver
// functions come from driver_api.h.
#include "tensor_map.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncode{Tiled,Im2col}_v12000
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cuda_status.h"  // JAX_TMA_RETURN_IF_FAILED
#include "driver_api.h"

namespace jax_tma {
namespace {

// Resolved once per process (function-local statics: thread-safe).
const DriverEntry<PFN_cuTensorMapEncodeTiled_v12000>& GetTiledEncoder() {
  static const auto encoder =
      ResolveDriverEntry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return encoder;
}

const DriverEntry<PFN_cuTensorMapEncodeIm2col_v12000>& GetIm2colEncoder() {
  static const auto encoder =
      ResolveDriverEntry<PFN_cuTensorMapEncodeIm2col_v12000>("cuTensorMapEncodeIm2col", 12000);
  return encoder;
}

// What every encode checks first: the spec's first broken rule (`broken`,
// empty if none; `describe` lists the spec), the map object's alignment and
// the driver entry point.
template <typename Describe, typename Fn>
ffi::Error BeforeEncode(std::string_view op, const std::string& broken, Describe&& describe,
                        const CUtensorMap* map, const DriverEntry<Fn>& enc) {
  if (!broken.empty()) {
    return InvalidArgument(op, "tensor map: ", broken, " (", describe(), ")");
  }
  if (reinterpret_cast<std::uintptr_t>(map) % 64 != 0) {
    return InvalidArgument(op, "tensor map object at ", static_cast<const void*>(map),
                           " is not 64-B aligned");
  }
  if (enc.fn == nullptr) {
    Message os;
    os << op << ": " << enc.error;
    return ffi::Error::Internal(os.str());
  }
  return ffi::Error::Success();
}

const char* CuResultName(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return "unlisted CUresult";
  }
}

template <typename T>
void PrintArray(Message& os, const T* v, int n) {
  os << "[";
  for (int i = 0; i < n; ++i) os << (i ? ", " : "") << v[i];
  os << "]";
}

}  // namespace

int TensorMapElementBytes(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return 1;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return 2;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: return 4;
    case CU_TENSOR_MAP_DATA_TYPE_UINT64:
    case CU_TENSOR_MAP_DATA_TYPE_INT64:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return 8;
    default: return 0;  // packed 16U4 / 16U6 types
  }
}

const char* TensorMapDataTypeName(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return "u8";
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: return "u16";
    case CU_TENSOR_MAP_DATA_TYPE_UINT32: return "u32";
    case CU_TENSOR_MAP_DATA_TYPE_INT32: return "s32";
    case CU_TENSOR_MAP_DATA_TYPE_UINT64: return "u64";
    case CU_TENSOR_MAP_DATA_TYPE_INT64: return "s64";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16: return "f16";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return "f32";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return "f64";
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return "bf16";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ: return "f32_ftz";
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32: return "tf32";
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ: return "tf32_ftz";
    default: return "packed";
  }
}

bool TensorMapIsFloat(CUtensorMapDataType type) {
  switch (type) {
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
      return true;
    default:
      return false;
  }
}

CUtensorMapDataType UnsignedTensorMapType(int bytes) {
  switch (bytes) {
    case 2: return CU_TENSOR_MAP_DATA_TYPE_UINT16;
    case 4: return CU_TENSOR_MAP_DATA_TYPE_UINT32;
    case 8: return CU_TENSOR_MAP_DATA_TYPE_UINT64;
    default: return CU_TENSOR_MAP_DATA_TYPE_UINT8;
  }
}

std::string CheckTiledMap(const TiledMapSpec& s) {
  Message os;
  if (s.rank < 1 || s.rank > kMaxTensorMapRank) {
    os << "rank " << s.rank << " is outside the hardware's [1, " << kMaxTensorMapRank << "]";
    return os.str();
  }
  const int eb = TensorMapElementBytes(s.type);
  if (eb == 0) {
    os << "data type " << static_cast<int>(s.type) << " is a packed type, not supported here";
    return os.str();
  }
  if (reinterpret_cast<std::uintptr_t>(s.address) % kTensorMapAlign != 0) {
    os << "address " << s.address << " is not 16-B aligned";
    return os.str();
  }
  for (int i = 0; i < s.rank; ++i) {
    if (s.dims[i] < 1 || s.dims[i] > kMaxTensorMapDim) {
      os << "dim " << i << " = " << s.dims[i] << " is outside [1, 2^32]";
      return os.str();
    }
  }
  for (int i = 1; i < s.rank; ++i) {
    const uint64_t st = s.byte_strides[i - 1];
    const char* name = i == 1 ? "row stride" : "stride";
    if (st % kTensorMapAlign != 0) {
      if (i == 1) {
        os << name << " " << st << " B is not a multiple of 16";
      } else {
        os << "dim " << i << " " << name << " " << st << " B is not a multiple of 16";
      }
      return os.str();
    }
    if (st >= kTensorMapStrideLimit) {
      os << "dim " << i << " stride " << st << " B is not below 2^40";
      return os.str();
    }
  }
  for (int i = 0; i < s.rank; ++i) {
    if (s.box[i] < 1 || s.box[i] > kMaxTensorMapBox) {
      os << "box[" << i << "] = " << s.box[i] << " is outside [1, " << kMaxTensorMapBox << "]";
      return os.str();
    }
  }
  if ((static_cast<uint64_t>(s.box[0]) * eb) % kTensorMapAlign != 0) {
    os << "inner box " << s.box[0] << " x " << eb << " B = " << s.box[0] * eb
       << " B is not a multiple of 16";
    return os.str();
  }
  for (int i = 0; i < s.rank; ++i) {
    if (s.elem_strides[i] < 1 || s.elem_strides[i] > kMaxTensorMapElementStride) {
      os << "element stride[" << i << "] = " << s.elem_strides[i] << " is outside [1, "
         << kMaxTensorMapElementStride << "]";
      return os.str();
    }
  }
  if (s.nan_fill && !TensorMapIsFloat(s.type)) {
    os << "NaN fill needs a float data type (got " << TensorMapDataTypeName(s.type) << ")";
    return os.str();
  }
  return std::string();
}

std::string CheckTiledMaps(std::initializer_list<const TiledMapSpec*> specs) {
  for (const TiledMapSpec* s : specs) {
    const std::string broken = CheckTiledMap(*s);
    if (!broken.empty()) return broken + " (" + DescribeTiledMap(*s) + ")";
  }
  return std::string();
}

std::string DescribeTiledMap(const TiledMapSpec& s) {
  Message os;
  const int r = s.rank < 0 ? 0 : (s.rank > kMaxTensorMapRank ? kMaxTensorMapRank : s.rank);
  os << "type=" << TensorMapDataTypeName(s.type) << " rank=" << s.rank
     << " address=" << s.address << " dims=";
  PrintArray(os, s.dims, r);
  os << " byte strides=";
  PrintArray(os, s.byte_strides, r > 0 ? r - 1 : 0);
  os << " box=";
  PrintArray(os, s.box, r);
  os << " element strides=";
  PrintArray(os, s.elem_strides, r);
  os << " interleave=none swizzle=none l2 promotion=";
  switch (s.l2_promotion) {
    case CU_TENSOR_MAP_L2_PROMOTION_NONE: os << "none"; break;
    case CU_TENSOR_MAP_L2_PROMOTION_L2_64B: os << "64B"; break;
    case CU_TENSOR_MAP_L2_PROMOTION_L2_128B: os << "128B"; break;
    case CU_TENSOR_MAP_L2_PROMOTION_L2_256B: os << "256B"; break;
    default: os << static_cast<int>(s.l2_promotion); break;
  }
  os << " oob fill=" << (s.nan_fill ? "nan" : "zero");
  return os.str();
}

ffi::Error EncodeTiled(std::string_view op, const TiledMapSpec& spec, CUtensorMap* map) {
  const auto& enc = GetTiledEncoder();
  JAX_TMA_RETURN_IF_FAILED(BeforeEncode(op, CheckTiledMap(spec),
                                        [&] { return DescribeTiledMap(spec); }, map, enc));
  cuuint64_t dims[kMaxTensorMapRank];
  cuuint64_t strides[kMaxTensorMapRank - 1];
  cuuint32_t box[kMaxTensorMapRank];
  cuuint32_t estr[kMaxTensorMapRank];
  for (int i = 0; i < spec.rank; ++i) {
    dims[i] = spec.dims[i];
    box[i] = spec.box[i];
    estr[i] = spec.elem_strides[i];
    if (i > 0) strides[i - 1] = spec.byte_strides[i - 1];
  }
  const CUresult res = enc.fn(
      map, spec.type, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.address),
      dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
      spec.l2_promotion,
      spec.nan_fill ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                    : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    Message os;
    os << op << ": cuTensorMapEncodeTiled failed with CUresult " << static_cast<int>(res)
       << " (" << CuResultName(res) << ") for " << DescribeTiledMap(spec);
    return ffi::Error::Internal(os.str());
  }
  return ffi::Error::Success();
}

int32_t Im2colCornerMax(int rank) {
  return rank == 3 ? 32767 : (rank == 4 ? 127 : 15);
}

std::string CheckIm2colMap(const Im2colMapSpec& s) {
  Message os;
  if (s.rank < 3 || s.rank > kMaxTensorMapRank) {
    os << "im2col rank " << s.rank << " is outside the hardware's [3, " << kMaxTensorMapRank
       << "]";
    return os.str();
  }
  // The rules shared with tiled maps (address, dims, strides, element
  // strides), checked through an equivalent tiled spec with a legal box.
  TiledMapSpec t;
  t.type = s.type;
  t.rank = s.rank;
  t.address = s.address;
  for (int i = 0; i < s.rank; ++i) {
    t.dims[i] = s.dims[i];
    t.box[i] = i == 0 ? kTensorMapAlign : 1;
    t.elem_strides[i] = s.elem_strides[i];
    if (i > 0) t.byte_strides[i - 1] = s.byte_strides[i - 1];
  }
  const int eb = TensorMapElementBytes(s.type);
  if (eb != 0) t.box[0] = static_cast<uint32_t>(kTensorMapAlign / eb);
  std::string shared = CheckTiledMap(t);
  if (!shared.empty()) return shared;
  const int32_t m = Im2colCornerMax(s.rank);
  for (int i = 0; i < s.rank - 2; ++i) {
    for (const auto& [name, v] : {std::pair{"lower", s.lower_corner[i]},
                                  std::pair{"upper", s.upper_corner[i]}}) {
      if (v < -m - 1 || v > m) {
        os << "pixel-box " << name << " corner " << v << " of spatial dim " << i
           << " (innermost first) is outside the hardware's [" << -m - 1 << ", " << m
           << "] for a rank-" << s.rank << " tensor";
        return os.str();
      }
    }
    const int64_t extent = static_cast<int64_t>(s.dims[i + 1]) - 1 + s.upper_corner[i] -
                           s.lower_corner[i] + 1;
    if (extent < 1) {
      os << "the pixel box of spatial dim " << i << " is empty (corners " << s.lower_corner[i]
         << ", " << s.upper_corner[i] << " on a dim of " << s.dims[i + 1] << ")";
      return os.str();
    }
  }
  if (s.channels_per_pixel < 1 || s.channels_per_pixel > kMaxIm2colChannels) {
    os << "channels per pixel " << s.channels_per_pixel << " is outside [1, "
       << kMaxIm2colChannels << "]";
    return os.str();
  }
  if ((static_cast<uint64_t>(s.channels_per_pixel) * eb) % kTensorMapAlign != 0) {
    os << "channels per pixel " << s.channels_per_pixel << " x " << eb << " B is not a multiple of 16";
    return os.str();
  }
  if (s.pixels_per_column < 1 || s.pixels_per_column > kMaxIm2colPixels) {
    os << "pixels per column " << s.pixels_per_column << " is outside [1, " << kMaxIm2colPixels
       << "]";
    return os.str();
  }
  return std::string();
}

std::string DescribeIm2colMap(const Im2colMapSpec& s) {
  Message os;
  const int r = s.rank < 3 ? 3 : (s.rank > kMaxTensorMapRank ? kMaxTensorMapRank : s.rank);
  os << "type=" << TensorMapDataTypeName(s.type) << " rank=" << s.rank
     << " address=" << s.address << " dims=";
  PrintArray(os, s.dims, r);
  os << " byte strides=";
  PrintArray(os, s.byte_strides, r - 1);
  os << " lower corner=";
  PrintArray(os, s.lower_corner, r - 2);
  os << " upper corner=";
  PrintArray(os, s.upper_corner, r - 2);
  os << " channels per pixel=" << s.channels_per_pixel
     << " pixels per column=" << s.pixels_per_column << " element strides=";
  PrintArray(os, s.elem_strides, r);
  os << " interleave=none swizzle=none l2 promotion=128B oob fill=zero";
  return os.str();
}

ffi::Error EncodeIm2col(std::string_view op, const Im2colMapSpec& spec, CUtensorMap* map) {
  const auto& enc = GetIm2colEncoder();
  JAX_TMA_RETURN_IF_FAILED(BeforeEncode(op, CheckIm2colMap(spec),
                                        [&] { return DescribeIm2colMap(spec); }, map, enc));
  cuuint64_t dims[kMaxTensorMapRank];
  cuuint64_t strides[kMaxTensorMapRank - 1];
  cuuint32_t estr[kMaxTensorMapRank];
  for (int i = 0; i < spec.rank; ++i) {
    dims[i] = spec.dims[i];
    estr[i] = spec.elem_strides[i];
    if (i > 0) strides[i - 1] = spec.byte_strides[i - 1];
  }
  const CUresult res = enc.fn(
      map, spec.type, static_cast<cuuint32_t>(spec.rank), const_cast<void*>(spec.address),
      dims, strides, spec.lower_corner, spec.upper_corner, spec.channels_per_pixel,
      spec.pixels_per_column, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (res != CUDA_SUCCESS) {
    Message os;
    os << op << ": cuTensorMapEncodeIm2col failed with CUresult " << static_cast<int>(res)
       << " (" << CuResultName(res) << ") for " << DescribeIm2colMap(spec);
    return ffi::Error::Internal(os.str());
  }
  return ffi::Error::Success();
}

}  // namespace jax_tma
