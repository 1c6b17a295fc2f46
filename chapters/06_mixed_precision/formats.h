// The number formats of mixed-precision training, written out bit by bit.
//
//             sign  exponent  mantissa   largest     smallest normal   smallest subnormal  1 + ulp
//   fp32        1      8        23       3.4e38      1.2e-38 (2^-126)  1.4e-45 (2^-149)    1 + 2^-23
//   tf32        1      8        10       3.4e38      1.2e-38           (as fp32)           1 + 2^-10
//   bf16        1      8         7       3.4e38      1.2e-38           9.2e-41 (2^-133)    1 + 2^-7
//   fp16        1      5        10       65504       6.1e-5 (2^-14)    6.0e-8 (2^-24)      1 + 2^-10
//
// bf16 is fp32 with the low 16 bits cut off: the same range, 3 significant digits. fp16 keeps
// more digits but its exponent is 5 bits: a magnitude of 65520 or more overflows to infinity
// (between 65504 and 65520 it rounds down to 65504), and one of 2^-25 or less underflows to
// zero (between 2^-25 and 2^-24 it rounds up to 2^-24; 2^-25 itself is a tie, which goes to the
// even 0). (tf32 is not a storage format: it is what NVIDIA's tensor cores read of an fp32
// input, a 19-bit number held in 32 bits.)
//
// A 16-bit value here is its bit pattern, a std::uint16_t: nothing in C++17 (or in both of
// this repository's compilers) is a portable 16-bit float type, and the bits are the lesson.
// Every conversion from fp32 rounds to nearest, ties to even (what cuda_bf16.h's
// __float2bfloat16 and cuda_fp16.h's __float2half do, and what IEEE 754 asks by default);
// NaN stays NaN, values too large become infinity.
// Written once, as MGPU_HD functions: the host, the cpu devices and GPU kernels use the same.
#pragma once
#include <cstdint>
#include <cstring>

#include "common/backend.h"
#include "common/exercise.h"  // the student copy's holes call mgpu::exercise_not_done

