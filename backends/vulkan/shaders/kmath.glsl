// kmath: f32 math for Vulkan kernels that does not lean on the driver's
// built-ins, whose precision Vulkan leaves loose (exp/log within 3 ULP + 2|x|,
// sin/cos within 2^-11 absolute) and whose handling of subnormal inputs
// (flushed or not) varies by device. Every function here is accurate to a
// few ULP over its whole range, reads subnormal inputs from their bits, and
// follows IEEE 754 / C for NaN, infinities and signed zeros. f16 and bf16 are
// converted in software (round to nearest even), so every device rounds alike.
//
// Included by the hand-written shaders (glslc, build time) and prepended to
// generated elementwise kernels (shaderc, prepare time).
#ifndef KILN_KMATH_GLSL
#define KILN_KMATH_GLSL

#define K_INF uintBitsToFloat(0x7f800000u)
#define K_NAN uintBitsToFloat(0x7fc00000u)

bool k_is_subnormal(float x) {
  const uint b = floatBitsToUint(x);
  return (b & 0x7f800000u) == 0u && (b & 0x007fffffu) != 0u;
}
bool k_sign_bit(float x) { return (floatBitsToUint(x) >> 31) != 0u; }
// 2^e for e in [-126, 127].
float k_pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }
// The subnormal `x`'s magnitude as m * 2^-149 (m < 2^23, exact in f32).
float k_subnormal_mantissa(float x) { return float(floatBitsToUint(x) & 0x007fffffu); }

// ---- exponentials and logarithms ----

float k_exp(float x) {
  if (isnan(x)) return x;
  if (x > 88.72283905206835) return K_INF;
  if (x < -103.97207708) return 0.0;
  const float n = roundEven(x * 1.4426950408889634);
  // Cody-Waite: ln2 = hi + lo with hi short enough that n * hi is exact.
  float r = x - n * 0.693145751953125;
  r = r - n * 1.428606765330187e-6;
  const float p =
      1.0 + r * (1.0 + r * (0.5 + r * (1.6666667e-1 + r * (4.1666668e-2 + r * (8.3333333e-3 +
      r * (1.3888889e-3 + r * 1.9841270e-4))))));
  const int ni = int(n);
  const int h = ni / 2;  // two steps keep 2^128 and subnormal results defined
  return p * k_pow2(h) * k_pow2(ni - h);
}

float k_expm1(float x) {
  if (abs(x) < 0.3465736) {
    return x * (1.0 + x * (0.5 + x * (1.6666667e-1 + x * (4.1666668e-2 + x * (8.3333333e-3 +
           x * (1.3888889e-3 + x * (1.9841270e-4 + x * 2.4801587e-5)))))));
  }
  return k_exp(x) - 1.0;
}

float k_log(float x) {
  uint b = floatBitsToUint(x);
  if ((b & 0x7fffffffu) == 0u) return -K_INF;
  if (isnan(x)) return x;
  if ((b >> 31) != 0u) return K_NAN;
  if (b >= 0x7f800000u) return x;  // +inf
  int e = int(b >> 23) - 127;
  uint mant = b & 0x007fffffu;
  if (e == -127) {  // subnormal: normalize the integer mantissa
    const int shift = 23 - findMSB(mant);
    mant = (mant << shift) & 0x007fffffu;
    e = -126 - shift;
  }
  float f = uintBitsToFloat(mant | 0x3f800000u);  // [1, 2)
  if (f > 1.4142135) {
    f *= 0.5;
    e += 1;
  }
  // log f = 2 atanh(s), s = (f - 1) / (f + 1), |s| <= 0.1716.
  const float s = (f - 1.0) / (f + 1.0);
  const float s2 = s * s;
  const float p = s2 * (6.6666669e-1 + s2 * (4.0000001e-1 + s2 * (2.8571429e-1 + s2 * (2.2222222e-1 +
                  s2 * (1.8181819e-1 + s2 * 1.5384616e-1)))));
  const float ef = float(e);
  return ef * 0.693145751953125 + (ef * 1.428606765330187e-6 + (2.0 * s + s * p));
}

