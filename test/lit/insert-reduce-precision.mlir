// RUN: remat-opt %s --insert-reduce-precision --split-input-file | filecheck %s
// The last case alone, with func=step (the other cases have no @step):
// RUN: sed -n '/^module @func_option/,/^}/p' %s | remat-opt --insert-reduce-precision=func=step | filecheck %s --check-prefix=STEP
// The round-read-back case alone, with the option (and without it, in the first RUN):
// RUN: sed -n '/^module @round_read_back/,/^}/p' %s | remat-opt --insert-reduce-precision=round-read-back=true | filecheck %s --check-prefix=READBACK
// round-exact=false: the f32 case rounds nothing, the bf16 case still rounds:
// RUN: sed -n '/^module @f32/,/^}/p' %s | remat-opt --insert-reduce-precision=round-exact=false | filecheck %s --check-prefix=NOEXACT
// RUN: sed -n '/^module @bf16/,/^}/p' %s | remat-opt --insert-reduce-precision=round-exact=false | filecheck %s --check-prefix=NOEXACT-BF16
// The scan loop pair, through remat-partial-eval first (its input is the raw export):
// RUN: sed -n '/^module @scan_pair/,/^}/p' %s | remat-opt --remat-partial-eval='policy=save_only_these_names(h)' --insert-reduce-precision | filecheck %s --check-prefix=SCAN

// The input is what remat-partial-eval leaves: joint functions whose cotangent
// arguments carry {remat.cotangent} and whose recomputed ops carry
// remat.recompute, or the split pair @main_fwd/@main_bwd whose residual results
// carry remat.residual. Each module is named after its case.

