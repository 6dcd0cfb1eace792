// fold-dot-transposes: a matrix product the forward reads through a transpose (a vmapped
// W @ x) is computed with its operands swapped, in the transposed order; the backward's
// reads of it through an optimization barrier and the tie's multiplication by a broadcast
// scalar into the same transpose read the new product, and both transposes go.
// RUN: remat-opt %s --split-input-file --fold-dot-transposes | filecheck %s

// The product, rounded (insert-reduce-precision), read by the forward's transpose and by a
// recomputation behind a barrier and a tie.
// CHECK-LABEL: module @saved
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1] : (tensor<16x4xf32>, tensor<8x4xf32>) -> tensor<16x8xf32>
// CHECK-NEXT: %[[R:.*]] = stablehlo.reduce_precision %[[P]], format = e8m23 : tensor<16x8xf32>
// CHECK-NEXT: %[[F:.*]] = stablehlo.tanh %[[R]] : tensor<16x8xf32>
// CHECK: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[R]], %arg2 : tensor<16x8xf32>, tensor<16x8xf32>
// CHECK: %[[S:.*]] = stablehlo.broadcast_in_dim %{{.*}}, dims = [] : (tensor<f32>) -> tensor<16x8xf32>
// CHECK-NEXT: %[[T:.*]] = stablehlo.multiply %[[B]]#0, %[[S]] : tensor<16x8xf32>
// CHECK-NEXT: %[[C:.*]] = stablehlo.cosine %[[T]] : tensor<16x8xf32>
// CHECK-NOT: stablehlo.transpose
// CHECK: return
module @saved {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>, %arg2: tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.reduce_precision %0, format = e8m23 : tensor<8x16xf32>
  %2 = stablehlo.transpose %1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %3 = stablehlo.tanh %2 : tensor<16x8xf32>
  %4:2 = stablehlo.optimization_barrier %1, %arg2 : tensor<8x16xf32>, tensor<16x8xf32>
  %5 = stablehlo.slice %4#1 [0:1, 0:1] : (tensor<16x8xf32>) -> tensor<1x1xf32>
  %6 = stablehlo.reshape %5 : (tensor<1x1xf32>) -> tensor<f32>
  %7 = stablehlo.sqrt %6 : tensor<f32>
  %8 = stablehlo.broadcast_in_dim %7, dims = [] : (tensor<f32>) -> tensor<8x16xf32>
  %9 = stablehlo.multiply %4#0, %8 : tensor<8x16xf32>
  %10 = stablehlo.transpose %9, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %11 = stablehlo.cosine %10 : tensor<16x8xf32>
  return %3, %11 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// With batch dimensions: they stay first, the free dimensions of the two operands swap.
// CHECK-LABEL: module @batched
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x16x4xf32>, tensor<2x8x4xf32>) -> tensor<2x16x8xf32>
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[P]], %arg2 : tensor<2x16x8xf32>, tensor<f32>
// CHECK-NEXT: return %[[P]], %[[B]]#0
module @batched {
func.func @main(%arg0: tensor<2x8x4xf32>, %arg1: tensor<2x16x4xf32>, %arg2: tensor<f32>) -> (tensor<2x16x8xf32>, tensor<2x16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x8x4xf32>, tensor<2x16x4xf32>) -> tensor<2x8x16xf32>
  %1 = stablehlo.transpose %0, dims = [0, 2, 1] : (tensor<2x8x16xf32>) -> tensor<2x16x8xf32>
  %2:2 = stablehlo.optimization_barrier %0, %arg2 : tensor<2x8x16xf32>, tensor<f32>
  %3 = stablehlo.transpose %2#0, dims = [0, 2, 1] : (tensor<2x8x16xf32>) -> tensor<2x16x8xf32>
  return %1, %3 : tensor<2x16x8xf32>, tensor<2x16x8xf32>
}
}

// -----

// Left as they are: a product the function also returns (a split forward's residual:
// folding would move the transpose into the forward, not remove it), a transpose that is
// not the operand swap (the batch dimension moved), and a product the transpose alone
// reads (XLA folds that one itself).
// CHECK-LABEL: module @kept
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1]
// CHECK-NEXT: stablehlo.transpose %[[P]], dims = [1, 0]
// CHECK: %[[Q:.*]] = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0]
// CHECK-NEXT: stablehlo.transpose %[[Q]], dims = [1, 0, 2]
// CHECK: %[[R:.*]] = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1]
// CHECK-NEXT: stablehlo.transpose %[[R]], dims = [1, 0]
module @kept {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>, %arg2: tensor<2x8x4xf32>, %arg3: tensor<2x16x4xf32>) -> (tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x2x16xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.dot_general %arg2, %arg3, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x8x4xf32>, tensor<2x16x4xf32>) -> tensor<2x8x16xf32>
  %3 = stablehlo.transpose %2, dims = [1, 0, 2] : (tensor<2x8x16xf32>) -> tensor<8x2x16xf32>
  %4 = stablehlo.optimization_barrier %2 : tensor<2x8x16xf32>
  %5 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %6 = stablehlo.transpose %5, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %1, %0, %3, %6 : tensor<16x8xf32>, tensor<8x16xf32>, tensor<8x2x16xf32>, tensor<16x8xf32>
}
}

// -----

// A barrier that takes the product twice is made again once.
// CHECK-LABEL: module @twice
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg1, %arg0
// CHECK-NEXT: %[[B:.*]]:2 = stablehlo.optimization_barrier %[[P]], %[[P]] : tensor<16x8xf32>, tensor<16x8xf32>
// CHECK-NEXT: %[[S:.*]] = stablehlo.add %[[B]]#0, %[[B]]#1
// CHECK-NEXT: return %[[P]], %[[S]]
module @twice {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2:2 = stablehlo.optimization_barrier %0, %0 : tensor<8x16xf32>, tensor<8x16xf32>
  %3 = stablehlo.transpose %2#0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %4 = stablehlo.transpose %2#1, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %5 = stablehlo.add %3, %4 : tensor<16x8xf32>
  return %1, %5 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// The precision of each operand goes with it.
// CHECK-LABEL: module @precision
// CHECK: stablehlo.dot_general %arg1, %arg0, contracting_dims = [1] x [1], precision = [HIGHEST, DEFAULT]
module @precision {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1], precision = [DEFAULT, HIGHEST] : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.optimization_barrier %0 : tensor<8x16xf32>
  %3 = stablehlo.transpose %2, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %1, %3 : tensor<16x8xf32>, tensor<16x8xf32>
}
}

// -----

// A product with a sharding, which names its dimensions in order, is left as written.
// CHECK-LABEL: module @sharded
// CHECK: %[[P:.*]] = stablehlo.dot_general %arg0, %arg1
// CHECK-NEXT: stablehlo.transpose %[[P]]
module @sharded {
func.func @main(%arg0: tensor<8x4xf32>, %arg1: tensor<16x4xf32>) -> (tensor<16x8xf32>, tensor<16x8xf32>) {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [1] {mhlo.sharding = "{devices=[2,1]<=[2]}"} : (tensor<8x4xf32>, tensor<16x4xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.transpose %0, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  %2 = stablehlo.optimization_barrier %0 : tensor<8x16xf32>
  %3 = stablehlo.transpose %2, dims = [1, 0] : (tensor<8x16xf32>) -> tensor<16x8xf32>
  return %1, %3 : tensor<16x8xf32>, tensor<16x8xf32>
}
}