// log(1 + y) for y >= -1, accurate for small y.
float k_log1p(float y) {
  const float u = 1.0 + y;
  if (u == 1.0) return y;
  if (isinf(u)) return u;
  return k_log(u) * (y / (u - 1.0));
}

// ---- roots and reciprocals (subnormal inputs read from their bits) ----

float k_sqrt(float x) {
  if (k_is_subnormal(x)) {
    if (k_sign_bit(x)) return K_NAN;
    return sqrt(2.0 * k_subnormal_mantissa(x)) * k_pow2(-75);  // x = 2m * 2^-150
  }
  return sqrt(x);
}

float k_rsqrt(float x) {
  if (k_is_subnormal(x)) {
    if (k_sign_bit(x)) return K_NAN;
    return inversesqrt(2.0 * k_subnormal_mantissa(x)) * k_pow2(75);
  }
  if (x == 0.0) return k_sign_bit(x) ? -K_INF : K_INF;
  if (isnan(x) || x < 0.0) return K_NAN;
  if (isinf(x)) return 0.0;
  return 1.0 / sqrt(x);
}

float k_recip(float x) {
  if (k_is_subnormal(x)) {
    const float r = (1.0 / k_subnormal_mantissa(x)) * k_pow2(74) * k_pow2(75);  // 2^149 / m
    return k_sign_bit(x) ? -r : r;
  }
  return 1.0 / x;
}

float k_floor(float x) {
  if (k_is_subnormal(x)) return k_sign_bit(x) ? -1.0 : 0.0;
  return floor(x);
}
float k_ceil(float x) {
  if (k_is_subnormal(x)) return k_sign_bit(x) ? -0.0 : 1.0;
  return ceil(x);
}
// 1, -1, or x itself for zeros and NaN.
float k_sign(float x) {
  if (isnan(x) || (floatBitsToUint(x) & 0x7fffffffu) == 0u) return x;
  return k_sign_bit(x) ? -1.0 : 1.0;
}
bool k_nonzero(float x) { return (floatBitsToUint(x) & 0x7fffffffu) != 0u; }
bool k_less(float a, float b) {
  // Subnormal-exact ordering: compare magnitudes' bits when both are tiny.
  if (k_is_subnormal(a) || k_is_subnormal(b)) {
    const int ia = int(floatBitsToUint(a) & 0x7fffffffu) * (k_sign_bit(a) ? -1 : 1);
    const int ib = int(floatBitsToUint(b) & 0x7fffffffu) * (k_sign_bit(b) ? -1 : 1);
    return !isnan(a) && !isnan(b) && ia < ib;
  }
  return a < b;
}

// ---- error function, activations ----

// erfc with fractional error < 1.2e-7 (Numerical Recipes' Chebyshev fit).
float k_erfc(float x) {
  if (isnan(x)) return x;
  const float z = abs(x);
  const float t = 1.0 / (1.0 + 0.5 * z);
  const float poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
                     t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
                     t * (-0.82215223 + t * 0.17087277))))))));
  const float r = t * k_exp(-z * z + poly);
  return x >= 0.0 ? r : 2.0 - r;
}

float k_erf(float x) {
  if (abs(x) < 0.5) {
    const float x2 = x * x;
    return x * (1.1283792 + x2 * (-3.7612639e-1 + x2 * (1.1283792e-1 + x2 * (-2.6866171e-2 +
           x2 * (5.2239776e-3 + x2 * (-8.5483270e-4 + x2 * 1.2055333e-4))))));
  }
  if (isnan(x)) return x;
  const float r = 1.0 - k_erfc(abs(x));
  return x < 0.0 ? -r : r;
}

float k_tanh(float x) {
  if (isnan(x)) return x;
  const float ax = abs(x);
  if (ax > 9.1) return x < 0.0 ? -1.0 : 1.0;
  const float em = k_expm1(-2.0 * ax);  // (-1, 0]
  const float t = -em / (2.0 + em);
  return x < 0.0 ? -t : t;
}

float k_sigmoid(float x) { return 1.0 / (1.0 + k_exp(-x)); }

