// The FusedMatMul epilogue: act(v + bias) + residual, with `act` a UnaryKind
// (0 = none), evaluated with kmath. Needs kmath.glsl.
#ifndef KILN_EPILOGUE_GLSL
#define KILN_EPILOGUE_GLSL

float k_activate(uint kind, float x) {
  switch (kind) {
    case 2u: return x > 0.0 ? x : 0.0;  // relu
    case 3u: return k_gelu(x);
    case 4u: return k_gelu_tanh(x);
    case 5u: return k_silu(x);
    case 6u: return k_sigmoid(x);
    case 7u: return k_tanh(x);
    case 8u: return k_exp(x);
    case 9u: return k_log(x);
    case 10u: return k_sqrt(x);
    case 11u: return k_rsqrt(x);
    case 12u: return -x;
    case 13u: return abs(x);
    case 14u: return k_sin(x);
    case 15u: return k_cos(x);
    case 16u: return k_erf(x);
    case 17u: return k_floor(x);
    case 18u: return k_ceil(x);
    case 19u: return roundEven(x);
    case 20u: return k_sign(x);
    case 21u: return k_recip(x);
    case 22u: return k_softplus(x);
    default: return x;  // unspecified, identity
  }
}

#endif  // KILN_EPILOGUE_GLSL
