// remat-partial-eval options that pick the function and its cotangents.
// One module, no splitting: each RUN line rewrites one function of it.
//
// cotangent-args=3: argument 3 is the cotangent although nothing marks it;
// the backward op reading it needs the forward chain, recomputed just before
// the op that reads it; the cotangent itself is not a residual.
// RUN: remat-opt %s --remat-partial-eval='cotangent-args=3 policy=nothing_saveable' | filecheck %s --check-prefix=COTARGS
// RUN: remat-opt %s --remat-partial-eval='cotangent-args=3 policy=nothing_saveable' --print-saved-residuals | filecheck %s --check-prefix=COTARGSRES
// In split mode the cotangent becomes the last argument of @main_bwd, marked.
// RUN: remat-opt %s --remat-partial-eval='cotangent-args=3 policy=nothing_saveable mode=split' | filecheck %s --check-prefix=COTARGSSPLIT
//
// func=other rewrites @other and leaves @main alone.
// RUN: remat-opt %s --remat-partial-eval='func=other policy=nothing_saveable' | filecheck %s --check-prefix=FUNC

// COTARGS-LABEL: func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>, %arg3: tensor<4xf32> {remat.cotangent})
// COTARGS-NEXT: %[[M:.*]] = stablehlo.multiply %arg0, %arg1 :
// COTARGS-NEXT: %[[Y:.*]] = stablehlo.add %[[M]], %arg2 :
// COTARGS-NEXT: %[[T:.*]] = stablehlo.tanh %[[Y]] :
// COTARGS-NEXT: %[[GW:.*]] = stablehlo.multiply %arg3, %arg1 :
// COTARGS-NEXT: %[[M2:.*]] = stablehlo.multiply %arg0, %arg1 {remat.recompute = {{[0-9]+}} : i64}
// COTARGS-NEXT: %[[Y2:.*]] = stablehlo.add %[[M2]], %arg2 {remat.recompute = {{[0-9]+}} : i64}
// COTARGS-NEXT: %[[T2:.*]] = stablehlo.tanh %[[Y2]] {remat.recompute = {{[0-9]+}} : i64}
// COTARGS-NEXT: %[[G:.*]] = stablehlo.multiply %[[GW]], %[[T2]] :
// COTARGS-NEXT: return %[[T]], %[[G]]

// COTARGSRES: // saved residuals of @main: 3 values, 48 bytes
// COTARGSRES-NEXT: f32[4] from the argument w
// COTARGSRES-NEXT: f32[4] from the argument x
// COTARGSRES-NEXT: f32[4] from the argument b
// COTARGSRES-NOT: {{.}}

// COTARGSSPLIT-LABEL: func.func @main_fwd(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>)
// COTARGSSPLIT-SAME: -> (tensor<4xf32>, tensor<4xf32> {remat.residual = "f32[4] from the argument w"}, tensor<4xf32> {remat.residual = "f32[4] from the argument x"}, tensor<4xf32> {remat.residual = "f32[4] from the argument b"})
// COTARGSSPLIT: return %{{.*}}, %arg0, %arg1, %arg2 :
// COTARGSSPLIT-LABEL: func.func @main_bwd(%arg0: tensor<4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<4xf32>, %arg3: tensor<4xf32> {remat.cotangent}) -> tensor<4xf32>
// COTARGSSPLIT-NEXT: stablehlo.multiply %arg3, %arg1 :

// FUNC-LABEL: func.func @main(
// FUNC-NOT: remat.recompute
// FUNC-LABEL: func.func @other(
// FUNC: stablehlo.sine %arg0 :
// FUNC-NOT: stablehlo.cosine %arg0 :
// FUNC: stablehlo.cosine %arg0 {remat.moved, remat.recompute = {{[0-9]+}} : i64}

func.func @main(%w: tensor<4xf32> loc("w"), %x: tensor<4xf32> loc("x"), %b: tensor<4xf32> loc("b"), %ct: tensor<4xf32> loc("ct")) -> (tensor<4xf32>, tensor<4xf32>) {
  %m = stablehlo.multiply %w, %x : tensor<4xf32>
  %y = stablehlo.add %m, %b : tensor<4xf32>
  %t = stablehlo.tanh %y : tensor<4xf32>
  %gw = stablehlo.multiply %ct, %x : tensor<4xf32>
  %g = stablehlo.multiply %gw, %t : tensor<4xf32>
  return %t, %g : tensor<4xf32>, tensor<4xf32>
}

func.func @other(%x: tensor<4xf32>, %ct: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %s = stablehlo.sine %x : tensor<4xf32>
  %c = stablehlo.cosine %x : tensor<4xf32>
  %g = stablehlo.multiply %ct, %c : tensor<4xf32>
  return %s, %g : tensor<4xf32>, tensor<4xf32>
}
