// A scan unrolled whole around inner scans (haliax's nested remat, `multilevel_scan`): the
// outer scan stacks the inner forward loops' buffers with concatenates and its transpose
// slices each back out before the inner backward loops. remat-partial-eval first lets each
// backward loop read its forward loop's result itself (loop_edit.read_stacks_directly), so
// the inner pairs get the policy per iteration instead of staying atomic. Input: the export
// of
//   lax.scan(partial(lax.scan, lambda h, w: (sin(h * w), None)), x, ws.reshape(2, 2, 4),
//            unroll=True)
// with ws f32[4,4], x f32[4], summed; private calls inlined.
//
// RUN: remat-opt %s --remat-partial-eval='policy=nothing_saveable' | filecheck %s --check-prefix=NOTHING
// RUN: remat-opt %s --print-saved-residuals --remat-partial-eval='policy=nothing_saveable' -o /dev/null 2>&1 | filecheck %s --check-prefix=RES

// Each inner pair stacks its carry-ins per iteration, as scan(jax.checkpoint(layer)) does;
// no loop is atomic.
// RES: // saved residuals of @main: 3 values, 128 bytes
// RES-NEXT: f32[4,4] from the argument arg0
// RES-NEXT: f32[2,4] the carry-in of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RES-NEXT: f32[2,4] the carry-in of each iteration, stacked by the scan loop from line {{[0-9]+}}
// RES-NOT: not scan loops with a matching backward loop