// bf16: the residual %p (read by the forward negate and by the recomputed
// cosine and the multiply of the backward) is rounded to e8m7 right after its
// producer, and every use, forward and backward, reads the rounded value.
// CHECK-LABEL: module @bf16
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xbf16>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7 : tensor<4xbf16>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]] : tensor<4xbf16>
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G]], %[[R]]
// CHECK-NEXT: return %[[F]], %[[G2]]
module @bf16 {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %f = stablehlo.negate %p : tensor<4xbf16>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xbf16>
    %g2 = stablehlo.multiply %g, %p : tensor<4xbf16>
    return %f, %g2 : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// f16: e5m10.
// CHECK-LABEL: module @f16
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf16>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e5m10 : tensor<4xf16>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @f16 {
  func.func @main(%x: tensor<4xf16>, %ct: tensor<4xf16> {remat.cotangent}) -> (tensor<4xf16>, tensor<4xf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xf16>
    %f = stablehlo.negate %p : tensor<4xf16>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xf16>
    return %f, %g : tensor<4xf16>, tensor<4xf16>
  }
}

// -----

// f32: e8m23 (a no-op on the value, but it pins the forward use to the
// rounded value, as JAX does for every inexact dtype). With round-exact=false
// nothing is rounded: the rounding is the identity.
// NOEXACT-LABEL: module @f32
// NOEXACT-NOT: reduce_precision
// NOEXACT: return
// NOEXACT-BF16-LABEL: module @bf16
// NOEXACT-BF16: stablehlo.reduce_precision %{{.*}}, format = e8m7
// CHECK-LABEL: module @f32
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m23 : tensor<4xf32>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @f32 {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %p = stablehlo.multiply %x, %x : tensor<4xf32>
    %f = stablehlo.negate %p : tensor<4xf32>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    return %f, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// f64: e11m52.
// CHECK-LABEL: module @f64
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf64>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e11m52 : tensor<4xf64>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @f64 {
  func.func @main(%x: tensor<4xf64>, %ct: tensor<4xf64> {remat.cotangent}) -> (tensor<4xf64>, tensor<4xf64>) {
    %p = stablehlo.multiply %x, %x : tensor<4xf64>
    %f = stablehlo.negate %p : tensor<4xf64>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xf64>
    %g = stablehlo.multiply %ct, %c : tensor<4xf64>
    return %f, %g : tensor<4xf64>, tensor<4xf64>
  }
}

// -----

// f8E4M3FN, f4E2M1FN, f8E8M0FNU, f8E4M3: not rounded. XLA's reduce_precision to their
// own bits changes their values (448 -> NaN, 4 -> 6, 2^-127 -> NaN, subnormals -> 0).
// CHECK-LABEL: module @f8E4M3FN
// CHECK-NOT: reduce_precision
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf8E4M3FN>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[P]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[P]] {remat.recompute = 1 : i64}
// CHECK-NOT: reduce_precision
// CHECK: return
module @f8E4M3FN {
  func.func @main(%x: tensor<4xf8E4M3FN>, %ct: tensor<4xf8E4M3FN> {remat.cotangent},
                  %y: tensor<4xf4E2M1FN>, %cy: tensor<4xf4E2M1FN> {remat.cotangent},
                  %z: tensor<4xf8E8M0FNU>, %w: tensor<4xf8E4M3>, %cw: tensor<4xf8E4M3> {remat.cotangent})
      -> (tensor<4xf8E4M3FN>, tensor<4xf8E4M3FN>, tensor<4xf4E2M1FN>, tensor<4xf4E2M1FN>,
          tensor<4xf32>, tensor<4xf32>, tensor<4xf8E4M3>, tensor<4xf8E4M3>) {
    %p = stablehlo.multiply %x, %x : tensor<4xf8E4M3FN>
    %f = stablehlo.negate %p : tensor<4xf8E4M3FN>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xf8E4M3FN>
    %g = stablehlo.multiply %ct, %c : tensor<4xf8E4M3FN>
    %q = stablehlo.multiply %y, %y : tensor<4xf4E2M1FN>
    %qf = stablehlo.negate %q : tensor<4xf4E2M1FN>
    %qc = stablehlo.negate %q {remat.recompute = 2 : i64} : tensor<4xf4E2M1FN>
    %qg = stablehlo.multiply %cy, %qc : tensor<4xf4E2M1FN>
    %s = stablehlo.reverse %z, dims = [0] : tensor<4xf8E8M0FNU>
    %sf = stablehlo.convert %s : (tensor<4xf8E8M0FNU>) -> tensor<4xf32>
    %sc = stablehlo.convert %s {remat.recompute = 3 : i64} : (tensor<4xf8E8M0FNU>) -> tensor<4xf32>
    %r = stablehlo.multiply %w, %w : tensor<4xf8E4M3>
    %rf = stablehlo.negate %r : tensor<4xf8E4M3>
    %rc = stablehlo.cosine %r {remat.recompute = 4 : i64} : tensor<4xf8E4M3>
    %rg = stablehlo.multiply %cw, %rc : tensor<4xf8E4M3>
    return %f, %g, %qf, %qg, %sf, %sc, %rf, %rg : tensor<4xf8E4M3FN>, tensor<4xf8E4M3FN>,
        tensor<4xf4E2M1FN>, tensor<4xf4E2M1FN>, tensor<4xf32>, tensor<4xf32>, tensor<4xf8E4M3>,
        tensor<4xf8E4M3>
  }
}

// -----

// f8E5M2: e5m2.
// CHECK-LABEL: module @f8E5M2
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf8E5M2>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e5m2 : tensor<4xf8E5M2>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @f8E5M2 {
  func.func @main(%x: tensor<4xf8E5M2>, %ct: tensor<4xf8E5M2> {remat.cotangent}) -> (tensor<4xf8E5M2>, tensor<4xf8E5M2>) {
    %p = stablehlo.multiply %x, %x : tensor<4xf8E5M2>
    %f = stablehlo.negate %p : tensor<4xf8E5M2>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xf8E5M2>
    %g = stablehlo.multiply %ct, %c : tensor<4xf8E5M2>
    return %f, %g : tensor<4xf8E5M2>, tensor<4xf8E5M2>
  }
}

// -----

// The producer already is a reduce_precision with the type's own bits: no
// second one.
// CHECK-LABEL: module @already_rounded
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7 : tensor<4xbf16>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @already_rounded {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %r = stablehlo.reduce_precision %p, format = e8m7 : tensor<4xbf16>
    %f = stablehlo.negate %r : tensor<4xbf16>
    %c = stablehlo.cosine %r {remat.recompute = 1 : i64} : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xbf16>
    return %f, %g : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// A reduce_precision with other bits (f32 rounded to e5m10) is not the type's
// own rounding: one with e8m23 follows it.
// CHECK-LABEL: module @rounded_to_other_bits
// CHECK: %[[H:.*]] = stablehlo.reduce_precision %arg0, format = e5m10 : tensor<4xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[H]], format = e8m23 : tensor<4xf32>
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[R]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @rounded_to_other_bits {
  func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
    %h = stablehlo.reduce_precision %x, format = e5m10 : tensor<4xf32>
    %f = stablehlo.negate %h : tensor<4xf32>
    %c = stablehlo.cosine %h {remat.recompute = 1 : i64} : tensor<4xf32>
    %g = stablehlo.multiply %ct, %c : tensor<4xf32>
    return %f, %g : tensor<4xf32>, tensor<4xf32>
  }
}

// -----

// Integer and complex residuals are never rounded (JAX rounds only inexact
// real dtypes), though recomputations read them; the f32 result of the complex
// one's abs is a residual of its own and is.
// CHECK-LABEL: module @integer_and_complex
// CHECK: %[[I:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xi32>
// CHECK-NEXT: %[[IF:.*]] = stablehlo.negate %[[I]] : tensor<4xi32>
// CHECK-NEXT: %[[Z:.*]] = stablehlo.multiply %arg1, %arg1 : tensor<4xcomplex<f32>>
// CHECK-NEXT: %[[ZF:.*]] = stablehlo.negate %[[Z]] : tensor<4xcomplex<f32>>
// CHECK-NEXT: %[[ZA:.*]] = stablehlo.abs %[[Z]]
// CHECK-NEXT: %[[ZR:.*]] = stablehlo.reduce_precision %[[ZA]], format = e8m23 : tensor<4xf32>
// CHECK-NEXT: %[[ZAF:.*]] = stablehlo.negate %[[ZR]]
// CHECK-NEXT: %[[IC:.*]] = stablehlo.convert %[[I]] {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %arg2, %[[IC]]
// CHECK-NEXT: %[[ZN:.*]] = stablehlo.negate %[[Z]] {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[ZM:.*]] = stablehlo.multiply %arg3, %[[ZN]]
// CHECK-NEXT: %[[ZAN:.*]] = stablehlo.negate %[[ZR]] {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %arg2, %[[ZAN]]
// CHECK-NOT: reduce_precision
// CHECK: return
module @integer_and_complex {
  func.func @main(%i: tensor<4xi32>, %z: tensor<4xcomplex<f32>>, %ct: tensor<4xf32> {remat.cotangent},
                  %zct: tensor<4xcomplex<f32>> {remat.cotangent})
      -> (tensor<4xi32>, tensor<4xcomplex<f32>>, tensor<4xf32>, tensor<4xf32>, tensor<4xcomplex<f32>>, tensor<4xf32>) {
    %ip = stablehlo.multiply %i, %i : tensor<4xi32>
    %if = stablehlo.negate %ip : tensor<4xi32>
    %zp = stablehlo.multiply %z, %z : tensor<4xcomplex<f32>>
    %zf = stablehlo.negate %zp : tensor<4xcomplex<f32>>
    %za = stablehlo.abs %zp : (tensor<4xcomplex<f32>>) -> tensor<4xf32>
    %zaf = stablehlo.negate %za : tensor<4xf32>
    %ic = stablehlo.convert %ip {remat.recompute = 1 : i64} : (tensor<4xi32>) -> tensor<4xf32>
    %g = stablehlo.multiply %ct, %ic : tensor<4xf32>
    %zn = stablehlo.negate %zp {remat.recompute = 1 : i64} : tensor<4xcomplex<f32>>
    %zg = stablehlo.multiply %zct, %zn : tensor<4xcomplex<f32>>
    %zan = stablehlo.negate %za {remat.recompute = 1 : i64} : tensor<4xf32>
    %ag = stablehlo.multiply %ct, %zan : tensor<4xf32>
    return %if, %zf, %zaf, %g, %zg, %ag : tensor<4xi32>, tensor<4xcomplex<f32>>, tensor<4xf32>, tensor<4xf32>, tensor<4xcomplex<f32>>, tensor<4xf32>
  }
}

// -----

// A residual the forward does not use (the cosine exists only for the
// backward, as with everything_saveable) is left alone: there is no forward
// use whose precision could differ. The forward-only sine is not a residual.
// CHECK-LABEL: module @no_forward_use
// CHECK-NOT: reduce_precision
// CHECK: %[[S:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %arg0
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[C]]
// CHECK-NEXT: return %[[S]], %[[G]]
module @no_forward_use {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %s = stablehlo.sine %x : tensor<4xbf16>
    %c = stablehlo.cosine %x : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xbf16>
    return %s, %g : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// Arguments are never rounded: they arrive from memory in their own type, so
// rounding is the identity. %w is read by the forward and by the backward
// (directly and by a recomputed op), %b and the cotangent only by the backward.
// CHECK-LABEL: module @arguments
// CHECK: func.func @main(%arg0: tensor<4xbf16>, %arg1: tensor<4xbf16>, %arg2: tensor<4xbf16> {remat.cotangent})
// CHECK-NEXT: %[[F:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %arg0 {remat.recompute = 1 : i64}
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg2, %[[C]]
// CHECK-NEXT: %[[G2:.*]] = stablehlo.multiply %[[G]], %arg0
// CHECK-NEXT: %[[G3:.*]] = stablehlo.multiply %[[G2]], %arg1
// CHECK-NEXT: return %[[F]], %[[G3]]
module @arguments {
  func.func @main(%w: tensor<4xbf16>, %b: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %f = stablehlo.sine %w : tensor<4xbf16>
    %c = stablehlo.cosine %w {remat.recompute = 1 : i64} : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xbf16>
    %g2 = stablehlo.multiply %g, %w : tensor<4xbf16>
    %g3 = stablehlo.multiply %g2, %b : tensor<4xbf16>
    return %f, %g3 : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// Several arguments and values: each floating residual with a forward use
// that a recomputation reads gets exactly one rounding, with its own type's
// bits (arguments none); a residual read by two recomputed ops is still
// rounded once.
// CHECK-LABEL: module @several
// CHECK: %[[FA:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: %[[FB:.*]] = stablehlo.sine %arg1
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[FB]]
// CHECK-NEXT: %[[TR:.*]] = stablehlo.reduce_precision %[[T]], format = e8m7 : tensor<4xbf16>
// CHECK-NEXT: %[[U:.*]] = stablehlo.exponential %[[TR]]
// CHECK-NEXT: stablehlo.multiply %arg2, %arg0
// CHECK-NEXT: stablehlo.multiply %arg3, %arg1
// CHECK-NEXT: stablehlo.cosine %[[TR]] {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.multiply %arg3,
// CHECK-NEXT: stablehlo.sine %[[TR]] {remat.recompute = 1 : i64}
// CHECK-NEXT: stablehlo.add
// CHECK-NOT: reduce_precision
// CHECK: return
module @several {
  func.func @main(%a: tensor<4xf16>, %b: tensor<4xbf16>, %cta: tensor<4xf16> {remat.cotangent}, %ctb: tensor<4xbf16> {remat.cotangent})
      -> (tensor<4xf16>, tensor<4xbf16>, tensor<4xf16>, tensor<4xbf16>) {
    %fa = stablehlo.sine %a : tensor<4xf16>
    %fb = stablehlo.sine %b : tensor<4xbf16>
    %t = stablehlo.tanh %fb : tensor<4xbf16>
    %u = stablehlo.exponential %t : tensor<4xbf16>
    %ga = stablehlo.multiply %cta, %a : tensor<4xf16>
    %gb = stablehlo.multiply %ctb, %b : tensor<4xbf16>
    %ct1 = stablehlo.cosine %t {remat.recompute = 1 : i64} : tensor<4xbf16>
    %gt = stablehlo.multiply %ctb, %ct1 : tensor<4xbf16>
    %st = stablehlo.sine %t {remat.recompute = 1 : i64} : tensor<4xbf16>
    %gs = stablehlo.add %gt, %st : tensor<4xbf16>
    return %fa, %u, %ga, %gs : tensor<4xf16>, tensor<4xbf16>, tensor<4xf16>, tensor<4xbf16>
  }
}

// -----

// A residual the backward only reads back (nothing recomputes from it, as
// with everything_saveable) is not rounded: the backward reads what the
// program without remat reads, so its outputs and gradients stay bit for bit.
// CHECK-LABEL: module @not_recomputed
// CHECK-NOT: reduce_precision
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// CHECK-NEXT: %[[F:.*]] = stablehlo.negate %[[P]]
// CHECK-NEXT: %[[G:.*]] = stablehlo.multiply %arg1, %[[P]]
// CHECK-NEXT: return %[[F]], %[[G]]
module @not_recomputed {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %f = stablehlo.negate %p : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %p : tensor<4xbf16>
    return %f, %g : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// The recomputation is found through what computes nothing: an optimization
// barrier (place-optimization-barriers run first), a recomputed checkpoint-name
// marker and a recomputed reshape. %q reaches the backward through a recomputed
// reshape alone (data movement: what memory holds) and is not rounded.
// CHECK-LABEL: module @looked_through
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7 : tensor<4xbf16>
// CHECK-NEXT: %[[Q:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: stablehlo.add %[[R]], %[[Q]]
// CHECK-NEXT: stablehlo.optimization_barrier %[[R]], %arg1
// CHECK-NOT: reduce_precision
// CHECK: return
module @looked_through {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %q = stablehlo.sine %x : tensor<4xbf16>
    %f = stablehlo.add %p, %q : tensor<4xbf16>
    %b:2 = stablehlo.optimization_barrier %p, %ct : tensor<4xbf16>, tensor<4xbf16>
    %n = stablehlo.custom_call @remat.name(%b#0) {backend_config = "p", remat.recompute = 1 : i64} : (tensor<4xbf16>) -> tensor<4xbf16>
    %c = stablehlo.cosine %n {remat.recompute = 1 : i64} : tensor<4xbf16>
    %r = stablehlo.reshape %q {remat.recompute = 1 : i64} : (tensor<4xbf16>) -> tensor<4xbf16>
    %g = stablehlo.multiply %b#1, %c : tensor<4xbf16>
    %g2 = stablehlo.multiply %g, %r : tensor<4xbf16>
    return %f, %g2 : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// Inside a checkpoint region (a remat[N] frame) a residual the region's forward
// reads is rounded, recomputed or not, as jax.checkpoint rounds its residuals
// (JAX's test_excess_precision_hell); %q, read by the forward outside the
// region only, is not.
// CHECK-LABEL: module @region
// CHECK: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7 : tensor<4xbf16>
// CHECK-NEXT: %[[Q:.*]] = stablehlo.sine %[[R]]
// CHECK-NEXT: stablehlo.negate %[[Q]]
// CHECK-NOT: reduce_precision
// CHECK: return
module @region {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16> loc("jit(f)/jvp(remat[1])/mul")
    %q = stablehlo.sine %p : tensor<4xbf16> loc("jit(f)/jvp(remat[1])/sin")
    %f = stablehlo.negate %q : tensor<4xbf16> loc("jit(f)/neg")
    %g = stablehlo.multiply %ct, %p : tensor<4xbf16>
    %g2 = stablehlo.multiply %g, %q : tensor<4xbf16>
    return %f, %g2 : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// Split form: the pass works on @main_fwd. The residual %p (a result with
// remat.residual) that the forward also uses and that @main_bwd recomputes
// from (its argument %p) is rounded after its producer and @main_fwd returns
// the rounded value; the residual %c, which only leaves through the return,
// the primal output %t and the argument residual %x are not rounded, and
// neither is %t2, which the forward uses but @main_bwd only reads back.
// @main_bwd is untouched.
// CHECK-LABEL: module @split
// CHECK: func.func @main_fwd
// CHECK-NEXT: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7 : tensor<4xbf16>
// CHECK-NEXT: %[[T:.*]] = stablehlo.tanh %[[R]]
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[T]]
// CHECK-NEXT: %[[T2:.*]] = stablehlo.sine %arg0
// CHECK-NEXT: %[[O:.*]] = stablehlo.add %[[T]], %[[T2]]
// CHECK-NEXT: return %[[O]], %[[R]], %[[C]], %arg0, %[[T2]]
// CHECK: func.func @main_bwd
// CHECK-NOT: reduce_precision
// CHECK: return
module @split {
  func.func @main_fwd(%x: tensor<4xbf16>) -> (tensor<4xbf16>, tensor<4xbf16> {remat.residual = "bf16[4] output of mul"},
                                              tensor<4xbf16> {remat.residual = "bf16[4] output of cos"},
                                              tensor<4xbf16> {remat.residual = "bf16[4] from the argument x"},
                                              tensor<4xbf16> {remat.residual = "bf16[4] output of sin"}) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %t = stablehlo.tanh %p : tensor<4xbf16>
    %c = stablehlo.cosine %t : tensor<4xbf16>
    %t2 = stablehlo.sine %x : tensor<4xbf16>
    %o = stablehlo.add %t, %t2 : tensor<4xbf16>
    return %o, %p, %c, %x, %t2 : tensor<4xbf16>, tensor<4xbf16>, tensor<4xbf16>, tensor<4xbf16>, tensor<4xbf16>
  }
  func.func @main_bwd(%p: tensor<4xbf16>, %c: tensor<4xbf16>, %x: tensor<4xbf16>, %t2: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> tensor<4xbf16> {
    %s = stablehlo.sine %p {remat.recompute = 1 : i64} : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %s : tensor<4xbf16>
    %g2 = stablehlo.multiply %g, %c : tensor<4xbf16>
    %g3 = stablehlo.multiply %g2, %x : tensor<4xbf16>
    %g4 = stablehlo.multiply %g3, %t2 : tensor<4xbf16>
    return %g4 : tensor<4xbf16>
  }
}

// -----

// func= names the function: @step is rewritten, @main is left alone.
// STEP-LABEL: module @func_option
// STEP: func.func @main
// STEP-NOT: reduce_precision
// STEP: func.func @step
// STEP-NEXT: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// STEP-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7
// STEP-NEXT: stablehlo.negate %[[R]]
// STEP-NEXT: stablehlo.cosine %[[R]]
// CHECK-LABEL: module @func_option
// CHECK: func.func @main
// CHECK-NEXT: %[[P:.*]] = stablehlo.multiply %arg0, %arg0
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m7
// CHECK: func.func @step
// CHECK-NOT: reduce_precision
// CHECK: return
module @func_option {
  func.func @main(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %f = stablehlo.negate %p : tensor<4xbf16>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xbf16>
    return %f, %g : tensor<4xbf16>, tensor<4xbf16>
  }
  func.func @step(%x: tensor<4xbf16>, %ct: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xbf16>, tensor<4xbf16>) {
    %p = stablehlo.multiply %x, %x : tensor<4xbf16>
    %f = stablehlo.negate %p : tensor<4xbf16>
    %c = stablehlo.cosine %p {remat.recompute = 1 : i64} : tensor<4xbf16>
    %g = stablehlo.multiply %ct, %c : tensor<4xbf16>
    return %f, %g : tensor<4xbf16>, tensor<4xbf16>
  }
}

// -----

// Scan loop pair (the @scan input of remat-partial-eval-scan.mlir). As given,
// it is what remat-partial-eval leaves with everything_saveable: four stacked
// buffers and no recomputation in the backward body, so nothing is rounded,
// not even the stacked cosine of h that the forward body also uses.
// CHECK-LABEL: module @scan_pair
// CHECK-NOT: reduce_precision
// CHECK: stablehlo.negate
// CHECK-NOT: reduce_precision
// CHECK: return

// After save_only_these_names(h) the backward body recomputes from the stacked
// 'h', which the forward body also uses: inside the forward while body, h is
// rounded (e8m23 for f32) right after its producer, the forward cosine reads
// the rounded value, and so does the reshape whose dynamic_update_slice
// stacks it. The stacked carry-in is a body argument: not rounded. Nothing
// is rounded in the backward body.
// SCAN-LABEL: module @scan_pair
// SCAN: %[[FW:.*]]:5 = stablehlo.while(%{{[^ ]+}} = %arg1, %[[I:[^ ]+]] = %{{[^ ]+}}, %[[X:[^ ]+]] = %arg0, %[[S0:[^ ]+]] = %{{[^ ]+}}, %[[SH:[^ ]+]] = %{{[^ ]+}}) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>{{$}}
// SCAN-NOT: reduce_precision
// SCAN: %[[H:.*]] = stablehlo.custom_call @remat.name(%{{[^ ]+}}) {backend_config = "h"}
// SCAN-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[H]], format = e8m23 : tensor<2x4xf32>
// SCAN-NEXT: %[[CH:.*]] = stablehlo.cosine %[[R]] : tensor<2x4xf32>
// SCAN-NEXT: stablehlo.multiply %[[CH]], %[[X]]
// SCAN-NEXT: %[[U0:.*]] = stablehlo.broadcast_in_dim %[[X]], dims = [1, 2]
// SCAN-NEXT: stablehlo.dynamic_update_slice %[[S0]], %[[U0]], %[[I]],
// SCAN-NOT: reduce_precision
// SCAN: %[[UH:.*]] = stablehlo.reshape %[[R]] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
// SCAN-NOT: stablehlo.return
// SCAN: stablehlo.dynamic_update_slice %[[SH]], %[[UH]], %[[I]],
// SCAN-NEXT: stablehlo.return
// SCAN-NOT: reduce_precision
// SCAN: stablehlo.while(%{{[^ ]+}} = %arg1, %{{[^ ]+}} = %[[FW]]#3, {{.*}}, %[[BH:[^ ]+]] = %[[FW]]#4) :
// SCAN-NOT: reduce_precision
// SCAN: %[[RH:.*]] = stablehlo.dynamic_slice %[[BH]],
// SCAN-NEXT: %[[HK:.*]] = stablehlo.reshape %[[RH]]
// SCAN-NEXT: stablehlo.cosine %[[HK]] {remat.recompute
// SCAN-NOT: reduce_precision
// SCAN: return
module @scan_pair {
  func.func @main(%x: tensor<2x4xf32>, %ws: tensor<3x4x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %zs = stablehlo.constant dense<0.000000e+00> : tensor<3x2x4xf32>
    %zw = stablehlo.constant dense<0.000000e+00> : tensor<3x4x4xf32>
    %fw:7 = stablehlo.while(%fws = %ws, %i = %c0, %xi = %x, %s0 = %zs, %s1 = %zs, %s2 = %zs, %s3 = %zs) : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    cond {
      %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %w1 = stablehlo.dynamic_slice %fws, %i, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %d = stablehlo.dot_general %xi, %w, contracting_dims = [1] x [0] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %s = stablehlo.sine %d : tensor<2x4xf32>
      %cd = stablehlo.cosine %d : tensor<2x4xf32>
      %h = stablehlo.custom_call @remat.name(%s) {backend_config = "h"} : (tensor<2x4xf32>) -> tensor<2x4xf32> loc("jit(f)/while/body/name"("layer"("model.py":3:8)))
      %ch = stablehlo.cosine %h : tensor<2x4xf32>
      %sh = stablehlo.sine %h : tensor<2x4xf32>
      %y = stablehlo.multiply %ch, %xi : tensor<2x4xf32>
      %u0 = stablehlo.broadcast_in_dim %xi, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n0 = stablehlo.dynamic_update_slice %s0, %u0, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u1 = stablehlo.broadcast_in_dim %cd, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n1 = stablehlo.dynamic_update_slice %s1, %u1, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u2 = stablehlo.broadcast_in_dim %sh, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n2 = stablehlo.dynamic_update_slice %s2, %u2, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u3 = stablehlo.broadcast_in_dim %ch, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n3 = stablehlo.dynamic_update_slice %s3, %u3, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %fws, %i1, %y, %n0, %n1, %n2, %n3 : tensor<3x4x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    } loc("jit(f)/while"("f"("model.py":7:4)))
    %bw:8 = stablehlo.while(%bws = %ws, %b0 = %fw#3, %b1 = %fw#4, %b2 = %fw#5, %b3 = %fw#6, %j = %c0, %g = %ct, %gws = %zw) : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    cond {
      %p = stablehlo.compare LT, %j, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %t = stablehlo.subtract %c3, %j : tensor<i32>
      %k = stablehlo.subtract %t, %c1 : tensor<i32>
      %w1 = stablehlo.dynamic_slice %bws, %k, %c0, %c0, sizes = [1, 4, 4] : (tensor<3x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x4x4xf32>
      %w = stablehlo.reshape %w1 : (tensor<1x4x4xf32>) -> tensor<4x4xf32>
      %r0 = stablehlo.dynamic_slice %b0, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %xk = stablehlo.reshape %r0 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r1 = stablehlo.dynamic_slice %b1, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %cdk = stablehlo.reshape %r1 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r2 = stablehlo.dynamic_slice %b2, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %shk = stablehlo.reshape %r2 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r3 = stablehlo.dynamic_slice %b3, %k, %c0, %c0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %chk = stablehlo.reshape %r3 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %gx0 = stablehlo.multiply %chk, %g : tensor<2x4xf32>
      %gc = stablehlo.multiply %g, %xk : tensor<2x4xf32>
      %gn = stablehlo.negate %gc : tensor<2x4xf32>
      %gs = stablehlo.multiply %gn, %shk : tensor<2x4xf32>
      %gd = stablehlo.multiply %gs, %cdk : tensor<2x4xf32>
      %gw0 = stablehlo.dot_general %gd, %xk, contracting_dims = [0] x [0] : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
      %gw = stablehlo.transpose %gw0, dims = [1, 0] : (tensor<4x4xf32>) -> tensor<4x4xf32>
      %gx1 = stablehlo.dot_general %gd, %w, contracting_dims = [1] x [1] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32>
      %gx = stablehlo.add %gx0, %gx1 : tensor<2x4xf32>
      %uw = stablehlo.broadcast_in_dim %gw, dims = [1, 2] : (tensor<4x4xf32>) -> tensor<1x4x4xf32>
      %ngws = stablehlo.dynamic_update_slice %gws, %uw, %k, %c0, %c0 : (tensor<3x4x4xf32>, tensor<1x4x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x4x4xf32>
      %j1 = stablehlo.add %j, %c1 : tensor<i32>
      stablehlo.return %bws, %b0, %b1, %b2, %b3, %j1, %gx, %ngws : tensor<3x4x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>, tensor<3x4x4xf32>
    }
    return %fw#2, %bw#6, %bw#7 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<3x4x4xf32>
  }
}

// -----

// Per stack: the backward body recomputes an exponential from the stacked sine %s
// (remat.recompute) and only reads back the stacked cosine %c; both are values the
// forward body also uses. %s is rounded in the forward body, %c is not: a stack is
// rounded where a recomputation reads it, not wherever the backward loop recomputes
// something (the index constant it recomputes reads no stack).
// CHECK-LABEL: module @scan_stacks
// CHECK: stablehlo.while
// CHECK: %[[S:.*]] = stablehlo.sine
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[S]], format = e8m23
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine
// CHECK-NEXT: stablehlo.multiply %[[R]], %[[C]]
// CHECK-NOT: reduce_precision
// CHECK: stablehlo.reshape %[[R]]
// CHECK-NOT: reduce_precision
// CHECK: stablehlo.reshape %[[C]]
// CHECK-NOT: reduce_precision
// CHECK: return
module @scan_stacks {
  func.func @main(%x: tensor<2x4xf32>, %ct: tensor<2x4xf32> {remat.cotangent}) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %c3 = stablehlo.constant dense<3> : tensor<i32>
    %zs = stablehlo.constant dense<0.000000e+00> : tensor<3x2x4xf32>
    %fw:4 = stablehlo.while(%i = %c0, %xi = %x, %s1 = %zs, %s2 = %zs) : tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    cond {
      %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %s = stablehlo.sine %xi : tensor<2x4xf32>
      %c = stablehlo.cosine %xi : tensor<2x4xf32>
      %y = stablehlo.multiply %s, %c : tensor<2x4xf32>
      %u1 = stablehlo.reshape %s : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n1 = stablehlo.dynamic_update_slice %s1, %u1, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %u2 = stablehlo.reshape %c : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
      %n2 = stablehlo.dynamic_update_slice %s2, %u2, %i, %c0, %c0 : (tensor<3x2x4xf32>, tensor<1x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<3x2x4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %i1, %y, %n1, %n2 : tensor<i32>, tensor<2x4xf32>, tensor<3x2x4xf32>, tensor<3x2x4xf32>
    }
    %bw:4 = stablehlo.while(%b1 = %fw#2, %b2 = %fw#3, %j = %c0, %g = %ct) : tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>
    cond {
      %p = stablehlo.compare LT, %j, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %p : tensor<i1>
    } do {
      %k0 = stablehlo.constant {remat.recompute = 1 : i64} dense<0> : tensor<i32>
      %t = stablehlo.subtract %c3, %j : tensor<i32>
      %k = stablehlo.subtract %t, %c1 : tensor<i32>
      %r1 = stablehlo.dynamic_slice %b1, %k, %k0, %k0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %sk = stablehlo.reshape %r1 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %r2 = stablehlo.dynamic_slice %b2, %k, %k0, %k0, sizes = [1, 2, 4] : (tensor<3x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x2x4xf32>
      %ck = stablehlo.reshape %r2 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
      %e = stablehlo.exponential %sk {remat.recompute = 1 : i64} : tensor<2x4xf32>
      %ge = stablehlo.multiply %g, %e : tensor<2x4xf32>
      %gx = stablehlo.multiply %ge, %ck : tensor<2x4xf32>
      %j1 = stablehlo.add %j, %c1 : tensor<i32>
      stablehlo.return %b1, %b2, %j1, %gx : tensor<3x2x4xf32>, tensor<3x2x4xf32>, tensor<i32>, tensor<2x4xf32>
    }
    return %fw#1, %bw#3 : tensor<2x4xf32>, tensor<2x4xf32>
  }
}

// -----

// round-read-back=true also rounds the residuals the backward only reads back where
// rounding is exact, as jax.checkpoint does: the f32 %a, which the forward also uses.
// Not the bf16 %b (rounding would change what the forward computes from it), nor the f32
// %c, which only leaves through the return. Without the option none is rounded.
// READBACK-LABEL: module @round_read_back
// READBACK: %[[A:.*]] = stablehlo.multiply %arg0, %arg0 : tensor<4xf32>
// READBACK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[A]], format = e8m23 : tensor<4xf32>
// READBACK-NEXT: %[[T:.*]] = stablehlo.tanh %[[R]]
// READBACK-NEXT: %[[B:.*]] = stablehlo.multiply %arg1, %arg1 : tensor<4xbf16>
// READBACK-NEXT: %[[N:.*]] = stablehlo.negate %[[B]]
// READBACK-NEXT: %[[C:.*]] = stablehlo.sine %arg0
// READBACK-NEXT: return %[[T]], %[[N]], %[[R]], %[[B]], %[[C]]
// READBACK: func.func @main_bwd
// READBACK-NOT: reduce_precision
// CHECK-LABEL: module @round_read_back
// CHECK-NOT: reduce_precision
// CHECK: return
module @round_read_back {
  func.func @main_fwd(%x: tensor<4xf32>, %y: tensor<4xbf16>) -> (tensor<4xf32>, tensor<4xbf16>,
                                              tensor<4xf32> {remat.residual = "f32[4] output of mul"},
                                              tensor<4xbf16> {remat.residual = "bf16[4] output of mul"},
                                              tensor<4xf32> {remat.residual = "f32[4] output of sin"}) {
    %a = stablehlo.multiply %x, %x : tensor<4xf32>
    %t = stablehlo.tanh %a : tensor<4xf32>
    %b = stablehlo.multiply %y, %y : tensor<4xbf16>
    %n = stablehlo.negate %b : tensor<4xbf16>
    %c = stablehlo.sine %x : tensor<4xf32>
    return %t, %n, %a, %b, %c : tensor<4xf32>, tensor<4xbf16>, tensor<4xf32>, tensor<4xbf16>, tensor<4xf32>
  }
  func.func @main_bwd(%a: tensor<4xf32>, %b: tensor<4xbf16>, %c: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}, %ct2: tensor<4xbf16> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xbf16>) {
    %g = stablehlo.multiply %ct, %a : tensor<4xf32>
    %g2 = stablehlo.multiply %g, %c : tensor<4xf32>
    %h = stablehlo.multiply %ct2, %b : tensor<4xbf16>
    return %g2, %h : tensor<4xf32>, tensor<4xbf16>
  }
}
