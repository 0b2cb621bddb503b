// The tensor dtype of a hand-written kernel variant, chosen by one of
// DT_F32, DT_F16, DT_BF16, DT_I8, DT_U8, DT_I16, DT_I32, DT_I64:
//   BUF_T            the storage buffer element
//   VAL_T            the register type it is computed in (float, int, int64_t)
//   LOAD_VAL(e)      a BUF_T element -> VAL_T
//   STORE_VAL(v)     a VAL_T -> BUF_T (f16/bf16 round to nearest even;
//                    integers wrap)
//   VAL_LOWEST / VAL_HIGHEST / VAL_ZERO / VAL_ONE, VAL_IS_FLOAT
// f16 and bf16 go through kmath's software conversions (16-bit storage only).
#include "kmath.glsl"

#if defined(DT_F32) || defined(DT_F16) || defined(DT_BF16)
#define VAL_T float
#define VAL_IS_FLOAT 1
#define VAL_LOWEST (-K_INF)
#define VAL_HIGHEST K_INF
#define VAL_ZERO 0.0
#define VAL_ONE 1.0
#else
#define VAL_IS_FLOAT 0
#endif

#if defined(DT_F32)
#define BUF_T float
#define LOAD_VAL(e) (e)
#define STORE_VAL(v) (v)
#elif defined(DT_F16)
#extension GL_EXT_shader_16bit_storage : require
#define BUF_T uint16_t
#define LOAD_VAL(e) k_f16_to_f32(uint(e))
#define STORE_VAL(v) uint16_t(k_f32_to_f16(v))
#elif defined(DT_BF16)
#extension GL_EXT_shader_16bit_storage : require
#define BUF_T uint16_t
#define LOAD_VAL(e) k_bf16_to_f32(uint(e))
#define STORE_VAL(v) uint16_t(k_f32_to_bf16(v))
#elif defined(DT_I64)
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#define BUF_T int64_t
#define VAL_T int64_t
#define LOAD_VAL(e) (e)
#define STORE_VAL(v) (v)
#define VAL_LOWEST (-9223372036854775807l - 1l)
#define VAL_HIGHEST 9223372036854775807l
#define VAL_ZERO 0l
#define VAL_ONE 1l
#else
#define VAL_T int
#define VAL_LOWEST (-2147483647 - 1)
#define VAL_HIGHEST 2147483647
#define VAL_ZERO 0
#define VAL_ONE 1
#if defined(DT_I32)
#define BUF_T int
#define LOAD_VAL(e) (e)
#define STORE_VAL(v) (v)
#elif defined(DT_I16)
#extension GL_EXT_shader_16bit_storage : require
#define BUF_T int16_t
#define LOAD_VAL(e) int(e)
#define STORE_VAL(v) int16_t(v)
#elif defined(DT_I8)
#extension GL_EXT_shader_8bit_storage : require
#define BUF_T int8_t
#define LOAD_VAL(e) int(e)
#define STORE_VAL(v) int8_t(v)
#elif defined(DT_U8)
#extension GL_EXT_shader_8bit_storage : require
#define BUF_T uint8_t
#define LOAD_VAL(e) int(uint(e))
#define STORE_VAL(v) uint8_t(uint(v))
#else
#error "define one DT_* dtype"
#endif
#endif
