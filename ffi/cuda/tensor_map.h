// Host-side tensor-map (TMA descriptor) encoding shared by the CUDA handlers:
// the driver's cuTensorMapEncode* entry points resolved once through cudart
// (nothing links libcuda), every documented rule checked first so that errors
// name the rule and its values, and driver failures reported with every
// encode argument.
#ifndef JAX_TMA_FFI_CUDA_TENSOR_MAP_H_
#define JAX_TMA_FFI_CUDA_TENSOR_MAP_H_

#include <cuda.h>  // CUtensorMap and its enums only; libcuda is never linked

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "../common.h"

namespace jax_tma {

inline constexpr int kMaxTensorMapRank = 5;
inline constexpr uint32_t kMaxTensorMapBox = 256;          // per box dim
inline constexpr uint32_t kMaxTensorMapElementStride = 8;
inline constexpr uint64_t kTensorMapAlign = kTmaAlignBytes;  // address, strides, inner box bytes
inline constexpr uint64_t kMaxTensorMapDim = uint64_t{1} << 32;
inline constexpr uint64_t kTensorMapStrideLimit = uint64_t{1} << 40;  // strides are below this

// Bytes per element of a tensor-map data type; 0 for the packed sub-byte types.
int TensorMapElementBytes(CUtensorMapDataType type);
const char* TensorMapDataTypeName(CUtensorMapDataType type);
// Whether the type may use the NaN out-of-bounds fill.
bool TensorMapIsFloat(CUtensorMapDataType type);
// UINT8/16/32/64 for 1/2/4/8 bytes: a bit-exact copy type (UINT8 otherwise).
CUtensorMapDataType UnsignedTensorMapType(int bytes);

// Everything cuTensorMapEncodeTiled takes, non-interleaved and unswizzled.
// Arrays are innermost dim first; byte_strides[i] is the stride of dim i + 1.
struct TiledMapSpec {
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  int rank = 0;
  const void* address = nullptr;
  uint64_t dims[kMaxTensorMapRank] = {};
  uint64_t byte_strides[kMaxTensorMapRank - 1] = {};
  uint32_t box[kMaxTensorMapRank] = {};
  uint32_t elem_strides[kMaxTensorMapRank] = {};
  bool nan_fill = false;  // out-of-bounds elements read as NaN, else zero
  CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
};

// The first driver rule (CUDA 13.0 cuda.h, cuTensorMapEncodeTiled) that
// `spec` breaks, with its values, e.g. "row stride 18 B is not a multiple of
// 16"; empty when every rule holds. Pure host arithmetic, no CUDA calls.
std::string CheckTiledMap(const TiledMapSpec& spec);

// CheckTiledMap over several maps: the first broken rule followed by that
// map's description, or empty when every map holds every rule.
std::string CheckTiledMaps(std::initializer_list<const TiledMapSpec*> specs);

// "type=u32 rank=2 address=0x... dims=[...] ..." for error messages.
std::string DescribeTiledMap(const TiledMapSpec& spec);

// Checks `spec` (InvalidArgument naming `op` and the rule) and encodes it into
// `*map`, which must be 64-B aligned (CUtensorMap's own alignment). A driver
// failure is an Internal error listing every encode argument and the CUresult.
// Thread-safe; the driver entry point is resolved on first use.
ffi::Error EncodeTiled(std::string_view op, const TiledMapSpec& spec, CUtensorMap* map);

// Everything cuTensorMapEncodeIm2col takes, non-interleaved and unswizzled,
// zero out-of-bounds fill. Arrays are innermost dim first (C, W, H, D, N);
// corners per spatial dim, innermost (W) first.
struct Im2colMapSpec {
  CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  int rank = 0;  // 3, 4 or 5
  const void* address = nullptr;
  uint64_t dims[kMaxTensorMapRank] = {};
  uint64_t byte_strides[kMaxTensorMapRank - 1] = {};
  int32_t lower_corner[kMaxTensorMapRank - 2] = {};
  int32_t upper_corner[kMaxTensorMapRank - 2] = {};
  uint32_t channels_per_pixel = 0;
  uint32_t pixels_per_column = 0;
  uint32_t elem_strides[kMaxTensorMapRank] = {};
};

inline constexpr uint32_t kMaxIm2colChannels = 256;
inline constexpr uint32_t kMaxIm2colPixels = 1024;

// The largest pixel-box corner magnitude of a rank-`rank` im2col map: the
// corners are [-m-1, m] (rank 3: 32767, rank 4: 127, rank 5: 15).
int32_t Im2colCornerMax(int rank);

// The first driver rule (CUDA 13.0 cuda.h, cuTensorMapEncodeIm2col) that
// `spec` breaks, with its values; empty when every rule holds.
std::string CheckIm2colMap(const Im2colMapSpec& spec);
std::string DescribeIm2colMap(const Im2colMapSpec& spec);

// As EncodeTiled, for an im2col map.
ffi::Error EncodeIm2col(std::string_view op, const Im2colMapSpec& spec, CUtensorMap* map);

}  // namespace jax_tma

#endif  // JAX_TMA_FFI_CUDA_TENSOR_MAP_H_
