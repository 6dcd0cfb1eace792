// A while that is not a scan loop pair is an atomic op: the whole while is saved or
// recomputed, and the residual report says so in a remark. --remat with --print-saved-residuals
// runs partial-eval once (one remark, not two).
// RUN: remat-opt %s --print-saved-residuals | filecheck %s --check-prefix=SAVE
// RUN: remat-opt %s --print-saved-residuals --remat=policy=nothing_saveable | filecheck %s --check-prefix=RECOMPUTE
// RUN: remat-opt %s --remat-partial-eval=policy=nothing_saveable | filecheck %s --check-prefix=IR

// SAVE: // saved residuals of @main: 1 value, 16 bytes
// SAVE-NEXT: f32[4] output of while
// SAVE-NEXT: // remark: @main: 1 forward stablehlo.while loop(s) are not scan loops with a matching backward loop; each is treated as one atomic op
// SAVE-NOT: remark

// RECOMPUTE: // saved residuals of @main: 1 value, 16 bytes
// RECOMPUTE-NEXT: f32[4] from the argument arg0
// RECOMPUTE-NEXT: // remark: @main: 1 forward stablehlo.while loop(s)
// RECOMPUTE-NOT: remark

// The whole loop is cloned right before the backward multiply.
// IR-LABEL: func.func @main
// IR: stablehlo.while(%iterArg = %c, %[[V:.*]] = %arg0)
// IR: stablehlo.sine
// IR: stablehlo.while(%iterArg = %{{.*}}, %{{.*}} = %arg0) {{.*}}attributes {remat.recompute = 1 : i64}
// IR: stablehlo.sine
// IR: %[[G:.*]] = stablehlo.multiply %arg1, %[[W:.*]]#1
// IR-NEXT: return
func.func @main(%arg0: tensor<4xf32>, %arg1: tensor<4xf32> {remat.cotangent}) -> (tensor<4xf32>, tensor<4xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c3 = stablehlo.constant dense<3> : tensor<i32>
  %w:2 = stablehlo.while(%i = %c0, %v = %arg0) : tensor<i32>, tensor<4xf32>
  cond {
    %p = stablehlo.compare LT, %i, %c3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %p : tensor<i1>
  } do {
    %s = stablehlo.sine %v : tensor<4xf32>
    %n = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %n, %s : tensor<i32>, tensor<4xf32>
  }
  %g = stablehlo.multiply %arg1, %w#1 : tensor<4xf32>
  return %w#1, %g : tensor<4xf32>, tensor<4xf32>
}