float k_silu(float x) {
  if (isinf(x)) return x > 0.0 ? x : 0.0;
  return x / (1.0 + k_exp(-x));
}

float k_gelu(float x) {
  if (isinf(x)) return x > 0.0 ? x : 0.0;
  return 0.5 * x * k_erfc(-x * 0.70710678118654752);
}

// 0.5 x (1 + tanh(u)) written as x * sigmoid(2u): no cancellation for x < 0.
float k_gelu_tanh(float x) {
  if (isinf(x)) return x > 0.0 ? x : 0.0;
  const float u = 0.79788456080286536 * (x + 0.044715 * x * x * x);
  return x / (1.0 + k_exp(-2.0 * u));
}

float k_softplus(float x) {
  if (isnan(x)) return x;
  return max(x, 0.0) + k_log1p(k_exp(-abs(x)));
}

// ---- sine and cosine ----

// x = q * pi/2 + r with |r| <= pi/4 (plus rounding); returns r, sets q (mod 4).
// Cody-Waite below 1000; Payne-Hanek with 96 bits of 2/pi above.
float k_reduce_pio2(float x, out uint q) {
  const float ax = abs(x);
  if (ax < 1000.0) {
    const float n = roundEven(ax * 0.63661977236758134);
    float r = ax - n * 1.5703125;  // pi/2 in three parts; n * part1 is exact
    r = r - n * 4.837512969970703125e-4;
    r = r - n * 7.54978995489188216e-8;
    q = uint(n) & 3u;
    return r;
  }
  // |x| = m * 2^e; take the 96 bits of 2/pi that decide (m * 2^e * 2/pi) mod 4.
  const uint TWO_OVER_PI[10] = uint[10](0xa2f9836eu, 0x4e441529u, 0xfc2757d1u, 0xf534ddc0u,
                                        0xdb629599u, 0x3c439041u, 0xfe5163abu, 0xdebbc561u,
                                        0xb7246e3au, 0x424dd2e0u);
  const uint b = floatBitsToUint(ax);
  const int e = int(b >> 23) - 150;
  const uint m = (b & 0x007fffffu) | 0x00800000u;
  const int k0 = max(0, (e - 2) >> 5);
  const int s = 32 * k0 + 96 - e;  // fraction bits of the product P = m * W
  // P = m * (W0 W1 W2), 128 bits in p3 p2 p1 p0.
  uint h2, l2, h1, l1, h0, l0;
  umulExtended(m, TWO_OVER_PI[k0 + 2], h2, l2);
  umulExtended(m, TWO_OVER_PI[k0 + 1], h1, l1);
  umulExtended(m, TWO_OVER_PI[k0], h0, l0);
  uint c1, c2, c3;
  const uint p0 = l2;
  const uint p1 = uaddCarry(h2, l1, c1);
  uint p2 = uaddCarry(h1, l0, c2);
  p2 = uaddCarry(p2, c1, c3);
  const uint p3 = h0 + c2 + c3;
  // Bits [s - 64, s + 2) of P: the quadrant and 62 fraction bits, left-aligned in (w1, w0).
  uint words[4] = uint[4](p0, p1, p2, p3);
  const int lo_bit = s - 62;  // >= 0 for every finite |x| >= 1000
  const int wi = lo_bit >> 5, sh = lo_bit & 31;
  uint a0 = words[wi], a1 = wi + 1 < 4 ? words[wi + 1] : 0u, a2 = wi + 2 < 4 ? words[wi + 2] : 0u;
  const uint w0 = sh == 0 ? a0 : (a0 >> sh) | (a1 << (32 - sh));
  const uint w1 = sh == 0 ? a1 : (a1 >> sh) | (a2 << (32 - sh));
  // w1 w0 = 64 bits: top 2 = quadrant, next 62 = fraction.
  q = w1 >> 30;
  const uint f_hi = (w1 << 2) | (w0 >> 30);
  const uint f_lo = w0 << 2;
  float f = float(f_hi) * 2.3283064365386963e-10 + float(f_lo) * 5.421010862427522e-20;
  if (f >= 0.5) {
    f -= 1.0;
    q = (q + 1u) & 3u;
  }
  return f * 1.5707963267948966;
}

