// ELEM: an opaque element of ELEM_BYTES (1, 2, 4 or 8) bytes, for kernels that
// move data without looking at it. 1- and 2-byte elements need 8-/16-bit storage.
#if ELEM_BYTES == 1
#extension GL_EXT_shader_8bit_storage : require
#define ELEM uint8_t
#elif ELEM_BYTES == 2
#extension GL_EXT_shader_16bit_storage : require
#define ELEM uint16_t
#elif ELEM_BYTES == 4
#define ELEM uint
#elif ELEM_BYTES == 8
#define ELEM uvec2
#else
#error "ELEM_BYTES must be 1, 2, 4 or 8"
#endif

#if ELEM_BYTES == 1
#define ELEM_ZERO uint8_t(0)
#elif ELEM_BYTES == 2
#define ELEM_ZERO uint16_t(0)
#elif ELEM_BYTES == 4
#define ELEM_ZERO 0u
#else
#define ELEM_ZERO uvec2(0u)
#endif