// The backward loops (the second block's first) read the forward loops' stacks directly.
// NOTHING-LABEL: func.func public @main
// NOTHING: %[[F0:.*]]:4 = stablehlo.while
// NOTHING: %[[F1:.*]]:4 = stablehlo.while
// NOTHING: stablehlo.while(%{{[^,]*}}, %{{[^ ]*}} = %[[F1]]#3,
// NOTHING: stablehlo.while(%{{[^,]*}}, %{{[^ ]*}} = %[[F0]]#3,
module @jit_loss attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x4xf32>, %arg1: tensor<4xf32>, %arg2: tensor<f32> {remat.cotangent}) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x4xf32> {jax.result_info = "result[1][0]", remat.gradient}, tensor<4xf32> {jax.result_info = "result[1][1]", remat.gradient}) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<2> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<i32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reshape %arg0 : (tensor<4x4xf32>) -> tensor<2x2x4xf32>
    %1 = stablehlo.slice %0 [0:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<0x2x4xf32>
    %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<0x2x4xf32>
    %4 = stablehlo.slice %1 [0:1, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %5 = stablehlo.reshape %4 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %6 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %7 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %8:5 = stablehlo.while(%iterArg = %5, %iterArg_2 = %c_1, %iterArg_3 = %arg1, %iterArg_4 = %6, %iterArg_5 = %7) : tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
    cond {
      %49 = stablehlo.compare LT, %iterArg_2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %49 : tensor<i1>
    } do {
      %c_6 = stablehlo.constant dense<0> : tensor<i32>
      %49 = stablehlo.dynamic_slice %iterArg, %iterArg_2, %c_6, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %50 = stablehlo.reshape %49 : (tensor<1x4xf32>) -> tensor<4xf32>
      %51 = stablehlo.multiply %iterArg_3, %50 : tensor<4xf32>
      %52 = stablehlo.sine %51 : tensor<4xf32>
      %53 = stablehlo.cosine %51 : tensor<4xf32>
      %c_7 = stablehlo.constant dense<0> : tensor<i32>
      %54 = stablehlo.broadcast_in_dim %iterArg_3, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %55 = stablehlo.dynamic_update_slice %iterArg_4, %54, %iterArg_2, %c_7 : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
      %c_8 = stablehlo.constant dense<0> : tensor<i32>
      %56 = stablehlo.broadcast_in_dim %53, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %57 = stablehlo.dynamic_update_slice %iterArg_5, %56, %iterArg_2, %c_8 : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
      %58 = stablehlo.add %iterArg_2, %c : tensor<i32>
      stablehlo.return %iterArg, %58, %52, %55, %57 : tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
    }
    %9 = stablehlo.slice %1 [1:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %10 = stablehlo.reshape %9 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %11 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %12 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %13:5 = stablehlo.while(%iterArg = %10, %iterArg_2 = %c_1, %iterArg_3 = %8#2, %iterArg_4 = %11, %iterArg_5 = %12) : tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
    cond {
      %49 = stablehlo.compare LT, %iterArg_2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %49 : tensor<i1>
    } do {
      %c_6 = stablehlo.constant dense<0> : tensor<i32>
      %49 = stablehlo.dynamic_slice %iterArg, %iterArg_2, %c_6, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %50 = stablehlo.reshape %49 : (tensor<1x4xf32>) -> tensor<4xf32>
      %51 = stablehlo.multiply %iterArg_3, %50 : tensor<4xf32>
      %52 = stablehlo.sine %51 : tensor<4xf32>
      %53 = stablehlo.cosine %51 : tensor<4xf32>
      %c_7 = stablehlo.constant dense<0> : tensor<i32>
      %54 = stablehlo.broadcast_in_dim %iterArg_3, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %55 = stablehlo.dynamic_update_slice %iterArg_4, %54, %iterArg_2, %c_7 : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
      %c_8 = stablehlo.constant dense<0> : tensor<i32>
      %56 = stablehlo.broadcast_in_dim %53, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %57 = stablehlo.dynamic_update_slice %iterArg_5, %56, %iterArg_2, %c_8 : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
      %58 = stablehlo.add %iterArg_2, %c : tensor<i32>
      stablehlo.return %iterArg, %58, %52, %55, %57 : tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>, tensor<2x4xf32>
    }
    %14 = stablehlo.broadcast_in_dim %8#3, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %15 = stablehlo.broadcast_in_dim %13#3, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %16 = stablehlo.concatenate %14, %15, dim = 0 : (tensor<1x2x4xf32>, tensor<1x2x4xf32>) -> tensor<2x2x4xf32>
    %17 = stablehlo.broadcast_in_dim %8#4, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %18 = stablehlo.broadcast_in_dim %13#4, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %19 = stablehlo.concatenate %17, %18, dim = 0 : (tensor<1x2x4xf32>, tensor<1x2x4xf32>) -> tensor<2x2x4xf32>
    %20 = stablehlo.concatenate %2, %16, dim = 0 : (tensor<0x2x4xf32>, tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    %21 = stablehlo.concatenate %3, %19, dim = 0 : (tensor<0x2x4xf32>, tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    %22 = stablehlo.reduce(%13#2 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %23 = stablehlo.broadcast_in_dim %arg2, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %24 = stablehlo.slice %0 [0:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    %25 = stablehlo.slice %20 [0:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    %26 = stablehlo.slice %21 [0:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<2x2x4xf32>
    %27 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<0x2x4xf32>
    %28 = stablehlo.slice %24 [1:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %29 = stablehlo.reshape %28 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %30 = stablehlo.slice %25 [1:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %31 = stablehlo.reshape %30 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %32 = stablehlo.slice %26 [1:2, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %33 = stablehlo.reshape %32 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %34 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %35:6 = stablehlo.while(%iterArg = %29, %iterArg_2 = %31, %iterArg_3 = %33, %iterArg_4 = %c_1, %iterArg_5 = %23, %iterArg_6 = %34) : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>
    cond {
      %49 = stablehlo.compare LT, %iterArg_4, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %49 : tensor<i1>
    } do {
      %49 = stablehlo.subtract %c_0, %iterArg_4 : tensor<i32>
      %50 = stablehlo.subtract %49, %c : tensor<i32>
      %c_7 = stablehlo.constant dense<0> : tensor<i32>
      %51 = stablehlo.dynamic_slice %iterArg, %50, %c_7, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %52 = stablehlo.reshape %51 : (tensor<1x4xf32>) -> tensor<4xf32>
      %c_8 = stablehlo.constant dense<0> : tensor<i32>
      %53 = stablehlo.dynamic_slice %iterArg_2, %50, %c_8, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %54 = stablehlo.reshape %53 : (tensor<1x4xf32>) -> tensor<4xf32>
      %c_9 = stablehlo.constant dense<0> : tensor<i32>
      %55 = stablehlo.dynamic_slice %iterArg_3, %50, %c_9, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %56 = stablehlo.reshape %55 : (tensor<1x4xf32>) -> tensor<4xf32>
      %57 = stablehlo.multiply %iterArg_5, %56 : tensor<4xf32>
      %58 = stablehlo.multiply %54, %57 : tensor<4xf32>
      %59 = stablehlo.multiply %57, %52 : tensor<4xf32>
      %c_10 = stablehlo.constant dense<0> : tensor<i32>
      %60 = stablehlo.broadcast_in_dim %58, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %61 = stablehlo.dynamic_update_slice %iterArg_6, %60, %50, %c_10 : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
      %62 = stablehlo.add %iterArg_4, %c : tensor<i32>
      stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %62, %59, %61 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>
    }
    %36 = stablehlo.slice %24 [0:1, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %37 = stablehlo.reshape %36 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %38 = stablehlo.slice %25 [0:1, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %39 = stablehlo.reshape %38 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %40 = stablehlo.slice %26 [0:1, 0:2, 0:4] : (tensor<2x2x4xf32>) -> tensor<1x2x4xf32>
    %41 = stablehlo.reshape %40 : (tensor<1x2x4xf32>) -> tensor<2x4xf32>
    %42 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4xf32>
    %43:6 = stablehlo.while(%iterArg = %37, %iterArg_2 = %39, %iterArg_3 = %41, %iterArg_4 = %c_1, %iterArg_5 = %35#4, %iterArg_6 = %42) : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>
    cond {
      %49 = stablehlo.compare LT, %iterArg_4, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %49 : tensor<i1>
    } do {
      %49 = stablehlo.subtract %c_0, %iterArg_4 : tensor<i32>
      %50 = stablehlo.subtract %49, %c : tensor<i32>
      %c_7 = stablehlo.constant dense<0> : tensor<i32>
      %51 = stablehlo.dynamic_slice %iterArg, %50, %c_7, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %52 = stablehlo.reshape %51 : (tensor<1x4xf32>) -> tensor<4xf32>
      %c_8 = stablehlo.constant dense<0> : tensor<i32>
      %53 = stablehlo.dynamic_slice %iterArg_2, %50, %c_8, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %54 = stablehlo.reshape %53 : (tensor<1x4xf32>) -> tensor<4xf32>
      %c_9 = stablehlo.constant dense<0> : tensor<i32>
      %55 = stablehlo.dynamic_slice %iterArg_3, %50, %c_9, sizes = [1, 4] : (tensor<2x4xf32>, tensor<i32>, tensor<i32>) -> tensor<1x4xf32>
      %56 = stablehlo.reshape %55 : (tensor<1x4xf32>) -> tensor<4xf32>
      %57 = stablehlo.multiply %iterArg_5, %56 : tensor<4xf32>
      %58 = stablehlo.multiply %54, %57 : tensor<4xf32>
      %59 = stablehlo.multiply %57, %52 : tensor<4xf32>
      %c_10 = stablehlo.constant dense<0> : tensor<i32>
      %60 = stablehlo.broadcast_in_dim %58, dims = [1] : (tensor<4xf32>) -> tensor<1x4xf32>
      %61 = stablehlo.dynamic_update_slice %iterArg_6, %60, %50, %c_10 : (tensor<2x4xf32>, tensor<1x4xf32>, tensor<i32>, tensor<i32>) -> tensor<2x4xf32>
      %62 = stablehlo.add %iterArg_4, %c : tensor<i32>
      stablehlo.return %iterArg, %iterArg_2, %iterArg_3, %62, %59, %61 : tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<i32>, tensor<4xf32>, tensor<2x4xf32>
    }
    %44 = stablehlo.broadcast_in_dim %43#5, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %45 = stablehlo.broadcast_in_dim %35#5, dims = [1, 2] : (tensor<2x4xf32>) -> tensor<1x2x4xf32>
    %46 = stablehlo.concatenate %44, %45, dim = 0 : (tensor<1x2x4xf32>, tensor<1x2x4xf32>) -> tensor<2x2x4xf32>
    %47 = stablehlo.concatenate %46, %27, dim = 0 : (tensor<2x2x4xf32>, tensor<0x2x4xf32>) -> tensor<2x2x4xf32>
    %48 = stablehlo.reshape %47 : (tensor<2x2x4xf32>) -> tensor<4x4xf32>
    return %22, %48, %43#4 : tensor<f32>, tensor<4x4xf32>, tensor<4xf32>
  }
}