float k_sin_poly(float r) {
  const float z = r * r;
  return ((-1.9515295891e-4 * z + 8.3321608736e-3) * z - 1.6666654611e-1) * z * r + r;
}
float k_cos_poly(float r) {
  const float z = r * r;
  return ((2.443315711809948e-5 * z - 1.388731625493765e-3) * z + 4.166664568298827e-2) * z * z -
         0.5 * z + 1.0;
}

float k_sin(float x) {
  if (isnan(x) || isinf(x)) return K_NAN;
  uint q;
  const float r = k_reduce_pio2(x, q);
  float v = (q & 1u) == 0u ? k_sin_poly(r) : k_cos_poly(r);
  if (q >= 2u) v = -v;
  return x < 0.0 ? -v : v;
}

float k_cos(float x) {
  if (isnan(x) || isinf(x)) return K_NAN;
  uint q;
  const float r = k_reduce_pio2(x, q);
  const float v = (q & 1u) == 0u ? k_cos_poly(r) : k_sin_poly(r);
  return (q == 1u || q == 2u) ? -v : v;
}

// ---- pow, following C's pow for every special case ----

float k_pow(float x, float y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (isnan(x) || isnan(y)) return K_NAN;
  const float ay = abs(y);
  const bool y_int = !isinf(y) && floor(y) == y;
  const bool y_odd = y_int && ay < 16777216.0 && (uint(ay) & 1u) == 1u;
  if (isinf(y)) {
    const float ax = abs(x);
    if (ax == 1.0) return 1.0;
    return ((ax > 1.0) == (y > 0.0)) ? K_INF : 0.0;
  }
  if (!k_nonzero(x)) {
    const bool neg = k_sign_bit(x) && y_odd;
    if (y < 0.0) return neg ? -K_INF : K_INF;
    return neg ? -0.0 : 0.0;
  }
  if (isinf(x)) {
    if (x > 0.0) return y > 0.0 ? K_INF : 0.0;
    if (y > 0.0) return y_odd ? -K_INF : K_INF;
    return y_odd ? -0.0 : 0.0;
  }
  if (x < 0.0 && !y_int) return K_NAN;
  const float r = k_exp(y * k_log(abs(x)));
  return (x < 0.0 && y_odd) ? -r : r;
}

// ---- 16-bit float storage ----

float k_f16_to_f32(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1fu;
  const uint m = h & 0x3ffu;
  if (e == 0u) {
    const float v = float(m) * 5.9604644775390625e-8;  // m * 2^-24, a normal f32
    return (sign != 0u) ? -v : v;
  }
  if (e == 31u) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));
  return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// Round to nearest even; overflow to infinity; NaN stays NaN.
uint k_f32_to_f16(float f) {
  const uint bits = floatBitsToUint(f);
  const uint sign = (bits >> 16) & 0x8000u;
  const uint a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;
  if (a >= 0x47800000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {  // subnormal or zero in f16
    if (a < 0x33000000u) return sign;
    const uint e = a >> 23;
    const uint m = (a & 0x7fffffu) | 0x800000u;
    const uint shift = 126u - e;
    const uint rem = m & ((1u << shift) - 1u);
    const uint halfway = 1u << (shift - 1u);
    uint r = m >> shift;
    if (rem > halfway || (rem == halfway && (r & 1u) != 0u)) r += 1u;
    return sign | r;
  }
  uint r = a - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | (r >> 13);
}

float k_bf16_to_f32(uint h) { return uintBitsToFloat(h << 16); }

uint k_f32_to_bf16(float f) {
  const uint bits = floatBitsToUint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (bits >> 16) | 0x40u;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

float k_round_f16(float v) { return k_f16_to_f32(k_f32_to_f16(v)); }
float k_round_bf16(float v) { return k_bf16_to_f32(k_f32_to_bf16(v)); }

#endif  // KILN_KMATH_GLSL
