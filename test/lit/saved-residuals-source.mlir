// The source position of a residual: JAX writes "output of <prim> from
// FILE:LINE:COL (FUNCTION)". When the op's location is just a name stack
// around a file position, loc("jit(f)/jvp()/cos"("f.py":3:4)), there is no
// function name to give; the name stack must not be printed in its place.
//
// (Regression: the name stack was once printed as the function name,
// "(jit(f)/jvp()/cos)".)
//
// RUN: remat-opt %s --print-saved-residuals | filecheck %s
// RUN: remat-opt %s --remat-partial-eval='mode=split' | filecheck %s --check-prefix=SPLIT

// CHECK: // saved residuals of @main: 1 value, 16 bytes
// CHECK-NEXT: f32[4] output of cos from f.py:3:4
// CHECK-NOT: jvp()

// The same description goes into the remat.residual attribute of split mode.
// SPLIT: remat.residual = "f32[4] output of cos from f.py:3:4"}

func.func @main(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = stablehlo.sine %x : tensor<4xf32> loc("jit(f)/jvp()/sin"("f.py":3:4))
  %c = stablehlo.cosine %x : tensor<4xf32> loc("jit(f)/jvp()/cos"("f.py":3:4))
  %g = stablehlo.multiply %ct, %c : tensor<4xf32> loc("jit(f)/transpose(jvp())/mul"("f.py":3:4))
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}
