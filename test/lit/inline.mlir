// func.call is inlined before remat-partial-eval decides anything (DESIGN.md
// section 4: "`func.call` is inlined first"): `inline` is the first step of the
// `remat` pipeline, and `--print-saved-residuals` without a partial-eval step
// runs inline,remat-partial-eval.
//
// jaxlib's MLIR context does not register the func dialect's inliner
// extension, so core MLIR's `inline` would leave the call in place;
// remat_passes' own `inline` pass does the job. remat-partial-eval on its own
// keeps a call as an atomic op (its result is saved) and says so in a remark.
//
// RUN: remat-opt %s --pass-pipeline='builtin.module(inline)' | filecheck %s --check-prefix=INLINE
// RUN: remat-opt %s --inline --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=PE
// RUN: remat-opt %s --inline --remat-partial-eval='policy=nothing_saveable' --print-saved-residuals | filecheck %s --check-prefix=RES
// RUN: remat-opt %s --remat='policy=nothing_saveable' --print-saved-residuals | filecheck %s --check-prefix=RES
// RUN: remat-opt %s --remat-partial-eval='policy=nothing_saveable' --print-saved-residuals | filecheck %s --check-prefix=ATOMIC

// INLINE-LABEL: func.func @main
// INLINE-NOT: call @helper
// INLINE: stablehlo.sine %arg0
// INLINE-NOT: call @helper
// INLINE: return

// After inlining, the sine is an ordinary forward op: nothing_saveable
// recomputes it in the backward from the saved argument.
// PE-LABEL: func.func @main
// PE-NOT: call @helper
// PE: %[[S:.*]] = stablehlo.sine %arg0 :
// PE-NEXT: %[[S2:.*]] = stablehlo.sine %arg0 {remat.recompute = {{[0-9]+}} : i64}
// PE-NEXT: stablehlo.multiply %arg1, %[[S2]]

// RES: // saved residuals of @main: 1 value, 16 bytes
// RES-NEXT: f32[4] from the argument x

// ATOMIC: // saved residuals of @main: 1 value, 16 bytes
// ATOMIC-NEXT: f32[4] output of call
// ATOMIC-NEXT: // remark: @main: 1 func.call op(s) are kept as atomic calls (saved, the policy cannot see inside); run the inline pass first (the remat pipeline does)

func.func @main(%x: tensor<4xf32> loc("x"), %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = func.call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %g = stablehlo.multiply %ct, %s : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}
func.func private @helper(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.sine %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