namespace mixed {

// What a GEMM reads its inputs as (--precision). The accumulation is fp32 in every case.
enum class Precision { FP32, TF32, BF16, FP16 };
// Whether values are stored in 16 bits (bf16, fp16): what the 16-bit gradient exchange and the
// flushed-gradient report apply to. TF32 is a compute mode on fp32 storage.
inline bool sixteen_bits(Precision p) { return p == Precision::BF16 || p == Precision::FP16; }

MGPU_HD inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);  // the one portable way to read a float's bits (nvcc too)
  return u;
}
MGPU_HD inline float float_of(std::uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
MGPU_HD inline bool is_nan_bits(std::uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }
// Neither infinite nor NaN: the exponent is not all ones. (Read from the bits, so that no
// compiler flag such as -ffast-math can assume it away.)
MGPU_HD inline bool is_finite(float f) { return (bits_of(f) & 0x7f800000u) != 0x7f800000u; }

// ---- bf16: the top 16 bits of an fp32 -------------------------------------------------------

// fp32 -> bf16, rounding the 16 bits that are dropped to nearest, ties to even.
MGPU_HD inline std::uint16_t to_bf16(float f) {
  std::uint32_t u = bits_of(f);
  // BEGIN EXERCISE ex06.to_bf16
  if (is_nan_bits(u)) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // a quiet NaN, never inf
  // Adding 0x7fff rounds up exactly when the dropped half is above 0x8000; at 0x8000 (a tie)
  // the +1 for an odd kept part makes it round up to even. A carry out of the mantissa moves
  // the exponent up, as it should (and past the largest finite value to infinity).
  const std::uint32_t kept_lsb = (u >> 16) & 1u;
  u += 0x7fffu + kept_lsb;
  return static_cast<std::uint16_t>(u >> 16);
  // END EXERCISE ex06.to_bf16
}
MGPU_HD inline float from_bf16(std::uint16_t h) { return float_of(std::uint32_t(h) << 16); }  // exact

// ---- fp16: 5 exponent bits (bias 15), 10 mantissa bits -------------------------------------

// Rounds the significand m to nearest, ties to even, after dropping its `shift` low bits.
// (1 <= shift <= 31.)
MGPU_HD inline std::uint32_t shift_right_rounded(std::uint32_t m, int shift) {
  // BEGIN EXERCISE ex06.to_bf16
  const std::uint32_t kept = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
  // END EXERCISE ex06.to_bf16
}

MGPU_HD inline std::uint16_t to_fp16(float f) {
  const std::uint32_t u = bits_of(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;  // |f|
  if (is_nan_bits(a)) return sign | 0x7e00u;  // a quiet NaN
  // 65520 (0x477ff000) is halfway between 65504, the largest fp16 (odd mantissa 0x3ff), and
  // 65536, which would be the next: the tie goes to the even one, infinity. So does inf.
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a >= 0x38800000u) {  // 2^-14 and above: a normal fp16
    const std::uint32_t exponent = (a >> 23) - 127u + 15u;  // 1..30
    // Exponent and mantissa side by side, then rounded: a carry out of the mantissa bumps the
    // exponent, which is the right answer (0x3bff + 1 = 0x3c00 is 1.0).
    return sign | static_cast<std::uint16_t>(shift_right_rounded((exponent << 23) | (a & 0x7fffffu), 13));
  }
  // Below 2^-14: a subnormal, m * 2^-24 for m = 0..1023 (m = 1024 is 2^-14, the smallest
  // normal, and its bits 0x0400 are what the rounding then gives). 2^-25 and below round to 0
  // (2^-25 itself is a tie between 0 and 2^-24: to the even one, 0). So do fp32 subnormals.
  if (a <= 0x33000000u) return sign;
  const std::uint32_t significand = (a & 0x7fffffu) | 0x800000u;  // 24 bits, |f| = s * 2^(e - 150)
  const int shift = 126 - static_cast<int>(a >> 23);             // |f| / 2^-24 = s >> shift; 14..24
  return sign | static_cast<std::uint16_t>(shift_right_rounded(significand, shift));
}

MGPU_HD inline float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return float_of(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // 2^-24
    return sign ? -magnitude : magnitude;
  }
  return float_of(sign | ((exponent - 15u + 127u) << 23) | (mantissa << 13));
}

// ---- tf32: fp32 with its mantissa rounded to 10 bits (still stored in 32) -------------------
// The 13 low bits rounded away to nearest, ties to even, and left zero; NaN stays NaN, and a
// value that rounds past the largest finite fp32 becomes infinity.
MGPU_HD inline float to_tf32(float f) {
  std::uint32_t u = bits_of(f);
  // BEGIN EXERCISE ex06.to_bf16
  if (is_nan_bits(u)) return f;
  u += 0xfffu + ((u >> 13) & 1u);  // as to_bf16, on the 13 dropped bits
  return float_of(u & ~0x1fffu);
  // END EXERCISE ex06.to_bf16
}

// ---- one call for any precision -------------------------------------------------------------

// f as a GEMM in `p` reads it: fp32 unchanged, the others rounded to their format and back.
MGPU_HD inline float round_to(Precision p, float f) {
  switch (p) {
    case Precision::TF32: return to_tf32(f);
    case Precision::BF16: return from_bf16(to_bf16(f));
    case Precision::FP16: return from_fp16(to_fp16(f));
    default: return f;
  }
}
// The 16-bit formats' bits (a gradient on the wire). Only BF16 and FP16 have 16 bits.
MGPU_HD inline std::uint16_t encode16(Precision p, float f) {
  return p == Precision::FP16 ? to_fp16(f) : to_bf16(f);
}
MGPU_HD inline float decode16(Precision p, std::uint16_t h) {
  return p == Precision::FP16 ? from_fp16(h) : from_bf16(h);
}

}  // namespace mixed
